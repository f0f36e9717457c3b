"""Checkpoint manager over torch.distributed.checkpoint (DCP): FSDP2, DDP and single-process models.

One save: every rank writes its DCP shards and its ``rank_<R>.pt`` local state (step, LR scheduler, dataloader
and extra state, RNG states) into the shared temp dir ``.tmp-step_<N>-<id>``, hashing each file as it writes it.
Once all ranks are done, rank 0 gathers the digests, writes the manifest and publishes the dir atomically (see
:mod:`slurm_ft.core.layout`). The checkpoint dir must be on a filesystem all ranks share.

The dir belongs to one run (``CheckpointConfig.run_id``, by default the Slurm job id): its identity goes into
every manifest and the dir's ``OWNER`` file; another run's dir is refused unless ``adopt``, and retention never
deletes another run's steps. ``close()`` raises when the run's last save failed, so the job does not end as if
its final state were saved.

Async saves block the loop only for the staging copy into host memory; a background thread writes and
commits. At most one save is in flight (the next save waits for it: back-pressure). Collectives of the manager
run on two gloo groups of its own: ``ctl`` for the main thread's small agreements, ``ckpt`` for the one thread
doing DCP I/O, so they never interleave with each other or with training collectives (any backend).

``every="auto"`` picks the interval in seconds (Young/Daly, :mod:`slurm_ft.train.interval`) from the measured save
cost and the observed failure rate. Rank 0 alone keeps the estimator and decides from its own clock; the
decision rides on the small all-reduce the manager already does for emergency signals, so every rank saves at the
same step without an extra collective.

That agreement is cheap per step: it runs once per ``agree_every_s`` of training (every K-th ``maybe_save``, K
chosen by rank 0 from its step time and agreed with the flags, so every rank has the same schedule), and it is
pipelined: started in one step, acted on in the next, the collective hidden behind that step's compute.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import logging
import os
import random
import signal
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from slurm_ft.core import env, layout, shmdir
from slurm_ft.core import rundir as records
from slurm_ft.core.budget import NOT_FAULTS
from slurm_ft.core.config import require
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.slurm.types import JobState
from slurm_ft.train import gloo_exit, memtier
from slurm_ft.train.console import show_progress
from slurm_ft.train.interval import AdaptiveInterval, AdaptiveIntervalConfig
from slurm_ft.train.memory import OFF, MemoryTier
from slurm_ft.train.staging import Stager
from slurm_ft.train.storage import CRASH_POINTS, TEST_CRASH_AT, FileStorage, Storage, crash_point, first_few

__all__ = ["CRASH_POINTS", "TEST_CRASH_AT", "CheckpointConfig", "CheckpointError", "CheckpointManager",
           "FileStorage", "SaveResult", "Storage"]

log = logging.getLogger("slurm_ft.train.checkpoint")
# Single-process saves pass no_dist=True on purpose; DCP's "assuming single process" warning is noise then.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized, assuming")

LOCAL_STATE = "rank_{rank:05d}.pt"
DCP_METADATA = ".metadata"  # DCP's index of every saved item and where its data lies
DATALOADER_KEY = "dataloader"
# Restart causes that say nothing about the failure rate: the job was stopped, not broken.
NOT_FAILURES = NOT_FAULTS
EMERGENCY_DEADLINE_S = 20.0  # default: fits Slurm's default KillWait (30 s) with the launcher's wait (25 s)
AUTO = "auto"  # CheckpointConfig.every: Young/Daly interval from measured cost and failure rate
AUTO_MIN_INTERVAL_S = 10.0  # default shortest auto interval, and the training time before a run's first save
AGREE_EVERY_S = 2.0  # default training time between two agreements on signals and saves (a signal waits this long)
MEM_EVERY_DEFAULT = AUTO  # the memory tier: as often as the measured stall allows (slurm_ft.train.memory)


class CheckpointError(SlurmFtError):
    """Checkpoints exist but none can be loaded (the message names the bad files), or the run's last save
    failed (the message names the step and the error)."""


def _auto_interval_defaults() -> AdaptiveIntervalConfig:
    return AdaptiveIntervalConfig(min_interval_s=AUTO_MIN_INTERVAL_S)


@dataclasses.dataclass(slots=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to checkpoint (``CheckpointConfig.from_env()`` reads the ``--ft-*`` settings)."""

    dir: str
    """The checkpoint directory (``--ft-ckpt-dir`` / ``SLURM_FT_CKPT_DIR``): on the shared filesystem, one per run."""
    every: int | str = 100
    """Save every N steps, or ``"auto"``: a Young/Daly interval in seconds from the measured save cost and the observed
    failure rate (``--ft-ckpt-every`` / ``SLURM_FT_CKPT_EVERY``)."""
    auto_interval: AdaptiveIntervalConfig = dataclasses.field(default_factory=_auto_interval_defaults)
    """The estimator's settings in auto mode (``prior_mtbf_s`` default 6 h; ``min_interval_s`` default 10 s: the first
    save of a run comes after that much training, so its cost is measured early)."""
    keep_last: int = 3
    """Newest committed checkpoints kept."""
    keep_every: int = 0
    """Also keep every step divisible by this (0: off)."""
    async_save: bool = True
    """Stage on the training loop, write in the background."""
    emergency_deadline_s: float = EMERGENCY_DEADLINE_S
    """From a SIGUSR1/SIGTERM to the end of the emergency save; past it the process exits with 128+signal. Keep it below
    Slurm's KillWait for SIGTERM, and below N of ``--signal=B:USR1@N`` minus the step time for SIGUSR1."""
    verify: bool = True
    """Check each file's digest (CRC-32) at load; False checks sizes only."""
    write_threads: int = 2
    """DCP writer threads per rank."""
    reuse_staging_buffers: bool = True
    """Keep the host staging copy between async saves (shorter stalls, one state's worth of host memory)."""
    collective_timeout_s: float = 600.0
    """Timeout of the manager's gloo groups: a dead peer fails a save instead of hanging it."""
    agree_every_s: float = AGREE_EVERY_S
    """Training seconds between two agreements on emergency signals and due saves (0: every step; at most a quarter of
    ``emergency_deadline_s``). A signal is acted on up to this much plus one step later; an auto save is not agreed
    later than due."""
    run_id: str | None = None
    """The run identity that owns the dir; unset: ``SLURM_FT_RUN_ID``, else ``SLURM_JOB_ID`` (which a requeued job
    keeps); neither set: no identity, no ownership check."""
    adopt: bool = False
    """Take over a dir another run owns, e.g. to fine-tune from its checkpoint (``SLURM_FT_CKPT_ADOPT=1``); without it
    such a dir is refused."""
    mem_every: int | str = MEM_EVERY_DEFAULT
    """The memory tier (``--ft-mem-every`` / ``SLURM_FT_MEM_EVERY``): a snapshot in the job's ``/dev/shm`` dir every N
    steps, ``"auto"`` (Young's spacing from the snapshot's stall and the job's MTBF estimate, never a stall above 5%
    of the training time, at most every step) or ``"off"``.
    A restart in the same allocation resumes from it when every rank's part is there and verifies; disk otherwise."""
    mem_root: str = shmdir.SHM_ROOT
    """Where the tier's per-job dir goes (``SLURM_FT_MEM_ROOT``; default ``/dev/shm``): a memory filesystem."""

    def __post_init__(self) -> None:
        require(isinstance(self.dir, (str, os.PathLike)) and str(self.dir) != "", "dir",
                f"must be a non-empty path (--ft-ckpt-dir / SLURM_FT_CKPT_DIR), got {self.dir!r}")
        self.dir = str(self.dir)
        require(self.auto or (isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1),
                "every", f"must be an integer >= 1 or {AUTO!r} (--ft-ckpt-every / SLURM_FT_CKPT_EVERY), "
                f"got {self.every!r}")
        require(isinstance(self.auto_interval, AdaptiveIntervalConfig), "auto_interval",
                f"must be an AdaptiveIntervalConfig, got {type(self.auto_interval).__name__}")
        for name in ("keep_last", "keep_every", "write_threads"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool), name, f"must be an integer, got {value!r}")
        require(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")
        require(self.keep_every >= 0, "keep_every", f"must be >= 0 (0 = off), got {self.keep_every}")
        require(self.write_threads >= 1, "write_threads", f"must be >= 1, got {self.write_threads}")
        require(self.run_id is None or (isinstance(self.run_id, str) and self.run_id.isprintable()
                                        and 0 < len(self.run_id) <= 200), "run_id",
                f"must be a printable string of 1-200 characters (SLURM_FT_RUN_ID), got {self.run_id!r}")
        for name in ("async_save", "verify", "reuse_staging_buffers", "adopt"):
            value = getattr(self, name)
            require(isinstance(value, bool), name, f"must be true or false, got {value!r}")
        for name in ("emergency_deadline_s", "collective_timeout_s"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, name,
                    f"must be > 0 seconds, got {value!r}")
        steps = isinstance(self.mem_every, int) and not isinstance(self.mem_every, bool) and self.mem_every >= 1
        require(self.mem_every in (AUTO, OFF) or steps, "mem_every",
                f"must be an integer >= 1, {AUTO!r} or {OFF!r} (--ft-mem-every / SLURM_FT_MEM_EVERY), "
                f"got {self.mem_every!r}")
        require(isinstance(self.mem_root, (str, os.PathLike)) and os.path.isabs(str(self.mem_root)), "mem_root",
                f"must be an absolute path (SLURM_FT_MEM_ROOT), got {self.mem_root!r}")
        self.mem_root = str(self.mem_root)
        value = self.agree_every_s
        require(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, "agree_every_s",
                f"must be >= 0 seconds (0: every step), got {value!r}")

    @property
    def auto(self) -> bool:
        """Whether the interval is chosen adaptively (``every="auto"``)."""
        return self.every == AUTO

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> CheckpointConfig:
        """Build from SLURM_FT_CKPT_DIR / SLURM_FT_CKPT_EVERY / SLURM_FT_CKPT_ADOPT and the run identity
        (env precedence in slurm_ft.core.env); overrides win."""
        values: dict[str, Any] = {}
        ckpt_dir = env.job_setting(env.CKPT_DIR, environ)
        if ckpt_dir is not None:
            values["dir"] = ckpt_dir
        every = env.job_setting(env.CKPT_EVERY, environ)
        if every == AUTO:
            values["every"] = AUTO
        elif every is not None:
            try:
                values["every"] = int(every)
            except ValueError:
                raise ConfigError(f"every: CKPT_EVERY must be an integer or {AUTO!r}, got {every!r}") from None
        adopt = env.job_setting(env.CKPT_ADOPT, environ)
        if adopt is not None:
            if adopt not in ("0", "1"):
                raise ConfigError(f"adopt: CKPT_ADOPT must be 1 or 0, got {adopt!r}")
            values["adopt"] = adopt == "1"
        mem_every = env.job_setting(env.MEM_EVERY, environ)
        if mem_every is not None:
            values["mem_every"] = parse_mem_every(mem_every)
        mem_root = (os.environ if environ is None else environ).get(env.MEM_ROOT)
        if mem_root:
            values["mem_root"] = mem_root
        values["run_id"] = env.run_identity(environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "dir" not in values:
            raise ConfigError("dir: no checkpoint directory (set --ft-ckpt-dir or SLURM_FT_CKPT_DIR)")
        return cls(**values)


def parse_mem_every(text: str) -> int | str:
    """``--ft-mem-every``'s value: ``auto``, ``off`` or a number of steps >= 1 (ConfigError naming it otherwise)."""
    try:
        return shmdir.parse_mem_every(text)
    except ValueError as exc:
        raise ConfigError(f"mem_every: {exc}") from None


@dataclasses.dataclass(slots=True, kw_only=True)
class SaveResult:
    """One save as this rank saw it. ``stall_s``: time the training loop was blocked; ``total_s``: until
    durably committed (or failed; retention runs after); ``bytes_written``: this rank's files."""

    step: int
    ok: bool = False
    stall_s: float = 0.0
    total_s: float = 0.0
    bytes_written: int = 0
    error: str = ""
    emergency: bool = False
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds: local, shards, commit


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


def _held(owner: str, active: bool | None) -> str:
    """Why a Slurm job's dir is not passed on: a dir of a job that has ended passes to the next job (a
    resubmission resumes as a requeue does); one still queued or running, or one Slurm cannot speak for, does not."""
    if not owner.isdigit():
        return ""
    return f", and Slurm job {owner} is still queued or running" if active else \
        f", and Slurm cannot tell whether job {owner} has ended"


def slurm_job_active(job_id: str) -> bool | None:
    """Whether Slurm job ``job_id`` is still queued or running (``squeue``); None when Slurm cannot say."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                              timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return False if "Invalid job id" in done.stderr else None  # purged: long over
    return any(not JobState.parse(word).finished for word in done.stdout.split())


def load_local_state(path: Path) -> Any:
    """A rank's local state file, unpickled with ``weights_only``: tensors, plain containers and the NumPy RNG
    state's arrays only. Anyone who can write a shared checkpoint dir could otherwise run code in every rank that
    resumes from it (``weights_only=False`` runs any pickled callable)."""
    with torch.serialization.safe_globals(_numpy_rng_globals()):
        return torch.load(path, weights_only=True)


def _numpy_rng_globals() -> list[Any]:
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


def _stateful(name: str, obj: Any) -> Any:
    if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
        raise TypeError(f"{name} needs state_dict() and load_state_dict(), got {type(obj).__name__}")
    return obj


class CheckpointManager:
    """Save, commit, retain and resume checkpoints of one training run (construct on every rank).

    ``dataloader_state``: anything with ``state_dict()``/``load_state_dict()`` holding the data position
    (a stateful sampler or loader); ``extra_state``: more such objects by name. Both are saved per rank.
    ``clock``: monotonic seconds, for the auto interval's decisions and exposure (tests inject one).

    In auto mode rank 0 holds the interval estimator (:class:`slurm_ft.train.interval.AdaptiveInterval`): it measures
    each committed save (stall as the cost, total as the write time) and the run time as exposure, carries the
    estimator in its local state of every checkpoint, and on resume counts one failure unless that checkpoint
    was an emergency save (see :meth:`_restore_interval` for what this misses).
    """

    def __init__(self, config: CheckpointConfig, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None = None, lr_scheduler: Any = None,
                 dataloader_state: Any = None, extra_state: Mapping[str, Any] | None = None,
                 process_group: dist.ProcessGroup | None = None, storage: Storage | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 job_active: Callable[[str], bool | None] | None = None) -> None:
        self.config = config
        self._job_active = job_active or slurm_job_active
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.extra_state = {name: _stateful(f"extra_state[{name!r}]", obj)
                            for name, obj in dict(extra_state or {}).items()}
        if dataloader_state is not None:
            if DATALOADER_KEY in self.extra_state:
                raise ValueError(f"extra_state[{DATALOADER_KEY!r}] clashes with dataloader_state")
            self.extra_state[DATALOADER_KEY] = _stateful("dataloader_state", dataloader_state)
        self.storage: Storage = storage or FileStorage(write_threads=config.write_threads)
        self.dir = Path(config.dir)
        self._distributed = dist.is_available() and dist.is_initialized()
        if self._distributed:
            gloo_exit.install()  # the manager's groups are gloo: a finished run must not abort at exit
        self.rank = dist.get_rank(process_group) if self._distributed else 0
        self.world_size = dist.get_world_size(process_group) if self._distributed else 1
        show_progress(self.rank)  # "resumed from step N", "committed" on stderr unless the program set up logging
        self._ctl_group = self._new_group(process_group)   # main thread: tokens, agreements, resume
        self._ckpt_group = self._new_group(process_group)  # the one thread doing DCP save/load
        self.rank_hosts = self._all_gather(records.node_name())
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_id: str | None = self._broadcast(
            (config.run_id if config.run_id is not None else env.run_identity()) if self.rank == 0 else None)
        self._claim()
        self._stager = Stager(reuse_buffers=config.reuse_staging_buffers)
        get_state_dict(self.model, [])  # torch imports lazily on the first call: pay at startup, not in a stall
        self._thread: threading.Thread | None = None
        self._inflight: SaveResult | None = None
        self._last_saved_step = -1
        self._signals: dict[int, Any] = {}
        self._signal_received: int | None = None
        self._watchdog: threading.Timer | None = None
        self._deadline_at = 0.0
        self.exit_requested = False
        self.last_stall_s = 0.0
        self.resumed_from = 0
        self.resumed_manifest: layout.Manifest | None = None
        self.results: list[SaveResult] = []
        self._clock = clock
        self._interval = AdaptiveInterval(config.auto_interval) if config.auto and self.rank == 0 else None
        self._interval_lock = threading.Lock()  # the save thread feeds the estimator, the main thread reads it
        self._train_since = self._running_since = clock()
        self._agreement: tuple[Any, torch.Tensor] | None = None  # the all-reduce in flight (_agree)
        self.agreements = 0  # agreements this rank started (one per K maybe_save calls)
        self._calls = 0  # maybe_save calls so far; agreements start at call numbers every rank knows
        self._agree_at = 0  # the call that starts the next agreement
        self._last_agreement: tuple[int, float] | None = None  # rank 0: (call, clock) of the last one it started
        self.last_mem_stall_s = 0.0
        self.resume_source = ""  # memory, peer or disk (the resume event's "source")
        self._mem_group = self._new_group(process_group) if config.mem_every != OFF else None
        self.memory: MemoryTier | None = self._open_memory(process_group)

    # ---- memory tier ----
    def _open_memory(self, process_group: dist.ProcessGroup | None) -> MemoryTier | None:
        """The memory tier, when configured and every rank could open its node's job dir (agreed: all or none)."""
        if self.config.mem_every == OFF:
            return None
        key = shmdir.job_key(os.environ.get(env.SLURM_JOB_ID), self.run_id)
        directory, why = None, "no job id or run identity to name its dir" if key is None else ""
        if key is not None:
            try:
                directory = shmdir.open_job_dir(self.config.mem_root, key)
            except OSError as exc:
                why = str(exc)
        whys = [w for w in self._all_gather(why) if w]
        if whys:
            log.log(logging.WARNING if key is not None else logging.INFO, "memory tier off: %s", whys[0])
            if key is not None:  # a refused dir is news; a run outside Slurm without an identity is not
                self._event("mem_step_back", why=whys[0], now="memory tier off")
            return None
        alloc = memory_alloc(os.environ)
        epoch = self._broadcast(uuid.uuid4().hex[:16] if self.rank == 0 else None)  # this attempt's snapshots
        return MemoryTier(epoch=epoch, directory=directory, rank=self.rank, world_size=self.world_size,
                          rank_hosts=list(self.rank_hosts), alloc=alloc, group=self._mem_group,
                          every=self.config.mem_every, events=self._event, distributed=self._distributed,
                          mtbf_s=self._mtbf_s)

    def _mtbf_s(self) -> float:
        """The job's MTBF for the memory tier's spacing: rank 0's estimate in auto mode, else the prior."""
        if self._interval is None:
            return self.config.auto_interval.prior_mtbf_s
        with self._interval_lock:
            return self._interval.mtbf_s

    def _event(self, name: str, **fields: Any) -> None:
        """Rank 0: one event in the run's ``events.jsonl`` (beside the launcher's; ``slurm-ft report`` reads it)."""
        if self.rank != 0:
            return
        run_dir = env.job_setting(env.RUN_DIR) or str(records.run_dir_for(self.dir))
        record = {"event": name, "time": round(time.time(), 3), **fields}
        try:
            records.append_event(run_dir, record)
        except OSError as exc:
            log.warning("cannot write event %s to %s: %s", name, run_dir, exc)

    def _maybe_snapshot(self, step: int) -> None:
        if self.memory is None:
            return
        self.memory.note_step(step)
        if self.memory.due(step):
            self.last_mem_stall_s = self.memory.snapshot(step, self._state_dict,
                                                         lambda: self._local_state(step, emergency=False))

    # ---- ownership (run identity) ----
    def _claim(self) -> None:
        """Refuse a dir another run owns unless ``adopt``, else record this run as its owner (rank 0 decides;
        every rank raises the same ConfigError). A run without an identity checks nothing."""
        if self.run_id is None:
            return
        refusal = self._broadcast(self._claim_on_rank0() if self.rank == 0 else "")
        if refusal:
            raise ConfigError(refusal)

    def _claim_on_rank0(self) -> str:
        try:
            owner = layout.dir_owner(self.dir)
        except layout.ManifestError as exc:
            owner = f"unknown ({exc})"
        if owner not in (None, self.run_id):
            active = self._job_active(owner) if owner.isdigit() else None  # an owner that is a Slurm job id
            if not self.config.adopt and active is not False:
                return (f"dir: {self.dir} belongs to run {owner} (this run: {self.run_id}){_held(owner, active)}; "
                        f"give this run its own checkpoint dir, or take this one over with adopt=True "
                        f"(SLURM_FT_CKPT_ADOPT=1)")
            log.warning("run %s takes over %s from run %s%s", self.run_id, self.dir, owner,
                        " (adopt)" if self.config.adopt else f": Slurm job {owner} has ended")
        try:
            if owner != self.run_id or layout.read_owner(self.dir) != self.run_id:
                layout.write_owner(self.dir, self.run_id, now=time.time())
        except (OSError, layout.ManifestError) as exc:
            log.warning("could not record run %s as the owner of %s: %s", self.run_id, self.dir, exc)
        return ""

    def _taken_over(self) -> str:
        """Rank 0 before a commit: why this run may no longer publish into the dir (another run took it over
        since), or ""."""
        if self.run_id is None:
            return ""
        try:
            owner = layout.read_owner(self.dir)
        except layout.ManifestError as exc:
            return f"commit refused: {exc}"
        if owner not in (None, self.run_id):
            return f"commit refused: {self.dir} now belongs to run {owner} (this run: {self.run_id})"
        return ""

    # ---- collectives (on the manager's own gloo groups) ----
    def _new_group(self, process_group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
        if not self._distributed:
            return None
        ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
        return dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=ranks is not None,
                              timeout=datetime.timedelta(seconds=self.config.collective_timeout_s))

    def _all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        if not self._distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=group or self._ctl_group)
        return out

    def _broadcast(self, obj: Any, group: Any = None) -> Any:
        if not self._distributed:
            return obj
        group = group or self._ctl_group
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        return box[0]

    # ---- state ----
    def _state_dict(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optim": optim_sd}
        model_sd, _ = get_state_dict(self.model, [])
        return {"model": model_sd}

    def _local_state(self, step: int, *, emergency: bool) -> bytes:
        state = {"step": step, "rng": _rng_state(), "world_size": self.world_size, "emergency": emergency,
                 "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                 "extra": {name: obj.state_dict() for name, obj in self.extra_state.items()}}
        if self._interval is not None:
            self._note_running()
            with self._interval_lock:
                state["interval"] = self._interval.to_dict()
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    # ---- public API ----
    @property
    def stats(self) -> dict[str, Any]:
        """Save counts, the last error and the committed saves' mean stall (``stall_s_mean``); in auto mode also the
        estimator's figures (rank 0's; None on the other ranks): ``interval_s`` (the Young/Daly interval now chosen:
        training seconds between saves, once the run's first save is done), ``mtbf_s``, ``cost_s``, ``write_s``,
        ``failures``, ``exposure_s``; ``memory``: the memory tier's (:attr:`MemoryTier.stats`; None when off)."""
        done = [r for r in self.results if r is not self._inflight]
        stats = {"saves": len(done), "failed": sum(not r.ok for r in done), "last_stall_s": self.last_stall_s,
                 "last_error": next((r.error for r in reversed(done) if r.error), ""),
                 "last_saved_step": self._last_saved_step}
        if self.config.auto:
            stats.update(self._interval_stats())
        done_ok = [r for r in done if r.ok]
        stats["stall_s_mean"] = sum(r.stall_s for r in done_ok) / len(done_ok) if done_ok else None
        stats["memory"] = self.memory.stats if self.memory is not None else None
        return stats

    def maybe_save(self, step: int) -> bool:
        """Call on every rank after every step. Saves when ``step`` is on the interval (every N steps; in auto
        mode when rank 0 finds the interval has passed), or at once when an emergency signal reached any rank
        (then ``exit_requested`` turns true: the trainer should exit)."""
        emergency, due = self._agree()
        if emergency:
            self._emergency_save(step)
            self.exit_requested = True
            return True
        if not self.config.auto:
            due = step > 0 and step % self.config.every == 0
        saved = bool(due and step > 0 and step != self._last_saved_step)
        if saved:
            self.save(step)
        self._maybe_snapshot(step)  # after the disk save: the memory tier never delays it
        return saved

    def save(self, step: int, *, blocking: bool | None = None) -> SaveResult:
        """Save ``step``; async per config unless ``blocking``. Failures are logged and recorded, not raised
        (``close()`` raises when the run's last save failed)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self._save(step, (not self.config.async_save) if blocking is None else blocking, emergency=False)

    def _save(self, step: int, blocking: bool, *, emergency: bool) -> SaveResult:
        start = time.monotonic()
        self.wait()  # back-pressure: at most one save in flight
        result = SaveResult(step=step, emergency=emergency)
        self.results.append(result)
        token = self._broadcast(uuid.uuid4().hex[:12] if self.rank == 0 else None)
        tmp = self.dir / layout.tmp_dir_name(step, token)
        state = self._state_dict()
        if not blocking:
            state = self._stager.stage(state)
        local = self._local_state(step, emergency=emergency)
        self._last_saved_step = step
        if blocking:
            self._write_and_commit(result, state, local, tmp, start)
            result.stall_s = time.monotonic() - start
            self._measure(result)
        else:
            result.stall_s = time.monotonic() - start
            self._inflight = result
            self._thread = threading.Thread(target=self._write_in_background, name=f"slurm-ft-ckpt-{step}",
                                            args=(result, state, local, tmp, start))
            # not a daemon: interpreter exit waits for the save instead of killing the thread inside torch
            self._thread.start()
        self.last_stall_s = result.stall_s
        self._train_since = self._clock()
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
        """Wait for the in-flight save, restore signal handlers, release the manager's groups. Then raise
        CheckpointError when the run's last save failed: a run must not end as if its final state were saved.
        The memory tier's files of this rank go: a run that ends resumes from disk."""
        self.wait()
        if self.memory is not None:
            self.memory.close(finished=True)
        if self._ctl_group is not None:
            self._finish_agreement()  # every rank started it; its flags no longer matter
        self._disarm_watchdog()
        for sig, old in self._signals.items():
            signal.signal(sig, old)
        self._signals = {}
        for name in ("_ctl_group", "_ckpt_group", "_mem_group"):
            group = getattr(self, name)
            if group is not None:
                dist.destroy_process_group(group)
                setattr(self, name, None)
        self._raise_if_last_save_failed()

    def _raise_if_last_save_failed(self) -> None:
        last = self.results[-1] if self.results else None
        if last is None or last.ok:
            return
        newest = max(layout.committed_steps(self.dir), default=None)
        raise CheckpointError(f"the last checkpoint save (step {last.step}) failed: {last.error or 'not finished'}; "
                              f"newest committed checkpoint in {self.dir}: "
                              f"{'none' if newest is None else f'step {newest}'}")

    # ---- emergency save ----
    def install_signal_handlers(self, signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGTERM)) -> None:
        """On these signals the next ``maybe_save`` saves at once and asks the trainer to exit; a save not done
        ``emergency_deadline_s`` after the signal ends the process (exit 128+signal; the partial save is
        never loaded)."""
        def handler(signum: int, _frame: Any) -> None:
            self._arm(signum)
        for sig in signals:
            self._signals.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, handler)

    def _arm(self, signum: int) -> None:
        """Note the first emergency signal and start its deadline (idempotent)."""
        if self._signal_received is not None:
            return
        self._signal_received = signum
        self._deadline_at = time.monotonic() + self.config.emergency_deadline_s
        self._watchdog = threading.Timer(self.config.emergency_deadline_s, self._deadline_expired, args=(signum,))
        self._watchdog.daemon = True
        self._watchdog.start()

    def _deadline_expired(self, signum: int) -> None:
        log.error("emergency save not finished %.1fs after signal %d: exiting with %d (partial save not loaded)",
                  self.config.emergency_deadline_s, signum, 128 + signum)
        logging.shutdown()
        os._exit(128 + signum)

    def _disarm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog.join(timeout=5.0)  # a daemon thread still alive at interpreter exit can abort it
            self._watchdog = None

    def _agree(self) -> tuple[int, bool]:
        """(emergency signal any rank got or 0, whether rank 0 finds a save due), the same on every rank, once
        signal handlers are installed and always in auto mode.

        Off the critical path: an agreement is a gloo all-reduce(MAX) of (signal, due, K) started by one call
        without waiting for it; the next call acts on it, after a whole training step. Only every K-th call
        starts one: K is rank 0's proposal (:meth:`_proposed_spacing`), agreed with the flags, so every rank
        starts the next agreement at the same call. Every rank acts on the same flags at the same step: a signal
        up to ``agree_every_s`` plus one step after it came, well inside the emergency deadline."""
        if not self._signals and not self.config.auto:
            return 0, False
        if not self._distributed:
            signum, due = self._signal_received or 0, int(self._save_due())
        else:
            signum, due = self._agree_distributed()
        if signum:
            self._arm(signum)  # a peer got it: same deadline, counted from now
        return signum, bool(due)

    def _agree_distributed(self) -> tuple[int, int]:
        call = self._calls
        self._calls += 1
        agreed = self._finish_agreement()  # started by the previous call
        signum = due = 0
        if agreed is not None:
            signum, due, spacing = agreed
            self._agree_at = call - 1 + spacing
        if call == self._agree_at:
            self.agreements += 1
            # A save agreed for this call restarts the interval once it is taken (after this returns): the
            # agreement started now must not ask for the same save again, nor space itself by the old interval.
            spacing = self._proposed_spacing(call, saving=bool(due)) if self.rank == 0 else 1
            due_next = 0 if due else int(self._save_due())
            tensor = torch.tensor([self._signal_received or 0, due_next, spacing], dtype=torch.int32)
            work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._ctl_group, async_op=True)
            self._agreement = (work, tensor)
        return signum, due

    def _proposed_spacing(self, call: int, *, saving: bool = False) -> int:
        """Rank 0: calls from this agreement to the next, K >= 1: ``agree_every_s`` of steps (at most a quarter
        of the emergency deadline), and no later than the auto interval's next save is due (``saving``: a save
        is taken at this call, so the interval starts now). The step time is the mean since the previous
        agreement."""
        now = self._clock()
        last = self._last_agreement
        self._last_agreement = (call, now)
        if last is None or call == last[0] or self.config.agree_every_s <= 0:
            return 1
        step_s = (now - last[1]) / (call - last[0])
        horizon = min(self.config.agree_every_s, self.config.emergency_deadline_s / 4)
        if self._interval is not None:
            horizon = min(horizon, self._threshold_s() - (0.0 if saving else now - self._train_since))
        return max(1, min(2**30, int(horizon / step_s))) if step_s > 0 else 1

    def _finish_agreement(self) -> list[int] | None:
        """Wait for the all-reduce the previous ``_agree`` started; its agreed flags, or None when none ran."""
        if self._agreement is None:
            return None
        work, tensor = self._agreement
        self._agreement = None
        work.wait()
        return tensor.tolist()

    def _emergency_save(self, step: int) -> None:
        left = self._deadline_at - time.monotonic()
        if not self.wait(timeout=max(0.0, left)):
            log.error("emergency save at step %d: previous save still running at the deadline", step)
            return  # the watchdog ends the process
        if step == self._last_saved_step and (not self.results or self.results[-1].ok):  # saved or resumed
            log.warning("emergency: step %d already committed", step)
            self._disarm_watchdog()
            return
        result = self._save(step, blocking=False, emergency=True)
        if not self.wait(timeout=max(0.0, self._deadline_at - time.monotonic())):
            result.error = f"not finished within the {self.config.emergency_deadline_s}s emergency deadline"
            log.error("emergency save at step %d %s", step, result.error)
            return
        self._disarm_watchdog()
        log.warning("emergency save at step %d: %s", step, "committed" if result.ok else f"FAILED: {result.error}")

    # ---- auto interval (the estimator lives on rank 0) ----
    def _threshold_s(self) -> float:
        """Training seconds from the end of one save's stall to the next save: ``min_interval_s`` before the
        run's first save (so its cost is measured early), then the estimator's Young/Daly interval."""
        if not self.results:
            return self.config.auto_interval.min_interval_s
        with self._interval_lock:
            return self._interval.interval_s()

    def _save_due(self) -> bool:
        return self._interval is not None and self._clock() - self._train_since >= self._threshold_s()

    def _note_running(self) -> None:
        """Add the run time since the last note to the estimator's exposure."""
        now = self._clock()
        with self._interval_lock:
            self._interval.observe_running(max(0.0, now - self._running_since))
        self._running_since = now

    def _measure(self, result: SaveResult) -> None:
        """Feed a committed save to the estimator: its stall is what training lost, its total the write time."""
        if self._interval is not None and result.ok:
            with self._interval_lock:
                self._interval.observe_checkpoint(result.stall_s, write_s=result.total_s)

    def _interval_stats(self) -> dict[str, Any]:
        if self._interval is None:
            return dict.fromkeys(("interval_s", "mtbf_s", "cost_s", "write_s", "failures", "exposure_s"))
        self._note_running()
        with self._interval_lock:
            est = self._interval
            return {"interval_s": est.interval_s(), "mtbf_s": est.mtbf_s, "cost_s": est.cost_s,
                    "write_s": est.write_s, "failures": est.failures, "exposure_s": est.exposure_s}

    def _restore_interval(self, local: Mapping[str, Any]) -> None:
        """Take the estimator from the resumed checkpoint's local state and count this restart as one failure,
        unless it was not one: the launcher's ``SLURM_FT_RESTART_CAUSE`` names a preemption, time limit or
        cancellation, or, with no cause given, the checkpoint is an emergency save (what those leave behind).

        What this cannot see: the run time between that checkpoint and the crash is lost (exposure is only
        known up to the save), which underestimates the MTBF, a conservative bias towards shorter intervals;
        and several crashes before the next checkpoint count as one failure (the next save comes
        ``min_interval_s`` into each run, which keeps that window short). A checkpoint without the estimator
        (an older or non-auto run) starts a fresh one; one without the emergency mark counts as a failure.
        """
        if self._interval is None:
            return
        est = AdaptiveInterval(self.config.auto_interval)
        saved = local.get("interval")
        if saved is not None:
            try:
                est = AdaptiveInterval.from_dict(saved, self.config.auto_interval)
            except ValueError as exc:
                log.warning("checkpoint interval state unusable, starting afresh: %s", exc)
        if _counts_as_failure(env.job_setting(env.RESTART_CAUSE), emergency=bool(local.get("emergency", False))):
            est.observe_failure()
        with self._interval_lock:
            self._interval = est

    # ---- save internals ----
    def _write_in_background(self, result: SaveResult, state: dict[str, Any], local: bytes, tmp: Path,
                             start: float) -> None:
        self._write_and_commit(result, state, local, tmp, start)
        self._measure(result)

    def _write_and_commit(self, result: SaveResult, state: dict[str, Any], local: bytes, tmp: Path,
                          start: float) -> None:
        try:
            result.bytes_written = self._write_and_commit_or_raise(result, state, local, tmp)
            result.total_s = time.monotonic() - start
            result.ok = True
            log.info("checkpoint step %d committed (%.2fs)", result.step, result.total_s)
        except (Exception, CheckpointException) as exc:  # a failed save must not kill training; it is reported
            result.total_s = time.monotonic() - start
            result.error = _describe(exc) + _free_space_note(self.dir)
            log.error("checkpoint step %d FAILED, previous checkpoints kept: %s", result.step, result.error)
            if self.rank == 0:
                _remove_tree(tmp)
            return
        if self.rank == 0:
            self._retain(result.step)

    def _retain(self, step: int) -> None:
        """Retention after a commit (rank 0). Later saves' temp dirs are left alone: other ranks may have
        started the next save already."""
        try:
            for name in layout.apply_retention(self.dir, self.config.keep_last, self.config.keep_every,
                                               tmp_up_to=step, run_id=self.run_id):
                log.info("retention removed %s", name)
        except OSError as exc:
            log.error("retention after step %d failed (checkpoint is committed): %s", step, exc)

    def _write_and_commit_or_raise(self, result: SaveResult, state: dict[str, Any], local: bytes, tmp: Path) -> int:
        """All ranks write, then rank 0 commits; every rank raises the same error. Returns bytes this rank wrote."""
        step, group, error = result.step, self._ckpt_group, ""
        local_name = LOCAL_STATE.format(rank=self.rank)
        mark = time.monotonic()
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            self.storage.write_file(tmp / local_name, local)
            crash_point("after_local_state", step)
        except OSError as exc:
            error = f"rank {self.rank}: {exc}"
        errors = [e for e in self._all_gather(error, group) if e]
        if errors:
            raise OSError(f"writing local state failed: {'; '.join(errors)}")
        mark = _phase(result, "local", mark)
        writer = self.storage.writer(tmp, step=step)
        dcp.save(state, storage_writer=writer, process_group=group, no_dist=not self._distributed)
        crash_point("after_shards", step)
        mine = dict(getattr(writer, "digests", {}))
        mine[local_name] = layout.FileEntry(size=len(local), digest=layout.digest_bytes(local))
        written = self._all_gather(mine, group)
        mark = _phase(result, "shards", mark)
        outcome = ""
        if self.rank == 0:
            try:
                outcome = self._taken_over()
                if not outcome:
                    files = _manifest_files(tmp, {k: v for part in written for k, v in part.items()})
                    manifest = layout.Manifest(step=step, world_size=self.world_size, files=files,
                                               rank_hosts=list(self.rank_hosts), time=time.time(), run_id=self.run_id)
                    layout.commit(tmp, layout.step_dir(self.dir, step), manifest,
                                  lambda point: crash_point(point, step))
            except OSError as exc:
                outcome = f"commit failed: {exc}"
        outcome = self._broadcast(outcome, group)
        _phase(result, "commit", mark)
        if outcome:
            raise OSError(outcome)
        return sum(entry.size for entry in mine.values())

    # ---- resume ----
    def resume(self, hint_step: int | None = None) -> int:
        """Resume from the memory tier when every rank's part of its newest committed snapshot is there, verifies
        and is not older than disk's newest checkpoint (no hint given); else load the hinted step (arg, else
        SLURM_FT_RESUME_STEP) if committed, else the newest committed one whose files verify; fall back to older
        ones on corruption. Writes a ``resume`` event (source, step, why not memory). Returns the step (0: none)."""
        self.wait()
        if hint_step is None and env.job_setting(env.RESUME_STEP) is not None:
            raw = env.job_setting(env.RESUME_STEP)
            try:
                hint_step = int(raw)
            except ValueError:
                raise SlurmFtError(f"RESUME_STEP must be an integer, got {raw!r}") from None
        candidates = self._broadcast(self._candidates(hint_step) if self.rank == 0 else None)
        fresh = self.optimizer is not None and not self.optimizer.state
        why = self._resume_from_memory(candidates[0] if candidates else None) if hint_step is None else \
            f"resume step {hint_step} given"
        if self.resume_source:
            return self.resumed_from
        step = self._resume_from_disk(candidates)
        if step == 0 and fresh:
            # reading the live state for a check (get_state_dict) gave the optimizer its state with a zero-grad
            # step; a run that starts from scratch must start as it would have without the attempt
            self.optimizer.state.clear()
        self.resume_source = memtier.DISK
        if step > 0 or (self.memory is not None and why != memtier.NOTHING):
            self._event("resume", source=memtier.DISK, step=step, why=why)
        return step

    def _resume_from_memory(self, disk_step: int | None) -> str:
        """Load the memory tier's choice (every rank the same); returns why not (it then loaded nothing)."""
        if self.memory is None:
            return "memory tier off"
        started = time.monotonic()
        choice, payload = self.memory.restore(disk_step)
        if choice.source == memtier.DISK:
            if choice.why != memtier.NOTHING:
                log.warning("memory tier not used, resuming from disk: %s", choice.why)
            return choice.why
        problem = self._load_snapshot(choice.step, payload)
        if problem:
            log.error("memory tier snapshot of step %d not loaded, resuming from disk: %s", choice.step, problem)
            return problem
        self.resumed_from, self.resume_source = choice.step, choice.source
        self._train_since = self._running_since = self._clock()
        took = time.monotonic() - started
        log.info("resumed from step %d in %s (%.3fs)", choice.step, choice.source, took)
        self._event("resume", source=choice.source, step=choice.step, took_s=round(took, 4),
                    disk_step=disk_step)
        return ""

    def _load_snapshot(self, step: int, payload: bytes) -> str:
        """Check this rank's snapshot against the live state on every rank first, then load it; returns the
        problems (all ranks alike: nothing was changed then)."""
        live, snap, problem = None, None, ""
        try:
            with torch.serialization.safe_globals(_numpy_rng_globals()):
                snap = torch.load(io.BytesIO(payload), weights_only=True)
                local = torch.load(io.BytesIO(snap["local"]), weights_only=True)
            live = self._state_dict()
            problem = _mismatch(live, snap["state"]) or ("" if local.get("step") == step else
                                                         f"local state holds step {local.get('step')}")
        except Exception as exc:  # a snapshot of another code version or a torn payload: disk decides
            problem = f"{type(exc).__name__}: {exc}"
        problems = sorted({f"rank {r}: {p}" for r, p in enumerate(self._all_gather(problem)) if p})
        if problems:
            return "; ".join(problems[:3])
        self._apply_state(_fill(live, snap["state"]))
        self._apply_local(local, same_world=True, saved_world=self.world_size)
        return ""

    def _resume_from_disk(self, candidates: list[int]) -> int:
        problems_seen = []
        for step in candidates:
            problems = self._verify(step)
            if problems:
                log.error("checkpoint step %d is corrupt, falling back to the previous one: %s", step,
                          "; ".join(problems))
                problems_seen.extend(problems)
                continue
            manifest = self._load(step)
            self._last_saved_step, self.resumed_from, self.resumed_manifest = step, step, manifest
            self._train_since = self._running_since = self._clock()  # loading was neither training nor exposure
            log.info("resumed from step %d (saved on %d ranks, now %d): %s", step, manifest.world_size,
                     self.world_size, manifest.path)
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
        """This step's files checked against its manifest, split across ranks; all ranks get every problem."""
        path = layout.step_dir(self.dir, step)
        try:
            manifest = layout.read_manifest(path)
            names = sorted(manifest.files)[self.rank::self.world_size]
            mine = layout.verify_files(manifest, names, checksums=self.config.verify)
            if self.rank == 0 and not mine:
                mine = _metadata_problems(self.storage.reader(path), manifest)
        except layout.ManifestError as exc:
            mine = [str(exc)]
        return sorted({p for part in self._all_gather(mine) for p in part})

    def _load(self, step: int) -> layout.Manifest:
        path = layout.step_dir(self.dir, step)
        manifest = layout.read_manifest(path)
        state = self._state_dict()
        dcp.load(state, storage_reader=self.storage.reader(path), process_group=self._ckpt_group,
                 no_dist=not self._distributed)
        self._apply_state(state)
        same_world = manifest.world_size == self.world_size
        local_file = path / LOCAL_STATE.format(rank=self.rank if same_world else 0)
        try:
            local = load_local_state(local_file)
        except Exception as exc:  # verified above, so this is a torn or foreign file written by someone else
            raise CheckpointError(f"{local_file}: unreadable local state ({type(exc).__name__}: {exc})") from exc
        if local["step"] != step:
            raise CheckpointError(f"{local_file}: holds step {local['step']}, expected {step}")
        self._apply_local(local, same_world=same_world, saved_world=manifest.world_size)
        return manifest

    def _apply_state(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        else:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={})

    def _apply_local(self, local: Mapping[str, Any], *, same_world: bool, saved_world: int) -> None:
        if self.lr_scheduler is not None and local["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(local["lr_scheduler"])
        for name, obj in self.extra_state.items():
            if name in local["extra"]:
                obj.load_state_dict(local["extra"][name])
        self._restore_interval(local)
        if same_world:
            _set_rng_state(local["rng"])
        else:
            log.warning("world size changed %d -> %d: resharded; local state from rank 0, RNG states not restored",
                        saved_world, self.world_size)


def _mismatch(live: Any, saved: Any, path: str = "") -> str:
    """Why ``saved`` (a snapshot's plain state) cannot be copied into ``live`` (this rank's state dict), or ""."""
    if isinstance(live, torch.Tensor):
        local = live.to_local() if isinstance(live, DTensor) else live
        if not isinstance(saved, torch.Tensor):
            return f"{path}: a tensor in the model, {type(saved).__name__} in the snapshot"
        if local.shape != saved.shape or local.dtype != saved.dtype:
            return (f"{path}: {tuple(local.shape)} {local.dtype} here, {tuple(saved.shape)} {saved.dtype} "
                    "in the snapshot")
        return ""
    if isinstance(live, dict):
        if not isinstance(saved, dict) or set(live) != set(saved):
            return f"{path or 'state'}: keys differ"
        return next((p for k in live if (p := _mismatch(live[k], saved[k], f"{path}.{k}" if path else str(k)))), "")
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(live) != len(saved):
            return f"{path}: lengths differ"
        return next((p for i, (a, b) in enumerate(zip(live, saved)) if (p := _mismatch(a, b, f"{path}[{i}]"))), "")
    return ""


def memory_alloc(environ: Mapping[str, str]) -> str:
    """The memory tier's allocation tag: ``<job id>.<restart count>:<launch id>``. A snapshot of another tag is
    never used and is removed at start: a requeue changes the restart count; the launch id (a random token the
    launcher gives every attempt of its launch, ``SLURM_FT_LAUNCH_ID``) tells apart two jobs that share an id and
    a node's ``/dev/shm`` (two clusters whose job ids both start at 1, or ids reused after a controller reset)."""
    job = f"{environ.get(env.SLURM_JOB_ID, '')}.{environ.get(env.SLURM_RESTART_COUNT, '0') or '0'}"
    return f"{job}:{environ.get(env.LAUNCH_ID, '')}"


def _fill(live: Any, saved: Any) -> Any:
    """``live`` with every tensor overwritten in place from ``saved`` and every other value taken from ``saved``
    (what DCP's load does to a state dict); checked by :func:`_mismatch` first."""
    if isinstance(live, torch.Tensor):
        (live.to_local() if isinstance(live, DTensor) else live).copy_(saved)
        return live
    if isinstance(live, dict):
        return {k: _fill(v, saved[k]) for k, v in live.items()}
    if isinstance(live, (list, tuple)) and not hasattr(live, "_fields"):
        return type(live)(_fill(a, b) for a, b in zip(live, saved))
    return saved


def _counts_as_failure(cause: str | None, *, emergency: bool) -> bool:
    """Whether a restart for ``cause`` (a failure category; None: not known) counts towards the MTBF."""
    if cause:
        return cause not in NOT_FAILURES
    return not emergency


def _phase(result: SaveResult, name: str, since: float) -> float:
    now = time.monotonic()
    result.phases[name] = now - since
    return now


def _manifest_files(tmp: Path, written: dict[str, layout.FileEntry]) -> dict[str, layout.FileEntry]:
    """Entries for every file in ``tmp``: the digests taken while writing, checked against the sizes on disk;
    a file nobody reported (a custom storage) is hashed by reading it."""
    on_disk = {p.relative_to(tmp).as_posix(): p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()}
    files = {}
    for name, path in sorted(on_disk.items()):
        if name.startswith(f".{layout.MARKER}"):
            continue
        size = path.stat().st_size
        entry = written.get(name)
        if entry is None:
            entry = layout.FileEntry(size=size, digest=layout.file_digest(path))
        elif entry.size != size:
            raise OSError(f"{path}: {size} bytes on disk, {entry.size} written")
        files[name] = entry
    missing = sorted(set(written) - set(on_disk))
    if missing:
        raise OSError(f"written but not in {tmp}: {', '.join(missing)}")
    return files


def _metadata_problems(reader: dcp.StorageReader, manifest: layout.Manifest) -> list[str]:
    """What DCP's metadata points at that the checkpoint lacks: an item with no stored data (DCP's load would
    raise KeyError), or data in a file the manifest does not list."""
    try:
        metadata = reader.read_metadata()
    except Exception as exc:  # a torn or foreign .metadata
        return [f"{DCP_METADATA}: unreadable ({type(exc).__name__}: {exc})"]
    stored = metadata.storage_data or {}
    unstored = []
    for fqn, item in metadata.state_dict_metadata.items():
        chunks = item.chunks if isinstance(item, TensorStorageMetadata) else [None]
        if any(MetadataIndex(fqn, None if c is None else c.offsets) not in stored for c in chunks):
            unstored.append(fqn)
    problems = [f"{DCP_METADATA}: no stored data for {len(unstored)} items ({first_few(unstored)})"] if unstored else []
    files = {getattr(info, "relative_path", None) for info in stored.values()} - {None}
    unlisted = sorted(files - set(manifest.files))
    if unlisted:
        problems.append(f"{DCP_METADATA}: data in files the manifest lacks: {', '.join(unlisted)}")
    return problems


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


def _remove_tree(path: Path, attempts: int = 10) -> None:
    """Remove a failed save's temp dir. DCP does not join its other writer threads when one fails, so a file
    may appear while we delete: retry for a moment (retention removes whatever is left later)."""
    import shutil
    for attempt in range(attempts):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if attempt == attempts - 1:
                log.error("could not remove %s: %s", path, exc)
                return
            time.sleep(0.2)
