"""The memory tier at run time: snapshots every K steps into the job's ``/dev/shm`` directory, peer copies over a
ring of nodes, the commit agreement, and the restore plan's transfers (the files and rules: :mod:`.memtier`).

A snapshot blocks the training loop only for the host copy (:class:`~slurm_ft.train.staging.Stager`, its own
buffers); a background thread serializes it, writes it with its digest, sends it to the peer rank and receives its
source's copy (gloo send/recv of a byte tensor), then all ranks agree (all-gather in the tier's own gloo group)
and each writes its commit marker and drops older steps. At most one snapshot is in flight: the next one waits
for it (the wait counts as stall; ``auto`` spaces snapshots so it rarely happens). Every decision that changes
what the ranks do next (spacing, stepping back under memory pressure) is computed from the all-gathered figures,
so every rank makes the same one without another collective.

Memory pressure: before writing, a rank compares the snapshot (and the peer copy it will receive) with the free
space of the tier's root and the host's available memory; short on any rank, the tier steps back for everyone:
peer copies off first, then the tier off, each with a warning event. A write that fails (ENOSPC) counts the same.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slurm_ft.train import memtier
from slurm_ft.train.staging import Stager

log = logging.getLogger("slurm_ft.train.memory")

AUTO = "auto"
OFF = "off"
STALL_BUDGET = 0.05  # auto: a snapshot's stall never above this fraction of the training time between snapshots
Events = Callable[..., None]  # (event name, **fields): rank 0 writes them to the run's events.jsonl


@dataclasses.dataclass(slots=True)
class Outcome:
    """One snapshot as this rank saw it (all-gathered for the commit)."""

    step: int
    ok: bool = False
    error: str = ""
    pressure: bool = False
    peer_ok: bool = True
    stall_s: float = 0.0
    write_s: float = 0.0
    step_s: float = 0.0
    nbytes: int = 0
    mtbf_s: float = 0.0  # the job's failure estimate as this rank knows it (rank 0's is used)


def pressure(*, need: int, free: int) -> bool:
    """Whether writing ``need`` more bytes would leave less than that again free (room for the next one)."""
    return free < 2 * need


def free_bytes(root: Path) -> int:
    """The smaller of the tier root's free space and the host's available memory (tmpfs lives in memory)."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = min(free, int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return free


