"""The checkpoint systems ``slurm-ft bench checkpoint`` runs side by side, each behind one interface: ``setup()``
(may raise: the system is then reported unavailable with the reason), ``save(step) -> (stall_s, commit_s)``
(returns once the save is durable; ``commit_s`` None when nothing is durable), ``prune()`` (drop older saves,
rank 0, outside the timing) and ``close()``.

Every DCP peer writes the same ``{"model": state_dict}`` with ``FileSystemWriter(thread_count=threads)`` (fsync'd
files, DCP's default) on a gloo group of its own. With ``--device cuda`` the state lives on the GPU: every system
saves the same device tensors (ours through its pinned, reused buffers and side stream; DCP's pinned and
non-blocking stagers become available), memcpy is the device-to-host copy into pinned buffers allocated once, and
the raw disk limit writes a host copy made outside the timing. ``stall_s`` is the time the caller is blocked
before it may change the parameters again: for DCP's background staging that is until ``staging_completion`` is
done.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from slurm_ft.bench.ckpt_peers import CHUNK_MB, DISK, MEMCPY, OURS_ASYNC, OURS_NO_WRITEBACK, OURS_SYNC, SystemInfo

DIGESTS = "crc32 per file (manifest)"
NONE = "no (DCP loads unchecked)"


class Unavailable(Exception):
    """This system cannot run on this host (the message says why)."""


def make_model(size_mb: int, rank: int, device: str = "cpu") -> nn.Module:
    """``size_mb`` of fp32 parameters in 16 MiB chunks, named per rank (``rank<R>.<i>``) so every rank owns
    distinct items, as FSDP shards are (DCP would otherwise dedup identical names across ranks); on ``device``
    (``cuda``: GPU ``rank % count``)."""
    where = torch.device("cuda", rank % torch.cuda.device_count()) if device == "cuda" else torch.device("cpu")
    chunks = nn.ParameterList(nn.Parameter(torch.randn(CHUNK_MB * 2**20 // 4, device=where))
                              for _ in range(size_mb // CHUNK_MB))
    model = nn.Module()
    model.add_module(f"rank{rank}", chunks)
    return model


class System:
    info: SystemInfo

    def __init__(self, model: nn.Module, root: Path, threads: int, group: Any, rank: int) -> None:
        self.model, self.root, self.threads, self.group, self.rank = model, root, threads, group, rank
        self.last: Path | None = None

    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, step: int) -> tuple[float, float | None]:
        raise NotImplementedError

    def prune(self) -> None:
        """Rank 0 removes every save in ``root`` but the newest."""
        if self.rank == 0 and self.root.is_dir():
            for path in self.root.iterdir():
                if path != self.last and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        pass


class Memcpy(System):
    """Copy of the state into host buffers allocated once: the in-memory copy bandwidth."""

    info = SystemInfo(MEMCPY, "limit", False, "-")

    def setup(self) -> None:
        self.params = [p.detach() for p in self.model.parameters()]
        self.cuda = any(p.is_cuda for p in self.params)
        self.buffers = [torch.empty_like(p, device="cpu", pin_memory=p.is_cuda) for p in self.params]

    def save(self, step: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        for buf, p in zip(self.buffers, self.params):
            buf.copy_(p, non_blocking=p.is_cuda)
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, None


class RawDisk(System):
    """The state's bytes, 8 MiB writes, into ``threads`` files per rank written in parallel (as many as the DCP
    writer threads), each fsync'd: the disk bandwidth the savers could reach."""

    info = SystemInfo(DISK, "limit", False, "-")

    def setup(self) -> None:
        super().setup()
        self.host = [p.detach().cpu() for p in self.model.parameters()]  # a GPU state's bytes, outside the timing

    def save(self, step: int) -> tuple[float, float | None]:
        from concurrent.futures import ThreadPoolExecutor

        views = [memoryview(p.numpy()).cast("B") for p in self.host]
        parts = [(self.root / f"raw-{self.rank}-{i}.bin", views[i::self.threads]) for i in range(self.threads)]
        start = time.perf_counter()
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(lambda part: _write_fsync(*part), parts))
        elapsed = time.perf_counter() - start
        for path, _ in parts:
            path.unlink(missing_ok=True)
        return elapsed, elapsed


def _write_fsync(path: Path, views: list[memoryview]) -> None:
    with open(path, "wb") as fh:
        for view in views:
            for offset in range(0, len(view), 8 << 20):
                fh.write(view[offset:offset + (8 << 20)])
        fh.flush()
        os.fsync(fh.fileno())


class Ours(System):
    """slurm_ft's CheckpointManager: digests while writing, manifest, atomic publish; its own stall/total.
    ``early_writeback`` False: each file's disk write waits for its closing fsync (to show what starting it early
    gains, side by side)."""

    def __init__(self, *args: Any, async_save: bool, early_writeback: bool = True) -> None:
        super().__init__(*args)
        self.async_save, self.early_writeback = async_save, early_writeback
        name = (OURS_ASYNC if async_save else OURS_SYNC) if early_writeback else OURS_NO_WRITEBACK
        self.info = SystemInfo(name, "ours", async_save, DIGESTS)

    def setup(self) -> None:
        from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager
        from slurm_ft.train.storage import START_WRITEBACK, FileStorage

        config = CheckpointConfig(dir=str(self.root), every=1, keep_last=1, async_save=self.async_save,
                                  write_threads=self.threads)
        storage = FileStorage(write_threads=self.threads,
                              start_writeback=START_WRITEBACK if self.early_writeback else None)
        self.mgr = CheckpointManager(config, model=self.model, storage=storage)

    def save(self, step: int) -> tuple[float, float | None]:
        result = self.mgr.save(step)
        self.mgr.wait()
        if not result.ok:
            raise RuntimeError(result.error)
        return result.stall_s, result.total_s

    def prune(self) -> None:
        pass  # keep_last=1

    def close(self) -> None:
        self.mgr.close()


