"""The per-rank wrapper the launcher puts before the training command: ``python -m slurm_ft.launch.rank -- CMD``.

It runs CMD as its child and, the moment the child ends, records how in ``<run_dir>/end.rank<R>.json``
(``slurm_ft.core.rundir.RankEnd``): exit code or signal, time, node, pid, the OOM killer's kills in the rank's
cgroup while it ran, and the tail of its stderr (which it passes through unchanged). This is the evidence for a
death no Python code sees (SIGKILL, SIGSEGV): the launcher's verdict names the rank that ended first. A bad end
then rings the launcher's bell (``slurm_ft.launch.bell``): the launcher reads the record at once, not a poll later.
At the start it records the GPU the rank was bound to (``slurm_ft.launch.gpus``), where it has one, and its node's
link counters (``slurm_ft.launch.links``).

Exit semantics are unchanged: it exits with the child's code, or dies of the child's signal (without a core dump
of its own), so srun, ``--kill-on-bad-exit`` and the job's exit code see what they would have seen without it.
Signals: Slurm signals every process of a step (scancel, ``--signal``, the time limit, srun's own forwarding), so
the child gets them directly; the wrapper only outlives them to record the end, and forwards none (the child
would get them twice). The run dir comes from ``$SLURM_FT_RUN_DIR``, the rank from ``$RANK`` or
``$SLURM_PROCID``. A record that cannot be written is one line on stderr, never a changed exit. Under torchrun
(one agent per node) the wrapper steps aside: its task number is no rank.
"""

from __future__ import annotations

import collections
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.core import env as ft_env
from slurm_ft.core import rundir as records
from slurm_ft.health.cgroup import oom_kills
from slurm_ft.launch import bell, gpus, links, standby

TAIL_BYTES = 8192
OUTLIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGALRM)
_DRAIN_S = 1.0  # how long to wait for the rest of the child's stderr after it ended (a grandchild may hold it)


class StderrTee:
    """Copies a pipe to our stderr as it comes and keeps its last ``TAIL_BYTES``."""

    def __init__(self, fd: int, out: int = 2) -> None:
        self.fd, self.out = fd, out
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while chunk := _read(self.fd):
            _write_all(self.out, chunk)
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size - len(self.chunks[0]) >= TAIL_BYTES:
                self.size -= len(self.chunks.popleft())

    def tail(self, wait_s: float = _DRAIN_S) -> str:
        self.thread.join(wait_s)
        return b"".join(list(self.chunks))[-TAIL_BYTES:].decode("utf-8", errors="replace")


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        return  # our stderr is gone: keep the tail, lose the copy


def end_record(rank: int, code: int, *, pid: int, when: float, oom_before: int | None, oom_after: int | None,
               tail: str, host: str, started: str = "cold") -> records.RankEnd:
    """Pure: the end record of a child that ended with Popen's ``code`` (-N: killed by signal N)."""
    oom = None if oom_before is None or oom_after is None else max(0, oom_after - oom_before)
    return records.RankEnd(rank=rank, time=when, host=host, pid=pid, exit_code=code if code >= 0 else None,
                           signal=-code if code < 0 else None, oom_kills=oom, tail=tail if code != 0 else "",
                           started=started)


def end_like(code: int, *, kill: Callable[[int, int], None] = os.kill) -> int:
    """End this process the way the child ended: die of its signal (no core of our own), else return its code."""
    if code >= 0:
        return code
    sig = -code
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL/SIGSTOP cannot be caught anyway: the kill below is the default action
    kill(os.getpid(), sig)
    return 128 + sig  # a signal whose default is to carry on (SIGCHLD, SIGWINCH): the shell's number


_remote: list[standby.Remote] = []  # the rank a standby runs for us: it gets the step's signals through us


def _outlive(signum: int, frame: object) -> None:
    """Signals for the step reach a child of ours directly, a standby's rank through us; we stay to record."""
    for rank in _remote:
        rank.send_signal(signum)


def _start(command: Sequence[str], environ: dict[str, str]) -> tuple[Any, StderrTee, str]:
    """The rank, from this slot's warm standby when the launcher offers one, else cold: (process, its stderr
    tee, how it started)."""
    if environ.get(standby.ENV):
        read, write = os.pipe()
        remote = standby.ask(command, environ, write)
        os.close(write)
        if isinstance(remote, standby.Remote):
            _remote.append(remote)
            return remote, StderrTee(read), "standby"
        os.close(read)
        print(f"slurm-ft: rank starts cold: {remote}", file=sys.stderr)
    # close_fds=False: the child gets every descriptor the task got (a PMI socket ...), as it would unwrapped.
    child = subprocess.Popen(list(command), stderr=subprocess.PIPE, close_fds=False)
    return child, StderrTee(child.stderr.fileno()), "cold"


def run(command: Sequence[str], environ: dict[str, str]) -> int:
    run_dir = ft_env.job_setting(ft_env.RUN_DIR, environ)
    rank_text = environ.get("RANK") or environ.get("SLURM_PROCID", "")
    for sig in (*OUTLIVED, records.STACK_SIGNAL, records.TRACE_SIGNAL):
        signal.signal(sig, _outlive)  # a Python handler: exec resets it to the default for the child
    before = oom_kills()
    child, tee, how = _start(command, environ)
    if rank_text.isdigit():
        gpus.record_in_background(environ, int(rank_text))  # gpu.rank<R>.json, while the rank starts
    links.record_start(environ)  # links.start.<node>.json: the node's link counters as the attempt starts
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    when = time.time()
    if how == "standby":  # counted in the standby's cgroup, where the rank ran
        before, after = child.oom_counts
    else:
        after = oom_kills() if code < 0 else before
    if run_dir and rank_text.isdigit():
        record = end_record(int(rank_text), code, pid=child.pid, when=when, oom_before=before,
                            oom_after=after, tail=tee.tail() if code else "", host=records.node_name(environ),
                            started=how)
        try:
            records.write_end(run_dir, record)
        except OSError as exc:
            print(f"slurm-ft: rank {rank_text}: cannot record how it ended in {run_dir}: {exc}", file=sys.stderr)
        if code != 0:
            bell.ring(environ, int(rank_text))  # the launcher reads the record now, not at its next poll
    return end_like(code)


def is_agent(command: Sequence[str]) -> bool:
    """Whether ``command`` starts torchrun's agent (one per node, its workers are the ranks): the wrapper then
    steps aside, as its task number is no rank (torchrun's summary and error files name the ranks)."""
    head = [Path(a).name for a in command[:4]]
    return bool(head) and (head[0] == "torchrun" or "torch.distributed.run" in head or "torch.distributed.launch"
                           in head)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("slurm-ft launch_rank: give the command after `--`", file=sys.stderr)
        return 2
    try:
        if is_agent(args):
            os.execvp(args[0], args)
        return run(args, dict(os.environ))
    except FileNotFoundError as exc:  # as srun would say it, and with the shell's status
        print(f"slurm-ft: {args[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    except PermissionError as exc:
        print(f"slurm-ft: {args[0]}: {exc.strerror}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
