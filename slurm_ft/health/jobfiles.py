"""Reading a job's files as root without trusting them.

The epilog runs as root over paths the job's user controls. Rules:

- the directory is reached component by component with ``O_NOFOLLOW``: a symlink swapped in after the path
  was resolved fails the walk instead of redirecting it;
- the directory and every file read must be owned by the job's uid; files must be regular;
- each file is read up to a byte limit (a larger one is skipped with a note), and only so many files are read;
- files are opened non-blocking, so a FIFO or a device cannot stall the reader.

This is the one reader through which root code reads what a job wrote or named: the epilog (error files), the
monitor (the job registry, node reports, the checkpoint dir's newest step) and the prolog. ``read_user_file`` reads
by directory fd (a walk from ``open_user_dir``); ``read_trusted_json`` reads a file in a directory root owns (the
state dir), the file itself owned by one of the uids given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from typing import Any

from slurm_ft.core.rundir import ErrorRecord

_ERROR_NAME_RE = re.compile(r"^error\.rank(\d{1,7})\.json$")  # core.rundir.ERROR_GLOB, strictly
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_JSON_BYTES = 1 << 20  # a registry entry or a node report
_MAX_TEXT = {"traceback": 16_384, "message": 4_096, "exc_type": 256, "host": 256}


class UnsafePath(OSError):
    """The path cannot be read safely (symlink, wrong owner, not a directory ...)."""


@contextlib.contextmanager
def open_user_dir(path: str, uid: int) -> Iterator[int]:
    """A directory fd for ``path`` reached without following symlinks; the directory must belong to ``uid``."""
    real = os.path.realpath(path)
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in [p for p in real.split("/") if p]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise UnsafePath(exc.errno, f"{real}: component {part!r}: {exc.strerror}") from exc
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
        if st.st_uid != uid:
            raise UnsafePath(f"{real} is owned by uid {st.st_uid}, not the job's uid {uid}")
        yield fd
    finally:
        os.close(fd)


def read_user_file(dir_fd: int, name: str, uid: int, max_bytes: int) -> bytes:
    """The bytes of regular file ``name`` in ``dir_fd``, owned by ``uid`` and at most ``max_bytes`` long."""
    return _read_checked(os.open(name, _FILE_FLAGS, dir_fd=dir_fd), name, {uid}, max_bytes)


def read_trusted_json(path: str | os.PathLike[str], uids: Iterable[int], max_bytes: int = MAX_JSON_BYTES) -> Any:
    """JSON from regular file ``path`` (the last component not a symlink) owned by one of ``uids``, at most
    ``max_bytes`` long; None when it does not exist. Its directory must be root's (the state dir)."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except FileNotFoundError:
        return None
    return json.loads(_read_checked(fd, str(path), set(uids), max_bytes).decode("utf-8", "replace"))