class DcpSync(System):
    """``dcp.save``: the caller is blocked until the files are written and fsync'd."""

    info = SystemInfo("dcp.save (sync)", "peer", False, NONE)

    def writer(self, step: int) -> dcp.FileSystemWriter:
        self.last = self.root / f"step_{step}"
        return dcp.FileSystemWriter(self.last, thread_count=self.threads)

    def save(self, step: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        dcp.save({"model": self.model.state_dict()}, storage_writer=self.writer(step), process_group=self.group)
        elapsed = time.perf_counter() - start
        return elapsed, elapsed


class DcpAsync(DcpSync):
    """``dcp.async_save`` in one executor mode (thread | process) with one stager: ``None`` = the default one
    ``async_save`` makes (and closes) per save, else ``make_stager()`` once, reused across saves."""

    def __init__(self, *args: Any, name: str, mode: str, make_stager: Callable[[], Any] | None = None) -> None:
        super().__init__(*args)
        self.info = SystemInfo(name, "peer", True, NONE)
        self.mode, self.make_stager, self.stager = mode, make_stager, None

    def setup(self) -> None:
        super().setup()
        if self.make_stager is not None:
            self.stager = self.make_stager()

    def save(self, step: int) -> tuple[float, float | None]:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

        kind = AsyncCheckpointerType.PROCESS if self.mode == "process" else AsyncCheckpointerType.THREAD
        start = time.perf_counter()
        response = dcp.async_save({"model": self.model.state_dict()}, storage_writer=self.writer(step),
                                  process_group=self.group, async_checkpointer_type=kind,
                                  async_stager=self.stager)
        upload = response
        if isinstance(response, AsyncSaveResponse):  # background staging: params are free once staging is done
            response.staging_completion.result()
            upload = response.upload_completion
        stall = time.perf_counter() - start
        upload.result()
        return stall, time.perf_counter() - start

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()


def _stager(pinned: bool = False, shared: bool = False, background: bool = False,
            non_blocking: bool = False) -> Callable[[], Any]:
    def make() -> Any:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if pinned and not torch.cuda.is_available():
            raise Unavailable("pinned memory needs CUDA; on CPU DCP ignores use_pinned_memory (= the unpinned "
                              "stager)")
        return DefaultStager(StagingOptions(use_pinned_memory=pinned, use_shared_memory=shared,
                                            use_async_staging=background, use_non_blocking_copy=non_blocking))
    return make


def _peers() -> list[tuple[str, str, Callable[[], Any] | None]]:
    """(name, executor mode, stager factory) of every ``dcp.async_save`` mode torch 2.13 offers."""
    return [
        ("dcp.async_save thread", "thread", None),
        ("dcp.async_save thread, reused stager", "thread", _stager()),
        ("dcp.async_save thread, shm stager", "thread", _stager(shared=True)),
        ("dcp.async_save thread, pinned stager", "thread", _stager(pinned=True)),
        ("dcp.async_save thread, bg staging", "thread", _stager(background=True)),
        ("dcp.async_save thread, non-blocking copy", "thread", _stager(background=True, non_blocking=True)),
        ("dcp.async_save process", "process", None),
        ("dcp.async_save process, shm stager", "process", _stager(shared=True)),
    ]


def system_names() -> list[str]:
    ours = [OURS_ASYNC, OURS_NO_WRITEBACK, OURS_SYNC]
    return [MEMCPY, DISK, *ours, DcpSync.info.name] + [name for name, _, _ in _peers()]


def build(name: str, model: nn.Module, root: Path, threads: int, group: Any, rank: int) -> System:
    """The system called ``name``, its saves under ``root/<slug>``."""
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    args = (model, root / slug, threads, group, rank)
    simple = {MEMCPY: Memcpy, DISK: RawDisk, DcpSync.info.name: DcpSync}
    if name in simple:
        return simple[name](*args)
    if name in (OURS_ASYNC, OURS_SYNC, OURS_NO_WRITEBACK):
        return Ours(*args, async_save=name != OURS_SYNC, early_writeback=name != OURS_NO_WRITEBACK)
    for peer, mode, stager in _peers():
        if peer == name:
            return DcpAsync(*args, name=name, mode=mode, make_stager=stager)
    raise ValueError(f"systems: unknown system {name!r} (known: {', '.join(system_names())})")


def preload(model: nn.Module) -> None:
    """Import what the systems import lazily (DCP's savers and stagers, our manager)."""
    import torch.distributed.checkpoint.staging  # noqa: F401
    import torch.distributed.checkpoint.state_dict_saver  # noqa: F401
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import slurm_ft.train.checkpoint  # noqa: F401
    get_state_dict(model, [])


# ---- memory: proportional set size of this process and its descendants ----
def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return out


def pss_tree_bytes(pid: int | None = None) -> int:
    """PSS of ``pid`` (default: this process) and all its descendants: shared pages (a shm stager's buffers
    mapped by a checkpoint process too) count once in the sum."""
    total, todo = 0, [pid or os.getpid()]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
        todo += _children(current)
    return total


class PeakSampler:
    """Polls :func:`pss_tree_bytes` every ``period_s`` in a thread; ``peak`` is the highest seen."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s, self.peak = period_s, pss_tree_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak = max(self.peak, pss_tree_bytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, pss_tree_bytes())
        return self.peak


def agree_error(error: str, world: int) -> str:
    """The first non-empty error of any rank (all ranks get the same), so every rank skips the same system."""
    if world == 1:
        return error
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, error)
    return next((e for e in errors if e), "")
