"""Checkpoint manager over torch.distributed.checkpoint (DCP): FSDP2, DDP and single-process models.

One save: every rank writes its DCP shards and its ``rank_<R>.pt`` local state (step, LR scheduler, extra
state, RNG states) into the shared temp dir ``.tmp-step_<N>-<id>``; once all ranks are done, rank 0 checksums
the files, writes the manifest and publishes the dir atomically (see :mod:`slurm_ft.train.layout`).
Async saves block the loop only for a CPU staging copy; a background thread writes and commits, using its own
gloo group so its collectives never interleave with training collectives. At most one save is in flight.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from slurm_ft import env
from slurm_ft.config import require
from slurm_ft.errors import SlurmFtError
from slurm_ft.train import layout

log = logging.getLogger("slurm_ft.train.checkpoint")
# Single-process saves pass no_dist=True on purpose; DCP's "assuming single process" warning is noise then.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized, assuming")

TEST_CRASH_AT = "SLURM_FT_TEST_CRASH_AT"  # TEST-ONLY: "<point>" or "<point>@<step>": os._exit(17) there
CRASH_POINTS = ("after_local_state", "after_shards", "before_manifest", "after_manifest", "after_rename",
                "after_marker", "after_fsync")
LOCAL_STATE = "rank_{rank:05d}.pt"


class CheckpointError(SlurmFtError):
    """Checkpoints exist but none can be loaded (the message names the bad files)."""


def _crash_point(name: str, step: int | None = None) -> None:
    """TEST-ONLY fault hook: die abruptly here when ``$SLURM_FT_TEST_CRASH_AT`` names this point (and step)."""
    wanted = os.environ.get(TEST_CRASH_AT)
    if wanted is not None and wanted in (name, f"{name}@{step}"):
        log.warning("TEST-ONLY crash point %s reached: exiting", name)
        os._exit(17)


@dataclasses.dataclass(slots=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to checkpoint.

    keep_last: newest committed checkpoints kept; keep_every: also keep every step divisible by it (0 = off);
    async_save: stage on the loop, write in the background; emergency_deadline_s: budget for the save
    that a SIGUSR1/SIGTERM triggers.
    """

    dir: str
    every: int = 100
    keep_last: int = 3
    keep_every: int = 0
    async_save: bool = True
    emergency_deadline_s: float = 60.0

    def __post_init__(self) -> None:
        require(isinstance(self.dir, (str, os.PathLike)) and str(self.dir) != "", "dir",
                f"must be a non-empty path (--ft-ckpt-dir / SLURM_FT_CKPT_DIR), got {self.dir!r}")
        self.dir = str(self.dir)
        for name in ("every", "keep_last", "keep_every"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool), name, f"must be an integer, got {value!r}")
        require(self.every >= 1, "every", f"must be >= 1 (--ft-ckpt-every / SLURM_FT_CKPT_EVERY), got {self.every}")
        require(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")
        require(self.keep_every >= 0, "keep_every", f"must be >= 0 (0 = off), got {self.keep_every}")
        require(isinstance(self.async_save, bool), "async_save", f"must be true or false, got {self.async_save!r}")
        require(isinstance(self.emergency_deadline_s, (int, float)) and self.emergency_deadline_s > 0,
                "emergency_deadline_s", f"must be > 0 seconds, got {self.emergency_deadline_s!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> CheckpointConfig:
        """Build from SLURM_FT_CKPT_DIR / SLURM_FT_CKPT_EVERY (env precedence in slurm_ft.env); overrides win."""
        values: dict[str, Any] = {}
        ckpt_dir = env.job_setting(env.CKPT_DIR, environ)
        if ckpt_dir is not None:
            values["dir"] = ckpt_dir
        every = env.job_setting(env.CKPT_EVERY, environ)
        if every is not None:
            try:
                values["every"] = int(every)
            except ValueError:
                raise SlurmFtError(f"every: CKPT_EVERY must be an integer, got {every!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "dir" not in values:
            raise SlurmFtError("dir: no checkpoint directory (set --ft-ckpt-dir or SLURM_FT_CKPT_DIR)")
        return cls(**values)


class Storage(Protocol):
    """The filesystem side of a save (swap it to inject faults)."""

    def writer(self, path: Path) -> dcp.StorageWriter: ...
    def reader(self, path: Path) -> dcp.StorageReader: ...
    def write_file(self, path: Path, data: bytes) -> None: ...


class FileStorage:
    """DCP's filesystem writer/reader with fsync'd files."""

    def writer(self, path: Path) -> dcp.StorageWriter:
        return dcp.FileSystemWriter(path, sync_files=True)

    def reader(self, path: Path) -> dcp.StorageReader:
        return dcp.FileSystemReader(path)

    def write_file(self, path: Path, data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


@dataclasses.dataclass(slots=True, kw_only=True)
class SaveResult:
    step: int
    ok: bool = False
    stall_s: float = 0.0
    total_s: float = 0.0
    error: str = ""
    emergency: bool = False


def _stage(obj: Any) -> Any:
    """Deep copy with every tensor copied to CPU memory (DTensors keep their mesh and placements)."""
    if isinstance(obj, DTensor):
        local = obj.to_local().detach().to("cpu", copy=True)
        return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                  shape=obj.shape, stride=obj.stride())
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _stage(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_stage(v) for v in obj)
    return copy.deepcopy(obj)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


class CheckpointManager:
    """Save, commit, retain and resume checkpoints of one training run (construct on every rank)."""

    def __init__(self, config: CheckpointConfig, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 lr_scheduler: Any = None, extra_state: Mapping[str, Any] | None = None,
                 process_group: dist.ProcessGroup | None = None, storage: Storage | None = None) -> None:
        self.config = config
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.extra_state = dict(extra_state or {})
        for name, obj in self.extra_state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"extra_state[{name!r}] needs state_dict() and load_state_dict()")
        self.storage: Storage = storage or FileStorage()
        self.dir = Path(config.dir)
        self._distributed = dist.is_available() and dist.is_initialized()
        self._group = process_group
        self.rank = dist.get_rank(process_group) if self._distributed else 0
        self.world_size = dist.get_world_size(process_group) if self._distributed else 1
        self._bg_group = None
        if self._distributed and config.async_save:
            ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
            self._bg_group = dist.new_group(ranks=ranks, backend="gloo")
        self.rank_hosts = self._all_gather(socket.gethostname())
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread: threading.Thread | None = None
        self._inflight: SaveResult | None = None
        self._last_saved_step = -1
        self._emergency = False
        self._signals_installed = False
        self.exit_requested = False
        self.last_stall_s = 0.0
        self.results: list[SaveResult] = []

    # ---- collectives (main-thread group unless told otherwise) ----
    def _all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        if not self._distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=group or self._group)
        return out

    def _broadcast(self, obj: Any, group: Any = None) -> Any:
        if not self._distributed:
            return obj
        box = [obj]
        src = dist.get_global_rank(group or self._group, 0) if (group or self._group) is not None else 0
        dist.broadcast_object_list(box, src=src, group=group or self._group)
        return box[0]

    # ---- state ----
    def _state_dict(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optim": optim_sd}
        model_sd, _ = get_state_dict(self.model, [])
        return {"model": model_sd}

    def _local_state(self, step: int) -> bytes:
        state = {"step": step, "rng": _rng_state(),
                 "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                 "extra": {name: obj.state_dict() for name, obj in self.extra_state.items()}}
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    # ---- public API ----
    @property
    def stats(self) -> dict[str, Any]:
        done = [r for r in self.results if r is not self._inflight]
        return {"saves": len(done), "failed": sum(not r.ok for r in done), "last_stall_s": self.last_stall_s,
                "last_error": next((r.error for r in reversed(done) if r.error), ""),
                "last_saved_step": self._last_saved_step}

    def maybe_save(self, step: int) -> bool:
        """Save when ``step`` is on the interval, or synchronously when an emergency signal arrived
        (then ``exit_requested`` turns true: the trainer should exit cleanly). Returns whether it saved."""
        if self._emergency_agreed():
            self._emergency_save(step)
            self.exit_requested = True
            return True
        if step > 0 and step % self.config.every == 0 and step != self._last_saved_step:
            self.save(step)
            return True
        return False

    def save(self, step: int, *, blocking: bool | None = None) -> SaveResult:
        """Save ``step``; async per config unless ``blocking``. Failures are logged and recorded, not raised."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        blocking = (not self.config.async_save) if blocking is None else blocking
        start = time.monotonic()
        self.wait()
        result = SaveResult(step=step)
        self.results.append(result)
        token = self._broadcast(uuid.uuid4().hex[:12] if self.rank == 0 else None)
        tmp = self.dir / layout.tmp_dir_name(step, token)
        state = self._state_dict()
        if not blocking:
            state = _stage(state)
        local = self._local_state(step)
        self._last_saved_step = step
        if blocking or self._bg_group is None and self._distributed:
            self._write_and_commit(result, state, local, tmp, self._group, start)
            result.stall_s = time.monotonic() - start
        else:
            result.stall_s = time.monotonic() - start
            self._inflight = result
            self._thread = threading.Thread(target=self._write_and_commit, name=f"slurm-ft-ckpt-{step}",
                                            args=(result, state, local, tmp, self._bg_group, start), daemon=True)
            self._thread.start()
        self.last_stall_s = result.stall_s
        return result

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight save; returns False when it is still running after ``timeout``."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
            self._inflight = None
        return True

    def close(self) -> None:
        self.wait()
        if self._bg_group is not None:
            dist.destroy_process_group(self._bg_group)
            self._bg_group = None

    def install_signal_handlers(self, signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGTERM)) -> None:
        """On these signals, the next ``maybe_save`` saves synchronously and asks the trainer to exit."""
        def handler(signum: int, _frame: Any) -> None:
            self._emergency = True
        for sig in signals:
            signal.signal(sig, handler)
        self._signals_installed = True

    # ---- save internals ----
    def _emergency_agreed(self) -> bool:
        """Whether any rank got an emergency signal (one all-reduce, only once handlers are installed)."""
        if not self._signals_installed:
            return False
        if not self._distributed:
            return self._emergency
        flag = torch.tensor([1 if self._emergency else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def _emergency_save(self, step: int) -> None:
        deadline = time.monotonic() + self.config.emergency_deadline_s
        if not self.wait(timeout=self.config.emergency_deadline_s):
            log.error("emergency save at step %d: previous save still running after %.1fs", step,
                      self.config.emergency_deadline_s)
        if step == self._last_saved_step and (not self.results or self.results[-1].ok):
            log.warning("emergency: step %d already committed", step)
            return
        result = self.save(step, blocking=True)
        result.emergency = True
        late = time.monotonic() - deadline
        if late > 0:
            log.error("emergency save at step %d overran its %.1fs deadline by %.1fs", step,
                      self.config.emergency_deadline_s, late)
        log.warning("emergency save at step %d: %s", step, "committed" if result.ok else f"FAILED: {result.error}")

    def _write_and_commit(self, result: SaveResult, state: dict[str, Any], local: bytes, tmp: Path,
                          group: Any, start: float) -> None:
        try:
            self._write_and_commit_or_raise(result.step, state, local, tmp, group)
            result.ok = True
            log.info("checkpoint step %d committed (%.2fs)", result.step, time.monotonic() - start)
        except (Exception, CheckpointException) as exc:  # a failed save must not kill training; it is reported
            result.error = _describe(exc) + _free_space_note(self.dir)
            log.error("checkpoint step %d FAILED, previous checkpoints kept: %s", result.step, result.error)
            if self.rank == 0:
                _remove_tree(tmp)
        finally:
            result.total_s = time.monotonic() - start

    def _write_and_commit_or_raise(self, step: int, state: dict[str, Any], local: bytes, tmp: Path,
                                   group: Any) -> None:
        error = ""
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            self.storage.write_file(tmp / LOCAL_STATE.format(rank=self.rank), local)
            _crash_point("after_local_state", step)
        except OSError as exc:
            error = f"rank {self.rank}: {exc}"
        errors = [e for e in self._all_gather(error, group) if e]
        if errors:
            raise OSError(f"writing local state failed: {'; '.join(errors)}")
        dcp.save(state, storage_writer=self.storage.writer(tmp), process_group=group, no_dist=not self._distributed)
        _crash_point("after_shards", step)
        outcome = ""
        if self.rank == 0:
            try:
                manifest = layout.Manifest(step=step, world_size=self.world_size, files=layout.scan_files(tmp),
                                           rank_hosts=list(self.rank_hosts), time=time.time())
                layout.commit(tmp, layout.step_dir(self.dir, step), manifest,
                              lambda point: _crash_point(point, step))
                for name in layout.apply_retention(self.dir, self.config.keep_last, self.config.keep_every):
                    log.info("retention removed %s", name)
            except OSError as exc:
                outcome = f"commit failed: {exc}"
        outcome = self._broadcast(outcome, group)
        if outcome:
            raise OSError(outcome)

    # ---- resume ----
    def resume(self, hint_step: int | None = None) -> int:
        """Load the hinted step (arg, else SLURM_FT_RESUME_STEP) if committed, else the newest committed one
        whose checksums verify; fall back to older ones on corruption. Returns the step loaded (0: none)."""
        self.wait()
        if hint_step is None and env.job_setting(env.RESUME_STEP) is not None:
            raw = env.job_setting(env.RESUME_STEP)
            try:
                hint_step = int(raw)
            except ValueError:
                raise SlurmFtError(f"RESUME_STEP must be an integer, got {raw!r}") from None
        candidates = self._broadcast(self._candidates(hint_step) if self.rank == 0 else None)
        problems_seen = []
        for step in candidates:
            problems = self._verify(step)
            if problems:
                log.error("checkpoint step %d is corrupt, falling back to the previous one: %s", step,
                          "; ".join(problems))
                problems_seen.extend(problems)
                continue
            self._load(step)
            self._last_saved_step = step
            log.info("resumed from checkpoint step %d (%s)", step, layout.step_dir(self.dir, step))
            return step
        if problems_seen:
            raise CheckpointError(f"no loadable checkpoint in {self.dir}: {'; '.join(problems_seen)}")
        log.info("no committed checkpoint in %s: starting from step 0", self.dir)
        return 0

    def _candidates(self, hint_step: int | None) -> list[int]:
        steps = sorted(layout.committed_steps(self.dir), reverse=True)
        if hint_step is not None:
            if hint_step in steps:
                return [s for s in steps if s <= hint_step]
            log.warning("resume hint step %d is not a committed checkpoint; using the newest", hint_step)
        return steps

    def _verify(self, step: int) -> list[str]:
        """Checksums of this step's files, split across ranks; every rank gets the full problem list."""
        path = layout.step_dir(self.dir, step)
        try:
            manifest = layout.read_manifest(path)
            names = sorted(manifest.files)[self.rank::self.world_size]
            mine = layout.verify_files(manifest, names)
        except layout.ManifestError as exc:
            mine = [str(exc)]
        return sorted({p for part in self._all_gather(mine) for p in part})

    def _load(self, step: int) -> None:
        path = layout.step_dir(self.dir, step)
        manifest = layout.read_manifest(path)
        state = self._state_dict()
        dcp.load(state, storage_reader=self.storage.reader(path), process_group=self._group,
                 no_dist=not self._distributed)
        if self.optimizer is not None:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        else:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={})
        same_world = manifest.world_size == self.world_size
        local_file = path / LOCAL_STATE.format(rank=self.rank if same_world else 0)
        local = torch.load(local_file, weights_only=False)
        if local["step"] != step:
            raise CheckpointError(f"{local_file}: holds step {local['step']}, expected {step}")
        if self.lr_scheduler is not None and local["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(local["lr_scheduler"])
        for name, obj in self.extra_state.items():
            if name in local["extra"]:
                obj.load_state_dict(local["extra"][name])
        if same_world:
            _set_rng_state(local["rng"])
        else:
            log.warning("world size changed %d -> %d: resharded; RNG states not restored",
                        manifest.world_size, self.world_size)


def _describe(exc: BaseException) -> str:
    """One line per failure; DCP's CheckpointException (a BaseException) carries one error per rank."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {rank}: {_describe(err)}" for rank, err in sorted(exc.failures.items()))
    if isinstance(exc, tuple):  # DCP stores (exception, traceback) pairs
        return _describe(exc[0])
    return f"{type(exc).__name__}: {exc}"


def _free_space_note(path: Path) -> str:
    """torch's zip writer hides ENOSPC behind odd messages: say how much space is left."""
    import shutil
    try:
        return f" (free space in {path}: {shutil.disk_usage(path).free} bytes)"
    except OSError:
        return ""


def _remove_tree(path: Path) -> None:
    import shutil
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("could not remove %s: %s", path, exc)
