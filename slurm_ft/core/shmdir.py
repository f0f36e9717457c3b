"""The job's memory-tier directory in ``/dev/shm``: its name, its safe creation and its safe removal.

The checkpoint manager's memory tier (:mod:`slurm_ft.train.memtier`) keeps each rank's newest snapshot in a
per-job directory ``/dev/shm/slurm-ft-<key>`` (``key``: the Slurm job id, else the run identity), so the snapshot
outlives the rank's process but not the job. Who may talk to it: the job's user alone. The directory is created
mode 0700 by that user and refused when it is anything else (a symlink, another user's directory, a directory
others can write: ``/dev/shm`` is world-writable, so anyone could have made the name first); files in it are 0600.

Removal (the launcher at its end, the ranks as they finish, the root epilog as a backstop): only a directory owned
by the job's uid, never through a symlink (``shutil.rmtree`` on a directory descriptor opened ``O_NOFOLLOW``,
which unlinks symlinks inside instead of following them).

Also here, for the launcher and the trainer alike: the ``--ft-mem-every`` value (:func:`parse_mem_every`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from pathlib import Path

SHM_ROOT = "/dev/shm"
DIR_PREFIX = "slurm-ft-"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MEM_AUTO, MEM_OFF = "auto", "off"


def parse_mem_every(text: str) -> int | str:
    """``--ft-mem-every``'s value: ``auto``, ``off`` or a number of steps >= 1; ValueError naming it otherwise."""
    if text in (MEM_AUTO, MEM_OFF):
        return text
    if isinstance(text, str) and text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"--ft-mem-every / MEM_EVERY must be a number of steps >= 1, {MEM_AUTO!r} or {MEM_OFF!r}, "
                     f"got {text!r}")


def dir_name(key: str) -> str:
    """``slurm-ft-<key>`` for a job id or run identity; a key with other characters (or longer than 64) gets a
    sanitized prefix and a digest suffix, so two keys never share a name and no key escapes the root."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"memory tier key must be a non-empty string, got {key!r}")
    if _SAFE.fullmatch(key) and key not in (".", ".."):
        return DIR_PREFIX + key
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:32]
    return f"{DIR_PREFIX}{clean}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def job_key(job_id: str | None, run_id: str | None) -> str | None:
    """The key of a job's directory: its Slurm job id when it has one, else its run identity; None: neither."""
    return job_id or run_id or None


def open_job_dir(root: str | os.PathLike[str], key: str) -> Path:
    """The job's directory under ``root``, created private to this user if missing. Raises OSError (naming the
    path and why) when what is there is not this user's private directory."""
    path = Path(root) / dir_name(key)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        pass
    st = os.lstat(path)
    problem = _refusal(st, os.getuid())
    if problem:
        raise OSError(f"{path}: {problem}: memory tier refuses it")
    return path


def _refusal(st: os.stat_result, uid: int) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):o}, not private (700)"
    return ""


def remove_job_dir(root: str | os.PathLike[str], key: str, uid: int) -> str:
    """Remove the job's directory under ``root`` if it is a directory owned by ``uid`` (root's epilog passes the
    job's uid, the job's own processes theirs). Returns what happened, one line: "removed ...", "absent ..." or
    "left ... (why)"; never follows a symlink, never raises for what it finds there."""
    name = dir_name(key)
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return f"left {name}: cannot open {root}: {exc.strerror}"
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        except FileNotFoundError:
            return f"absent {Path(root) / name}"
        except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
            return f"left {Path(root) / name}: not a directory we may open ({exc.strerror})"
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if st.st_uid != uid:
            return f"left {Path(root) / name}: owned by uid {st.st_uid}, not the job's {uid}"
        try:
            shutil.rmtree(name, dir_fd=root_fd)
        except OSError as exc:
            return f"left {Path(root) / name}: {exc}"
        return f"removed {Path(root) / name}"
    finally:
        os.close(root_fd)