def plain(state: Any) -> Any:
    """The staged state with every DTensor as its local shard (what this rank holds), for ``torch.save``."""
    if isinstance(state, DTensor):
        return state.to_local()
    if isinstance(state, dict):
        return {k: plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(plain(v) for v in state)
    return state


class MemoryTier:
    """One rank's side of the tier (construct on every rank, with the same ``every``)."""

    def __init__(self, *, directory: Path, rank: int, world_size: int, rank_hosts: list[str], alloc: str,
                 group: Any, every: int | str, events: Events, distributed: bool, epoch: str,
                 mtbf_s: Callable[[], float] = lambda: 0.0) -> None:
        self.dir, self.rank, self.world_size, self.alloc, self.epoch = directory, rank, world_size, alloc, epoch
        self.mtbf_s = mtbf_s  # auto: the job's mean time between failures now (0: unknown), for the spacing
        self.group, self.events, self.distributed = group, events, distributed
        self.every = every
        self.local = memtier.local_ranks(rank_hosts, rank)
        ring = memtier.peer_ring(rank_hosts)
        self.send_to, self.recv_from = ring[rank]
        self.peers = any(dst is not None for dst, _src in ring.values())
        self.enabled = True
        self.spacing = 1 if every == AUTO else int(every)
        self._next = 0  # auto: the step of the next snapshot (0: the first maybe_save)
        # On CPU no host copy is kept between snapshots (only the files); with CUDA the pinned staging buffers are
        # kept, as pinning fresh host memory at every snapshot would cost more than the copy.
        self._stager = Stager(reuse_buffers=torch.cuda.is_available())
        self._thread: threading.Thread | None = None
        self._last_call: tuple[int, float] | None = None
        self._step_s = 0.0
        self.snapshots = 0  # taken by this rank
        self.stall_total_s = self.stall_max_s = self.write_total_s = 0.0
        self.snapshot_bytes = 0
        self.committed_step: int | None = None
        self._reported = False
        for name in memtier.clear_foreign(directory, alloc):
            log.info("memory tier: removed stale %s", name)

    # ---- snapshots ----
    def due(self, step: int) -> bool:
        if not self.enabled or step <= 0:
            return False
        if self.every == AUTO:
            return step >= self._next
        return step % self.spacing == 0

    def note_step(self, step: int) -> None:
        """Called every step: the mean step time between snapshots, for auto's spacing."""
        now = time.monotonic()
        if self._last_call is not None and step > self._last_call[0]:
            self._step_s = (now - self._last_call[1]) / (step - self._last_call[0])
        self._last_call = (step, now)

    def snapshot(self, step: int, state: Callable[[], Any], local: Callable[[], bytes]) -> float:
        """Stage ``step`` and start its background write; returns the stall (seconds the loop was blocked)."""
        start = time.monotonic()
        self.wait()
        if not self.enabled:
            return time.monotonic() - start
        staged = self._stager.stage(state())
        outcome = Outcome(step=step, step_s=self._step_s, mtbf_s=self.mtbf_s())
        payload_local = local()
        outcome.stall_s = time.monotonic() - start
        self.snapshots += 1
        self.stall_total_s += outcome.stall_s
        self.stall_max_s = max(self.stall_max_s, outcome.stall_s)
        if self.every == AUTO:
            self._next = step + self.spacing
        self._thread = threading.Thread(target=self._write, args=(outcome, staged, payload_local),
                                        name=f"slurm-ft-mem-{step}")
        self._thread.start()
        return outcome.stall_s

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, outcome: Outcome, staged: Any, local: bytes) -> None:
        start = time.monotonic()
        data = b""
        try:
            buf = io.BytesIO()
            torch.save({"state": plain(staged), "local": local}, buf)
            del staged
            data = memtier.encode(step=outcome.step, rank=self.rank, world_size=self.world_size, alloc=self.alloc,
                                  epoch=self.epoch, payload=buf.getvalue())
            del buf
            outcome.nbytes = len(data)
            if pressure(need=len(data) * (2 if self.peers else 1), free=free_bytes(self.dir)):
                outcome.pressure, data = True, b""
            else:
                memtier.write_file(self.dir, memtier.snap_name(outcome.step, self.rank), data)
                outcome.ok = True
        except Exception as exc:  # a failed snapshot must not kill training: reported, the tier steps back
            outcome.error, data = f"{type(exc).__name__}: {exc}", b""
            outcome.pressure = isinstance(exc, OSError)
        try:
            self._exchange(outcome, data if self.peers else b"")
        except Exception as exc:
            outcome.peer_ok, outcome.error = False, outcome.error or f"peer copy: {type(exc).__name__}: {exc}"
        outcome.write_s = time.monotonic() - start
        self.write_total_s += outcome.write_s
        self.snapshot_bytes = outcome.nbytes
        try:
            everyone = self._all_gather(dataclasses.asdict(outcome))
        except Exception as exc:  # a dead peer: nothing commits; the restart decides from what is there
            log.warning("memory tier: step %d not committed: %s", outcome.step, exc)
            return
        self._commit(outcome.step, [Outcome(**o) for o in everyone])

    def _exchange(self, outcome: Outcome, data: bytes) -> None:
        """Send this rank's snapshot to its ring peer and keep its source's copy (sizes first; 0: nothing)."""
        if not self.peers or not self.distributed:
            return
        works, size_in = [], torch.zeros(1, dtype=torch.int64)
        if self.send_to is not None:
            works.append(dist.isend(torch.tensor([len(data)], dtype=torch.int64), self._global(self.send_to),
                                    group=self.group))
        if self.recv_from is not None:
            works.append(dist.irecv(size_in, self._global(self.recv_from), group=self.group))
        for work in works:
            work.wait()
        works, received = [], None
        if self.send_to is not None and data:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a read-only buffer: gloo only reads it
                works.append(dist.isend(torch.frombuffer(data, dtype=torch.uint8), self._global(self.send_to),
                                        group=self.group))
        if self.recv_from is not None and int(size_in) > 0:
            received = torch.empty(int(size_in), dtype=torch.uint8)
            works.append(dist.irecv(received, self._global(self.recv_from), group=self.group))
        for work in works:
            work.wait()
        if self.recv_from is not None:
            if received is None:
                outcome.peer_ok = False
                return
            copy = received.numpy().tobytes()
            memtier.decode(copy)  # a copy damaged on the way is not kept
            memtier.write_file(self.dir, memtier.peer_name(outcome.step, self.recv_from, self.rank), copy)

    def _commit(self, step: int, everyone: list[Outcome]) -> None:
        if all(o.ok for o in everyone):
            peers = self.peers and all(o.peer_ok for o in everyone)
            try:
                memtier.write_file(self.dir, memtier.commit_name(step, self.rank),
                                   memtier.marker_bytes(step=step, world_size=self.world_size, alloc=self.alloc,
                                                        epoch=self.epoch, peers=peers))
                memtier.retain(self.dir, self.rank, keep_from=step)
                self.committed_step = step
            except OSError as exc:
                log.warning("memory tier: commit marker of step %d: %s", step, exc)
        self._adjust(everyone)

    def _adjust(self, everyone: list[Outcome]) -> None:
        """The same decision on every rank from the same gathered figures: step back, report, re-space."""
        short = [i for i, o in enumerate(everyone) if o.pressure]
        if short:
            what = "peer copies off" if self.peers else "memory tier off"
            if self.peers:
                self.peers = False
            else:
                self.enabled = False
            log.warning("memory tier: memory pressure on rank(s) %s: %s", short, what)
            self.events("mem_step_back", why=f"memory pressure on ranks {short}", now=what,
                        step=everyone[0].step, errors=sorted({o.error for o in everyone if o.error})[:3])
            return
        if all(o.ok for o in everyone) and not self._reported:
            self._reported = True
            shard = max(o.nbytes for o in everyone)
            self.events("mem_tier", step=everyone[0].step, every=self.every, peers=self.peers,
                        snapshot_bytes=shard, host_bytes_per_rank=shard * (2 if self.peers else 1)
                        + self._stager.cached_bytes,
                        stall_s=round(max(o.stall_s for o in everyone), 4),
                        write_s=round(max(o.write_s for o in everyone), 4))
        if self.every == AUTO:
            spacing = memtier.auto_spacing(step_s=max(o.step_s for o in everyone),
                                           stall_s=max(o.stall_s for o in everyone),
                                           write_s=max(o.write_s for o in everyone), budget=STALL_BUDGET,
                                           mtbf_s=everyone[0].mtbf_s)
            if spacing != self.spacing:
                log.info("memory tier: a snapshot every %d steps", spacing)
            self.spacing = spacing

    @property
    def stats(self) -> dict[str, Any]:
        """This rank's figures: snapshots taken, their mean and largest stall and mean background write, the last
        snapshot's size, the newest step it committed, the spacing now, whether peers and the tier are on."""
        n = max(1, self.snapshots)
        return {"snapshots": self.snapshots, "stall_s_mean": self.stall_total_s / n, "stall_s_max": self.stall_max_s,
                "write_s_mean": self.write_total_s / n, "snapshot_bytes": self.snapshot_bytes,
                "committed_step": self.committed_step, "spacing": self.spacing, "peers": self.peers,
                "enabled": self.enabled}

    # ---- restore ----
    def restore(self, disk_step: int | None) -> tuple[memtier.Choice, bytes]:
        """Agree on the source (:func:`memtier.choose`) and fetch this rank's part: its own file or a copy another
        rank sends. Every rank returns the same choice; a transfer or check that fails anywhere makes it disk."""
        mine = memtier.inventory(self.dir, self.rank, self.local, world_size=self.world_size, alloc=self.alloc)
        inventories = self._all_gather(mine)
        choice = memtier.choose(inventories, self.world_size, disk_step=disk_step)
        if choice.source == memtier.DISK:
            return choice, b""
        data, problem = self._fetch(choice)
        problems = sorted({p for p in self._all_gather(problem) if p})
        if problems:
            return memtier.Choice(memtier.DISK, why="; ".join(problems[:3])), b""
        return choice, data

    def _fetch(self, choice: memtier.Choice) -> tuple[bytes, str]:
        data, problem = b"", ""
        for rank, (holder, name) in enumerate(choice.plan):
            if holder == rank == self.rank:
                data, problem = self._read(name)
            elif holder == self.rank:
                blob, _ = self._read(name)
                self._send_blob(blob, rank)
            elif rank == self.rank:
                data = self._recv_blob(holder)
                problem = "" if data else f"rank {rank}: no copy of step {choice.step} came from rank {holder}"
        if data and not problem:
            try:
                header, payload = memtier.decode(data)
                problem = memtier.check_header(header, step=choice.step, rank=self.rank,
                                               world_size=self.world_size, alloc=self.alloc)
                data = payload
            except memtier.SnapshotError as exc:
                problem = str(exc)
            if problem:
                problem = f"rank {self.rank} step {choice.step}: {problem}"
        return (b"" if problem else data), problem

    def _read(self, name: str) -> tuple[bytes, str]:
        try:
            return memtier.read_file(self.dir, name), ""
        except OSError as exc:
            return b"", f"{name}: {exc.strerror or exc}"

    def _send_blob(self, blob: bytes, rank: int) -> None:
        dist.send(torch.tensor([len(blob)], dtype=torch.int64), self._global(rank), group=self.group)
        if blob:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dist.send(torch.frombuffer(blob, dtype=torch.uint8), self._global(rank), group=self.group)

    def _recv_blob(self, holder: int) -> bytes:
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, self._global(holder), group=self.group)
        if int(size) == 0:
            return b""
        blob = torch.empty(int(size), dtype=torch.uint8)
        dist.recv(blob, self._global(holder), group=self.group)
        return blob.numpy().tobytes()

    # ---- collectives ----
    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    def _all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def close(self, *, finished: bool) -> None:
        """Wait for the snapshot in flight; a run that finished drops this rank's files (and the dir once empty)."""
        self.wait()
        if finished:
            memtier.retain(self.dir, self.rank, keep_from=1 << 62)
            try:
                os.rmdir(self.dir)
            except OSError:
                pass  # other ranks' files still there, or gone already
