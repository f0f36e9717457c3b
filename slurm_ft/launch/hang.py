"""Evidence from a hung attempt, gathered on each rank's own node before the launcher kills it.

The launcher runs ``python -m slurm_ft.launch.hang --run-dir DIR`` as one task per node of the attempt
(``srun --overlap``, beside the hung step). On its node, for every rank whose heartbeat names that node, it reads
the process state from ``/proc/<pid>/stat`` (``T`` stopped, ``D`` uninterruptible ...) and ``wchan``, asks the rank
for its Python stacks (the signal its heartbeat announces: faulthandler writes ``stack.rank<R>.txt``; ``py-spy
dump`` where installed, for a rank that cannot answer: stopped, uninterruptible, or without the handler) and for its
flight-recorder dump (``trace.rank<R>.json``, ``slurm_ft.train.traces``), waiting at most ``STACK_WAIT_S`` for them,
and writes ``hang.rank<R>.json`` (``slurm_ft.core.rundir.RankState``). ``--traces-only`` asks for the dumps alone:
the launcher runs it over a failed attempt before the kill. The launcher then adds what only it knows
(each rank's liveness and last step, on its own clock) and judges. Nothing here kills anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_ft.core import rundir as records

UNREAD = records.UNREAD_STATE  # the rank's node did not report (no helper ran there, or it timed out)
_ANSWERING = frozenset({"R", "S"})  # states in which a rank runs its faulthandler at once
STACK_WAIT_S = 2.0
PYSPY_TIMEOUT_S = 10.0


# --- on the rank's node -----------------------------------------------------------------------------------------
def proc_state(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, str]:
    """(state letter, wchan) of ``pid``; ("", "") when it is gone."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return "", ""
    state = stat[stat.rfind(")") + 2:][:1]
    try:
        wchan = (proc_root / str(pid) / "wchan").read_text().strip()
    except OSError:
        wchan = ""
    return state, "" if wchan == "0" else wchan


def inspect_node(run_dir: Path, node: str, *, send: Callable[[int, int], None] = os.kill,
                 pyspy: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 proc_root: Path = Path("/proc")) -> list[records.RankState]:
    """Read, ask for stacks and flight-recorder dumps of, and record every rank of ``node`` (its heartbeats say
    which)."""
    beats = [b for b in records.read_heartbeats(run_dir) if b.host == node and b.pid > 0]
    _wait_for(_ask(run_dir, beats, send, proc_root, stacks=True), sleep)
    found = []
    for beat in beats:
        state, wchan = proc_state(beat.pid, proc_root)
        stack = records.stack_path(run_dir, beat.rank)
        if not _has_stack(stack) and pyspy and state:
            _pyspy_dump(pyspy, beat.pid, stack)
        text = _read_stack(stack)
        record = records.RankState(rank=beat.rank, host=node, pid=beat.pid, state=state, wchan=wchan,
                                   step=beat.step, stack=str(stack) if text else "",
                                   in_collective=main_thread_in_collective(text) if text else None)
        records.write_rank_state(run_dir, record)
        found.append(record)
    return found


def dump_traces(run_dir: Path, node: str, *, send: Callable[[int, int], None] = os.kill,
                sleep: Callable[[float], None] = time.sleep, proc_root: Path = Path("/proc")) -> list[int]:
    """Only ask ``node``'s ranks for their flight-recorder dumps (a failed attempt, before the kill); the ranks that
    dumped."""
    beats = [b for b in records.read_heartbeats(run_dir) if b.host == node and b.pid > 0]
    asked = _ask(run_dir, beats, send, proc_root, stacks=False)
    _wait_for(asked, sleep)
    return sorted(rank for rank, done in asked if done())


def _ask(run_dir: Path, beats: Sequence[records.Heartbeat], send: Callable[[int, int], None], proc_root: Path, *,
         stacks: bool) -> list[tuple[int, Callable[[], bool]]]:
    """Send each answering rank the signals its heartbeat announces; per signal sent, (rank, whether it answered)."""
    asked = []
    for beat in beats:
        state, _ = proc_state(beat.pid, proc_root)
        if state not in _ANSWERING:
            continue
        wanted = [(beat.stack_signal, records.stack_path(run_dir, beat.rank), stacks),
                  (beat.trace_signal, records.trace_path(run_dir, beat.rank), True)]
        for signum, path, on in wanted:
            if not (on and signum):
                continue
            before = _mtime(path)
            try:
                send(beat.pid, signum)
            except OSError:
                continue
            asked.append((beat.rank, lambda path=path, before=before: _written_since(path, before)))
    return asked


