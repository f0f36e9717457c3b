"""On-disk checkpoint layout (torch-free): published step dirs, commit markers, manifests, retention.

```
<ckpt_dir>/step_00000100/            published checkpoint (only once it holds COMMITTED)
<ckpt_dir>/step_00000100/COMMITTED   the manifest JSON, written last via temp file + rename
<ckpt_dir>/.tmp-step_00000100-<id>/  a save in progress; never loaded, removed by retention
<ckpt_dir>/OWNER                     {"run_id": ...}: the run that owns the dir (temp file + rename)
```
A step dir without ``COMMITTED`` (a crash between rename and marker) is not a checkpoint.

Run identity: a run with an identity (``run_id``) records it in every manifest and in ``OWNER``. The dir's owner
is ``OWNER``'s run, else the newest manifest's; a manifest or dir without one is unowned. Retention never
deletes a step dir whose manifest (committed or staged) names another run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import uuid
import zlib
from pathlib import Path
from typing import Any

MARKER = "COMMITTED"
OWNER = "OWNER"
VERSION = 1
STEP_RE = re.compile(r"^step_(\d{8,})$")
_TMP_RE = re.compile(r"^\.tmp-step_(\d{8,})-[0-9a-f]+$")


class ManifestError(ValueError):
    """A manifest is missing, unreadable, or a file does not match it (the message names the file)."""


# The per-file digest new manifests record. It detects torn, truncated and corrupted files; it is no defence
# against tampering and need not be: whoever can rewrite a shard can rewrite the manifest beside it. CRC-32 is
# 2.2x faster than sha256 here (3.8 vs 1.7 GB/s a core) and releases the GIL, so hashing while writing and
# verifying before a load cost half as much. Manifests written with sha256 still verify.
DIGEST = "crc32"
ALGORITHMS = ("crc32", "sha256")


class Crc32:
    """A running CRC-32 (zlib) with hashlib's ``update``/``hexdigest``."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: Any) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def new_digest(algorithm: str = DIGEST) -> Any:
    """A fresh running digest of ``algorithm`` (one of :data:`ALGORITHMS`)."""
    if algorithm == "crc32":
        return Crc32()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"digest algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def digest_bytes(data: Any, algorithm: str = DIGEST) -> str:
    digest = new_digest(algorithm)
    digest.update(data)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """One file of a checkpoint: its size and its ``algorithm`` digest (JSON: ``{"size": N, "crc32": hex}``)."""

    size: int
    digest: str
    algorithm: str = DIGEST

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, self.algorithm: self.digest}

    @classmethod
    def from_json(cls, data: Any) -> FileEntry:
        algorithm = next((a for a in ALGORITHMS if a in data), None)
        if algorithm is None:
            raise KeyError(f"a digest ({' or '.join(ALGORITHMS)})")
        return cls(size=int(data["size"]), digest=str(data[algorithm]), algorithm=algorithm)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    rank_hosts: list[str] = dataclasses.field(default_factory=list)
    time: float = 0.0
    version: int = VERSION
    run_id: str | None = None  # the run that wrote it (None: unowned, as every manifest before run identity)
    path: str = ""  # the step dir it was read from ("" when not read from disk)

    def to_json(self) -> dict[str, Any]:
        data = {
            "step": self.step, "world_size": self.world_size, "rank_hosts": list(self.rank_hosts),
            "time": self.time, "version": self.version,
            "files": {name: entry.to_json() for name, entry in sorted(self.files.items())},
        }
        if self.run_id is not None:
            data["run_id"] = self.run_id
        return data

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> Manifest:
        if not isinstance(data, dict):
            raise ManifestError(f"{path or 'manifest'}: not a JSON object")
        try:
            files = {str(k): FileEntry.from_json(v) for k, v in data["files"].items()}
            return cls(step=int(data["step"]), world_size=int(data["world_size"]), files=files,
                       rank_hosts=[str(h) for h in data.get("rank_hosts", [])],
                       time=float(data.get("time", 0.0)), version=int(data.get("version", VERSION)),
                       run_id=_run_id(data.get("run_id")), path=path)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{path or 'manifest'}: malformed manifest ({exc!r})") from None


