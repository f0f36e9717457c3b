"""The filesystem side of a checkpoint save, behind a small interface so faults can be injected.

``FileStorage`` wraps DCP's FileSystemWriter: files are fsync'd, and every file a rank writes is hashed while
it is written (size and CRC-32 in ``writer.digests``), so the commit never reads the checkpoint back; its disk
write is started every ``WRITEBACK_BYTES`` so the closing fsync does not wait for the whole file.
TEST-ONLY crash points (``$SLURM_FT_TEST_CRASH_AT``) SIGKILL the process at named points of the protocol;
``$SLURM_FT_TEST_FAIL_AT`` raises an I/O error there instead (a failed save; ``after_local_state`` fails it on
every rank cleanly).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch.distributed.checkpoint as dcp
import torch.utils.serialization
from torch.distributed.checkpoint.filesystem import FileSystem

from slurm_ft.core import layout

log = logging.getLogger("slurm_ft.train.storage")

TEST_CRASH_AT = "SLURM_FT_TEST_CRASH_AT"  # TEST-ONLY: "<point>" or "<point>@<step>": SIGKILL self there
TEST_FAIL_AT = "SLURM_FT_TEST_FAIL_AT"    # TEST-ONLY: "<point>" or "<point>@<step>": raise OSError(EIO) there
# In protocol order. mid_shard: a shard half written; before_metadata: shards on disk, DCP .metadata not yet.
CRASH_POINTS = ("after_local_state", "mid_shard", "before_metadata", "after_shards", "before_manifest",
                "after_manifest", "after_rename", "after_marker", "after_fsync")
SETTLE_S = 120.0  # after a failed write, the longest wait for DCP's other writer threads to close their files


def crash_point(name: str, step: int | None = None) -> None:
    """TEST-ONLY fault hooks: SIGKILL this process when ``$SLURM_FT_TEST_CRASH_AT`` names this point (and step);
    raise OSError(EIO) when ``$SLURM_FT_TEST_FAIL_AT`` does."""
    here = (name, f"{name}@{step}")
    if os.environ.get(TEST_CRASH_AT) in here:
        log.warning("TEST-ONLY crash point %s reached: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(TEST_FAIL_AT) in here:
        raise OSError(errno.EIO, f"TEST-ONLY injected I/O error at {name}")


def first_few(names: Sequence[str], most: int = 3) -> str:
    """``a, b, c, ...``: the first ``most`` names, for an error line that stays one line."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


class Storage(Protocol):
    """The filesystem side of a save (swap it to inject faults)."""

    def writer(self, path: Path, *, step: int) -> dcp.StorageWriter: ...
    def reader(self, path: Path) -> dcp.StorageReader: ...
    def write_file(self, path: Path, data: bytes) -> None: ...


# A file's disk write is started every WRITEBACK_BYTES written (and hashed), so it overlaps the hashing and copying
# of what follows instead of all waiting for the closing fsync.
WRITEBACK_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing the range's dirty pages, do not wait
Writeback = Callable[[int], None]  # start writing the dirty pages of the file open as this descriptor