def _read_checked(fd: int, name: str, uids: set[int], max_bytes: int) -> bytes:
    """Read open ``fd`` (and close it) when it is a regular file owned by one of ``uids`` within ``max_bytes``."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{name} is not a regular file")
        if st.st_uid not in uids:
            owners = "the job's uid" if len(uids) == 1 else "a trusted uid"
            raise UnsafePath(f"{name} is owned by uid {st.st_uid}, not {owners} {', '.join(map(str, sorted(uids)))}")
        if st.st_size > max_bytes:
            raise UnsafePath(f"{name} is {st.st_size} bytes, over the {max_bytes} byte limit")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise UnsafePath(f"{name} grew past the {max_bytes} byte limit while read")
        return data
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FileLimits:
    max_bytes: int = 262_144
    max_files: int = 256


def read_error_files(run_dir: str, uid: int,
                     limits: FileLimits = FileLimits()) -> tuple[list[dict[str, Any]], list[str]]:
    """Rank error records (``error.rank<R>.json``) in ``run_dir``, sorted by time, plus notes on what was skipped."""
    notes: list[str] = []
    records: list[dict[str, Any]] = []
    try:
        with open_user_dir(run_dir, uid) as fd:
            names = sorted(n for n in os.listdir(fd) if _ERROR_NAME_RE.match(n))
            if len(names) > limits.max_files:
                notes.append(f"{run_dir}: {len(names)} error files, read the first {limits.max_files}")
                names = names[: limits.max_files]
            for name in names:
                try:
                    records.append(_error_record(read_user_file(fd, name, uid, limits.max_bytes), name))
                except RecursionError:
                    notes.append(f"{run_dir}/{name}: skipped: JSON nested too deeply")
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                    notes.append(f"{run_dir}/{name}: skipped: {why}")
    except FileNotFoundError:
        notes.append(f"run dir {run_dir} does not exist")
    except OSError as exc:
        notes.append(f"run dir {run_dir}: not read: {exc}")
    records.sort(key=lambda r: r["time"])
    return records, notes


MANIFEST_MAX_BYTES = 4 * 2**20  # a COMMITTED manifest lists every file of a checkpoint: a few KiB to a few MiB


def latest_committed_step(ckpt_dir: str, uid: int, max_bytes: int = MANIFEST_MAX_BYTES) -> int | None:
    """The step of the newest committed checkpoint in the job's ``ckpt_dir``, read as root without trusting it:
    no symlinks (step dirs and ``COMMITTED`` opened ``O_NOFOLLOW``), owner ``uid``, regular files (opened
    non-blocking, so a FIFO or device cannot stall the reader), size-capped; None when there is none."""
    from slurm_ft.core.layout import MARKER, STEP_RE, Manifest

    with open_user_dir(ckpt_dir, uid) as fd:
        steps = sorted(((int(m.group(1)), n) for n in os.listdir(fd) if (m := STEP_RE.match(n))), reverse=True)
        for step, name in steps:
            try:
                step_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                if os.fstat(step_fd).st_uid != uid:
                    continue
                data = read_user_file(step_fd, MARKER, uid, max_bytes)
                manifest = Manifest.from_json(json.loads(data), path=f"{ckpt_dir}/{name}")
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            finally:
                os.close(step_fd)
            if int(manifest.step) == step:
                return step
    return None


def latest_step(ckpt_dir: str, uid: int | None = None) -> int | None:
    """The newest committed checkpoint step in the job's ``ckpt_dir``, or None (also when it cannot be read). Read
    as the job's ``uid`` (default: ours): the monitor runs as root over a directory the job's user controls."""
    if not ckpt_dir:
        return None
    try:
        return latest_committed_step(ckpt_dir, os.getuid() if uid is None else uid)
    except (OSError, ValueError):
        return None


def _error_record(data: bytes, name: str) -> dict[str, Any]:
    """One error file as a clean ``ErrorRecord`` dict (known fields only, types checked, text bounded)."""
    raw = json.loads(data.decode("utf-8", "replace"))
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    rank = int(_ERROR_NAME_RE.match(name).group(1))  # type: ignore[union-attr]
    step = raw.get("step")
    record = ErrorRecord(
        rank=rank,
        time=float(raw["time"]),
        exc_type=_text(raw.get("exc_type", ""), "exc_type"),
        message=_text(raw.get("message", ""), "message"),
        traceback=_text(raw.get("traceback", ""), "traceback"),
        host=_text(raw.get("host", ""), "host"),
        step=int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None,
        pid=int(raw.get("pid", 0)) if isinstance(raw.get("pid", 0), int) else 0,
    )
    if int(raw.get("rank", rank)) != rank:
        raise ValueError(f"names rank {raw.get('rank')!r} but is the file of rank {rank}")
    return dataclasses.asdict(record)


def _text(value: Any, field: str) -> str:
    text = value if isinstance(value, str) else str(value)
    limit = _MAX_TEXT[field]
    return text if len(text) <= limit else text[: limit - 3] + "..."