def _wait_for(asked: Sequence[tuple[int, Callable[[], bool]]], sleep: Callable[[float], None]) -> None:
    """Until every asked rank answered, at most ``STACK_WAIT_S`` (faulthandler and the dump thread answer at once)."""
    waited = 0.0
    pending = list(asked)
    while pending and waited < STACK_WAIT_S:
        pending = [(rank, done) for rank, done in pending if not done()]
        sleep(0.05)
        waited += 0.05


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _written_since(path: Path, before: int | None) -> bool:
    """A non-empty file at ``path`` that is not the one seen before the signal."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size > 0 and st.st_mtime_ns != before


_COLLECTIVE_FRAMES = ("torch/distributed/", "torch\\distributed\\", "c10d")


def main_thread_in_collective(text: str) -> bool | None:
    """Whether the main thread of a stack dump (faulthandler's or py-spy's) waits in a torch.distributed call;
    None when the dump shows no main thread. The main thread is the block holding ``<module>`` (faulthandler) or
    named ``MainThread`` (py-spy)."""
    for block in text.split("\n\n"):
        if "<module>" in block or '"MainThread"' in block:
            return any(marker in block for marker in _COLLECTIVE_FRAMES)
    return None


def _read_stack(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-65536:]
    except OSError:
        return ""


def _has_stack(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _pyspy_dump(pyspy: str, pid: int, dest: Path) -> None:
    """``py-spy dump --nonblocking`` (reads memory without pausing: works on a stopped process) into ``dest``."""
    try:
        done = subprocess.run([pyspy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PYSPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    if done.returncode == 0 and done.stdout.strip():
        try:
            fd = records.open_private(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            return
        with os.fdopen(fd, "w") as fh:
            fh.write(f"# py-spy dump --nonblocking --pid {pid}\n{done.stdout}")


# --- in the launcher --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HangEvidenceConfig:
    """Gathering a hung attempt's evidence on its nodes before the kill."""

    timeout_s: float = 15.0
    """How long the per-node helpers may take before the launcher kills the attempt anyway."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s <= 300:
            raise ValueError(f"timeout_s: must be within (0, 300] seconds, got {self.timeout_s!r}")


def helper_argv(nodes: Sequence[str], run_dir: Path, *, traces_only: bool = False) -> list[str]:
    """One helper task on each node, beside the hung (or failed) step."""
    return ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", "--quiet", "--kill-on-bad-exit=0",
            sys.executable, "-m", "slurm_ft.launch.hang", "--run-dir", str(run_dir),
            *(["--traces-only"] if traces_only else [])]


def gather_on_nodes(nodes: Sequence[str], run_dir: Path, environ: Mapping[str, str],
                    config: HangEvidenceConfig = HangEvidenceConfig()) -> str:
    """Run the helpers; "" when they all finished, else why not (the evidence is then partial)."""
    try:
        done = subprocess.run(helper_argv(nodes, run_dir), env=dict(environ), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=config.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"the per-node helpers did not finish within {config.timeout_s:g}s"
    except OSError as exc:
        return f"no srun to run the per-node helpers: {exc}"
    return "" if done.returncode == 0 else f"per-node helpers exit {done.returncode}: {done.stderr.strip()[-200:]}"


def rank_states(ranks: int, beats: Sequence[records.Heartbeat], read: Sequence[records.RankState],
                live: Mapping[int, bool | None]) -> tuple[records.RankState, ...]:
    """Pure: every rank of the attempt, from what its node read (``read``), its heartbeat, and the launcher's
    liveness judgement. A rank its node did not report has state ``UNREAD``."""
    by_rank = {s.rank: s for s in read}
    beat_of = {b.rank: b for b in beats}
    states = []
    for rank in range(ranks):
        beat = beat_of.get(rank)
        seen = by_rank.get(rank)
        base = seen or records.RankState(rank=rank, host=beat.host if beat else "", pid=beat.pid if beat else 0,
                                         state=UNREAD, step=beat.step if beat else None)
        states.append(dataclasses.replace(base, live=live.get(rank), step=beat.step if beat else base.step))
    return tuple(states)


# --- CLI (the per-node helper) ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.launch.hang", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--traces-only", action="store_true", help="only ask the ranks for their flight-recorder "
                                                                   "dumps (a failed attempt)")
    args = parser.parse_args(argv)
    node = records.node_name()
    if args.traces_only:
        dumped = dump_traces(args.run_dir, node)
        print(f"slurm-ft: flight-recorder dumps on {node}: ranks {dumped or 'none'}", file=sys.stderr)
        return 0
    for state in inspect_node(args.run_dir, node, pyspy=shutil.which("py-spy")):
        print(f"slurm-ft: hang evidence: rank {state.rank} on {node}: state {state.state or 'gone'}"
              + (f", stacks in {state.stack}" if state.stack else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