def _start_writeback_function() -> Writeback | None:
    """Linux's ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writing a file's dirty pages to disk
    without waiting for them (ctypes releases the GIL); None where libc has no such call."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start_writeback(fd: int) -> None:
        if call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "sync_file_range")
    return start_writeback


START_WRITEBACK = _start_writeback_function()


class _HashingStream:
    """Write-only file wrapper that hashes what passes through (a seek makes the digest unusable), in pieces of
    ``WRITEBACK_BYTES``, starting the disk write of each piece as it goes (``start_writeback``; best effort: a
    filesystem that refuses it is left to the closing fsync)."""

    def __init__(self, raw: Any, on_first_write: Any = None,
                 start_writeback: Writeback | None = START_WRITEBACK) -> None:
        self.raw, self.size, self.digest = raw, 0, layout.new_digest()
        self.seeked = False
        self._on_first_write = on_first_write
        self._start_writeback = start_writeback
        self._unstarted = 0  # bytes written since the last start_writeback

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = 0
        for start in range(0, len(view), WRITEBACK_BYTES):
            piece = view[start:start + WRITEBACK_BYTES]
            self.digest.update(piece)
            written += self.raw.write(piece)
            self._unstarted += len(piece)
            if self._unstarted >= WRITEBACK_BYTES:
                self._writeback()
        self.size += written
        if self._on_first_write is not None:
            hook, self._on_first_write = self._on_first_write, None
            self.raw.flush()
            hook()
        return written

    def _writeback(self) -> None:
        self._unstarted = 0
        if self._start_writeback is None:
            return
        try:
            self.raw.flush()
            self._start_writeback(self.raw.fileno())
        except OSError as exc:  # e.g. EINVAL/ESPIPE where the filesystem has no such thing: fsync does it all
            if exc.errno not in (errno.EINVAL, errno.ESPIPE, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            self._start_writeback = None

    def seek(self, *args: Any) -> int:
        self.seeked = True
        return self.raw.seek(*args)

    def tell(self) -> int:
        return self.raw.tell()

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed


def _without_zip_crc() -> contextlib.AbstractContextManager[None]:
    """``torch.save`` without its zip CRC-32s, in this thread only (torch's serialization config is thread-local).

    DCP writes each tensor with ``torch.save``, which computes a CRC-32 of every record (as long again as our
    own digest) that ``torch.load`` never checks. The manifest's CRC-32 of each whole file, taken on the same
    pass, is what resume verifies."""
    return torch.utils.serialization.config.patch("save.compute_crc32", False)


class HashingFileSystem(FileSystem):
    """DCP FileSystem that records ``{name: FileEntry}`` of each file it writes under ``root``."""

    def __init__(self, root: Path, step: int, start_writeback: Writeback | None = START_WRITEBACK) -> None:
        super().__init__()
        self.root, self.step = Path(root), step
        self.start_writeback = start_writeback
        self.digests: dict[str, layout.FileEntry] = {}
        self.unhashed: set[str] = set()
        self.failures: list[str] = []  # writes that raised, in whichever DCP writer thread they ran
        self._open_streams = 0
        self._streams_changed = threading.Condition()

    def _name(self, path: Any) -> str:
        return Path(path).relative_to(self.root).as_posix()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = self._name(path)
        hook = (lambda: crash_point("mid_shard", self.step)) if name.endswith(".distcp") else None
        self._stream_opens(name)
        try:
            with super().create_stream(path, mode) as raw, _without_zip_crc():
                stream = _HashingStream(raw, hook, self.start_writeback)
                yield stream
        except Exception as exc:
            self.failures.append(f"{name}: {exc}")
            raise
        finally:
            self._stream_closed()
        if stream.seeked:
            self.unhashed.add(name)
        else:
            self.digests[name] = layout.FileEntry(size=stream.size, digest=stream.digest.hexdigest())

    def _stream_opens(self, name: str) -> None:
        with self._streams_changed:
            if self.failures:
                raise OSError(errno.ECANCELED, f"{name} not written: this save already failed ({self.failures[0]})")
            self._open_streams += 1

    def _stream_closed(self) -> None:
        with self._streams_changed:
            self._open_streams -= 1
            self._streams_changed.notify_all()

    def settle(self, timeout: float = SETTLE_S) -> bool:
        """Wait until no file is open for writing; False if one still is after ``timeout`` seconds.

        DCP's calling writer thread raises on its first failed file without joining the others, which would go
        on writing into the step's temporary folder while the failed save is cleaned up (and hold the
        filesystem busy). Once a write failed, no new file opens, so this waits for the files already open."""
        with self._streams_changed:
            return self._streams_changed.wait_for(lambda: self._open_streams == 0, timeout)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        old, new = self._name(path), self._name(new_path)
        if old in self.digests:
            self.digests[new] = self.digests.pop(old)
        if old in self.unhashed:
            self.unhashed.discard(old)
            self.unhashed.add(new)


class HashingWriter(dcp.FileSystemWriter):
    """FileSystemWriter with fsync'd files whose ``digests`` list every file this rank wrote."""

    def __init__(self, path: Path, *, step: int, thread_count: int = 1,
                 start_writeback: Writeback | None = START_WRITEBACK) -> None:
        super().__init__(path, sync_files=True, thread_count=thread_count, overwrite=True)
        self.fs = HashingFileSystem(Path(path), step, start_writeback)

    @property
    def digests(self) -> dict[str, layout.FileEntry]:
        return self.fs.digests

    @property
    def unhashed(self) -> set[str]:
        return self.fs.unhashed

    def write_data(self, plan: Any, planner: Any) -> Any:
        """DCP's write, failing when any item went unwritten. DCP's extra writer threads (``thread_count`` > 1)
        die on an error without reporting it: their items are then missing from the results, and the save
        would commit a checkpoint whose metadata lacks them (it loads with a KeyError). When the calling thread's
        own write fails, the other threads' open files are closed before the error goes on (``settle``)."""
        try:
            future = super().write_data(plan, planner)
        except BaseException:
            if not self.fs.settle():
                log.warning("step %s: a DCP writer thread still has a file open %.0f s after the save failed",
                            self.fs.step, SETTLE_S)
            raise
        written = {result.index for result in future.value()}
        unwritten = [item.index.fqn for item in plan.items if item.index not in written]
        if self.fs.failures or unwritten:
            why = "; ".join(self.fs.failures) or "no error reported"
            raise OSError(f"{len(unwritten)} of {len(plan.items)} items not written ({first_few(unwritten)}): {why}")
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        crash_point("before_metadata", self.fs.step)
        super().finish(metadata, results)


class FileStorage:
    """DCP's filesystem writer/reader with fsync'd, hashed files; ``write_threads`` DCP writer threads;
    ``start_writeback`` None: every file waits for its closing fsync (the benchmark's side-by-side baseline)."""

    def __init__(self, *, write_threads: int = 1,
                 start_writeback: Writeback | None = START_WRITEBACK) -> None:
        if write_threads < 1:
            raise ValueError(f"write_threads must be >= 1, got {write_threads}")
        self.write_threads = write_threads
        self.start_writeback = start_writeback

    def writer(self, path: Path, *, step: int = -1) -> dcp.StorageWriter:
        return HashingWriter(path, step=step, thread_count=self.write_threads, start_writeback=self.start_writeback)

    def reader(self, path: Path) -> dcp.StorageReader:
        return dcp.FileSystemReader(path)

    def write_file(self, path: Path, data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