def _run_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"run_id must be a non-empty string, got {value!r}")
    return value


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def step_dir(ckpt_dir: str | os.PathLike[str], step: int) -> Path:
    return Path(ckpt_dir) / step_dir_name(step)


def tmp_dir_name(step: int, token: str) -> str:
    if not re.fullmatch(r"[0-9a-f]+", token):
        raise ValueError(f"temp dir token must be hex, got {token!r}")
    return f".tmp-{step_dir_name(step)}-{token}"


def file_digest(path: str | os.PathLike[str], algorithm: str = DIGEST, chunk: int = 4 << 20) -> str:
    digest = new_digest(algorithm)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def scan_files(root: str | os.PathLike[str]) -> dict[str, FileEntry]:
    """Size and digest of every regular file under ``root`` (relative paths; the marker excluded)."""
    root = Path(root)
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.name == MARKER:
            continue
        found[path.relative_to(root).as_posix()] = FileEntry(size=path.stat().st_size, digest=file_digest(path))
    return found


def read_manifest(step_path: str | os.PathLike[str]) -> Manifest:
    """The manifest of a published step dir; ManifestError when the marker is missing or malformed."""
    marker = Path(step_path) / MARKER
    try:
        text = marker.read_text()
    except FileNotFoundError:
        raise ManifestError(f"{marker}: no commit marker (checkpoint not committed)") from None
    except OSError as exc:
        raise ManifestError(f"{marker}: unreadable ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise ManifestError(f"{marker}: not valid JSON") from None
    return Manifest.from_json(data, path=str(step_path))


def verify_files(manifest: Manifest, names: list[str] | None = None, *, checksums: bool = True) -> list[str]:
    """Check ``names`` (default: all) against the manifest, sizes and (unless ``checksums`` is false) each
    file's digest; return one message per bad file (empty = OK)."""
    root = Path(manifest.path)
    problems = []
    for name in sorted(manifest.files) if names is None else names:
        entry = manifest.files[name]
        path = root / name
        try:
            size = path.stat().st_size
            if size != entry.size:
                problems.append(f"{path}: size {size} != manifest {entry.size}")
            elif checksums and file_digest(path, entry.algorithm) != entry.digest:
                problems.append(f"{path}: {entry.algorithm} mismatch against manifest")
        except OSError as exc:
            problems.append(f"{path}: unreadable ({exc.strerror or exc})")
    return problems


def _published(ckpt_dir: Path) -> list[tuple[int, Path]]:
    try:
        entries = list(os.scandir(ckpt_dir))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = STEP_RE.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def committed_steps(ckpt_dir: str | os.PathLike[str]) -> list[int]:
    """Steps with a published dir holding a commit marker, ascending."""
    return [step for step, path in _published(Path(ckpt_dir)) if (path / MARKER).is_file()]


def latest_committed(ckpt_dir: str | os.PathLike[str]) -> Manifest | None:
    """Manifest of the newest committed checkpoint with a readable marker, or None."""
    for step in reversed(committed_steps(ckpt_dir)):
        try:
            return read_manifest(step_dir(ckpt_dir, step))
        except ManifestError:
            continue
    return None


def read_owner(ckpt_dir: str | os.PathLike[str]) -> str | None:
    """The run named by the dir's ``OWNER`` file (None: no file); ManifestError when it is malformed."""
    path = Path(ckpt_dir) / OWNER
    try:
        data = json.loads(path.read_text())
        return _run_id(data["run_id"])
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{path}: unreadable ({exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: malformed owner file ({exc!r})") from None


def dir_owner(ckpt_dir: str | os.PathLike[str]) -> str | None:
    """The run that owns the dir: ``OWNER``'s, else the newest committed manifest's (None: unowned)."""
    owner = read_owner(ckpt_dir)
    if owner is not None:
        return owner
    newest = latest_committed(ckpt_dir)
    return newest.run_id if newest is not None else None


def write_owner(ckpt_dir: str | os.PathLike[str], run_id: str, *, now: float = 0.0) -> None:
    """Record ``run_id`` as the dir's owner (temp file + rename, fsync'd)."""
    root = Path(ckpt_dir)
    staged = root / f".{OWNER}.{uuid.uuid4().hex[:12]}.tmp"
    with open(staged, "w") as fh:
        fh.write(json.dumps({"run_id": _run_id(run_id), "time": now}))
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(staged, root / OWNER)
    fsync_path(root)


def written_by_other(path: str | os.PathLike[str], run_id: str | None) -> bool:
    """Whether a step or temp dir's manifest (committed, else staged) names a run other than ``run_id``.
    A dir without a readable manifest, or one that names no run, is not another run's."""
    for name in (MARKER, f".{MARKER}.tmp"):
        try:
            data = json.loads((Path(path) / name).read_text())
        except (OSError, ValueError):
            continue
        writer = data.get("run_id") if isinstance(data, dict) else None
        return writer is not None and writer != run_id
    return False


def commit(tmp_path: Path, final_path: Path, manifest: Manifest, crash_point=lambda name: None) -> None:
    """Publish ``tmp_path`` as ``final_path``: manifest, fsync, rename, marker (temp + rename), fsync dir."""
    crash_point("before_manifest")
    payload = json.dumps(manifest.to_json(), sort_keys=True)
    staged_marker = tmp_path / f".{MARKER}.tmp"
    with open(staged_marker, "w") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_path(tmp_path)
    crash_point("after_manifest")
    displaced = None
    if final_path.exists():  # a leftover of an earlier attempt at the same step: move aside, delete after
        displaced = final_path.with_name(tmp_dir_name(manifest.step, uuid.uuid4().hex[:12]))
        os.rename(final_path, displaced)
    os.rename(tmp_path, final_path)
    fsync_path(final_path.parent)
    crash_point("after_rename")
    os.rename(final_path / staged_marker.name, final_path / MARKER)
    crash_point("after_marker")
    fsync_path(final_path)  # the parent's entry was made durable after the rename above
    crash_point("after_fsync")
    if displaced is not None:
        shutil.rmtree(displaced, ignore_errors=True)


def retained(steps: list[int], keep_last: int, keep_every: int) -> set[int]:
    """Steps retention keeps: the newest ``keep_last`` plus every multiple of ``keep_every`` (0 = none)."""
    keep = set(sorted(steps)[-keep_last:]) if keep_last > 0 else set()
    if keep_every > 0:
        keep |= {s for s in steps if s % keep_every == 0}
    return keep


def apply_retention(ckpt_dir: str | os.PathLike[str], keep_last: int, keep_every: int,
                    *, active_tmp: str | None = None, tmp_up_to: int | None = None,
                    run_id: str | None = None) -> list[str]:
    """Delete published dirs retention does not keep (marker first, then tree), uncommitted step dirs
    older than the newest commit, and temp dirs other than ``active_tmp`` (only those of steps <= ``tmp_up_to``
    when given: a later save may be writing one). Dirs another run wrote (see :func:`written_by_other`; this
    run is ``run_id``) are never deleted, nor counted in ``keep_last``. Returns the names removed."""
    root = Path(ckpt_dir)
    published = [(s, p) for s, p in _published(root) if not written_by_other(p, run_id)]
    committed = [s for s, p in published if (p / MARKER).is_file()]
    keep = retained(committed, keep_last, keep_every)
    newest = max(committed, default=-1)
    removed = []
    for step, path in published:
        if step in keep or (step not in committed and step >= newest):
            continue
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    for entry in os.scandir(root) if root.is_dir() else []:
        match = _TMP_RE.match(entry.name)
        if not match or entry.name == active_tmp or entry.is_symlink() or written_by_other(entry.path, run_id):
            continue
        if tmp_up_to is None or int(match.group(1)) <= tmp_up_to:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed
