"""Warm standby ranks: a rank restarted in the allocation starts in an interpreter that has already imported torch.

Restarting a rank cold costs the interpreter and the torch import (seconds per rank, and on a busy node all ranks
import at once). The launcher (``slurm_ft.launch.launcher``) therefore starts, once the first attempt trains, one
standby per task slot (node, local task id) in a step of its own (``srun --overlap``): ``python -m
slurm_ft.launch.standby``. Each is a keeper that never imports torch: it listens on an abstract unix socket named by
job, node and slot (``address``) and keeps one spare, a fresh interpreter of its own (``Spare``) that imports the
preload modules and waits.

On a restart, the per-rank wrapper of the new step (``slurm_ft.launch.rank``) asks its slot's keeper for the rank
(``ask``): it passes its stdin, stdout and a stderr pipe (SCM_RIGHTS), its environment, directory and command. The
keeper hands all of that to its spare, which becomes the rank: it runs the script or module as ``__main__``
(``python script.py ...`` or ``python -m module ...`` with the same interpreter, nothing else). A request that
comes while the spare still imports waits for it. The keeper tells the wrapper the rank's pid, passes on the
signals the wrapper gets (Slurm signals the new step's tasks: the wrappers), kills the rank if the wrapper goes
away (the step was killed), and reports how the rank ended: exit code or signal, and the OOM killer's kills in its
cgroup. It starts the next spare once the rank has run ``refill_after_s`` (or has ended).

Why a spare and not a fork of a warm parent (the first design): a process that imported torch is not safe to
fork. On a loaded host a forked rank's first CPU GEMM now and then spun forever in MKL's memory accounting
(``mkl_serv_allocate``), and CUDA, OpenMP and NCCL state do not survive a fork either. A spare is a process like
a cold rank, started early.

Trust: only a process of the keeper's own uid may ask, and the wrapper sends nothing to a keeper of another uid
(SO_PEERCRED both ways: the environment may hold the user's secrets). Anything else (no standby on the slot, a
busy or gone one, another interpreter, a command of another shape) and the wrapper starts the rank cold, as
before: a standby can make a restart faster, never make one fail.

Limits: the rank runs in the standby step's cgroup, not the new step's (its memory and devices are the standby
step's, which overlaps the job's); environment variables read at import time (rare: most of torch's are read
lazily, ``CUDA_VISIBLE_DEVICES`` at CUDA's first use) are the standby step's.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_ft.core import env as ft_env
from slurm_ft.health.cgroup import oom_kills

ENV = ft_env.STANDBY  # set by the launcher on attempts that may use a standby: the interpreter it runs
PRELOAD_ENV = ft_env.STANDBY_PRELOAD  # extra modules the standby imports (comma separated)
# torch._dynamo: FSDP2's first fully_shard imports it (through torch._disable_dynamo): 0.5 s and 28 MB on an idle
# core, 3.7 s with 8 ranks starting on this lab's 2 cores, the largest part of a warm rank's start.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch._dynamo",
           "slurm_ft.train.checkpoint", "slurm_ft.train.heartbeat")
MAX_MESSAGE = 1 << 20  # a request (the environment) or a reply, in bytes
ASK_TIMEOUT_S = 2.0  # how long a standby waits for a request's bytes, and the wrapper to connect
READY_TIMEOUT_S = 120.0  # how long the wrapper waits for the pid
REFILL_AFTER_S = 30.0  # a served rank runs this long before its keeper starts the next spare
_IGNORED = (signal.SIGUSR1, signal.SIGHUP)  # step-wide signals meant for the ranks, not for us
STOP_SIGNAL = signal.SIGUSR2  # the launcher's "stop": srun passes it on (its SIGTERM is SIGKILL to the tasks)
_busy: list[int] = []  # the rank being served; a stop waits for it
_stopping: list[bool] = []


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """What the wrapper hands over: the command (``python script.py ...`` / ``python -m mod ...``), where, how."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str


def address(job: str, node: str, slot: str) -> bytes:
    """The abstract unix socket name of a slot's standby (no file: nothing to clean, nothing on shared disks)."""
    return f"\0slurm-ft-standby/{job}/{node}/{slot}".encode()


def slot_address(environ: Mapping[str, str]) -> bytes | None:
    """This task's slot address from Slurm's variables, or None outside a Slurm step."""
    job, node, slot = (environ.get(k, "") for k in ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_LOCALID"))
    return address(job, node, slot) if job and node and slot.isdigit() else None


def script_of(argv: Sequence[str], python: str) -> tuple[str, str] | None:
    """``("path", script)`` or ``("module", name)`` when ``argv`` runs ``python`` on a script or module with no
    interpreter options; None for any other command (it starts cold)."""
    if len(argv) < 2 or argv[0] != python:
        return None
    if argv[1] == "-m" and len(argv) >= 3 and argv[2] and not argv[2].startswith("-"):
        return "module", argv[2]
    if argv[1].startswith("-"):
        return None
    return "path", argv[1]


# --- messages: one JSON line each way; the request carries the three descriptors -----------------------------
def send_message(conn: socket.socket, message: Mapping[str, object], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        sent = socket.send_fds(conn, [data[:1]], list(fds))
        data = data[sent:]
    conn.sendall(data)


def recv_message(conn: socket.socket, want_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the descriptors sent with it; ``(None, fds)`` at end of stream or on a malformed one."""
    fds: list[int] = []
    buf = b""
    if want_fds:
        data, fds, _, _ = socket.recv_fds(conn, 65536, want_fds)
        buf = data
        if not data:
            return None, fds
    while not buf.endswith(b"\n"):
        if len(buf) > MAX_MESSAGE:
            return None, fds
        chunk = conn.recv(65536)
        if not chunk:
            return None, fds
        buf += chunk
    try:
        message = json.loads(buf)
    except ValueError:
        return None, fds
    return (message if isinstance(message, dict) else None), fds


def peer_uid(conn: socket.socket) -> int:
    pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", pid_uid_gid)[1]


def parse_request(message: Mapping[str, object] | None, python: str) -> Request | str:
    """The request in ``message``, or why it is refused (one line)."""
    if message is None:
        return "malformed request"
    argv, env, cwd = message.get("argv"), message.get("env"), message.get("cwd")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return "argv must be a list of strings"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env must map strings to strings"
    if not isinstance(cwd, str) or not cwd:
        return "cwd must be a path"
    if script_of(argv, python) is None:
        return f"not `{python} SCRIPT` or `{python} -m MODULE`: {' '.join(argv)[:200]}"
    return Request(argv=tuple(argv), env=dict(env), cwd=cwd)


# --- the standby's side: a keeper (no torch) and its spare (a fresh interpreter that imported it) ---------------
@dataclasses.dataclass(frozen=True, slots=True)
class StandbyConfig:
    """One warm standby keeper: its slot's socket and the spare it keeps."""

    python: str
    """The interpreter path the launcher started it with: requests must name the same, spares run it."""
    listen: bytes
    """The keeper's socket address."""
    preload: tuple[str, ...] = PRELOAD
    """Modules a spare imports before it waits."""
    refill_after_s: float = REFILL_AFTER_S
    """How long a rank runs before its keeper starts the next spare (sooner, the spare's imports would compete with the
    restarted ranks' own start; a rank that ends sooner gets its successor at once)."""

    def __post_init__(self) -> None:
        if not self.refill_after_s >= 0:
            raise ValueError(f"refill_after_s must be >= 0, got {self.refill_after_s!r}")


class Spare:
    """A fresh interpreter started by the keeper, in a process group of its own: it imports the preload, waits
    for one rank's request on its end of a socket pair, and becomes that rank (``spare_main``)."""

    def __init__(self, config: StandbyConfig) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.proc = subprocess.Popen(
                [config.python, "-m", "slurm_ft.launch.standby", "--python", config.python,
                 "--preload", ",".join(config.preload), "--spare", str(theirs.fileno()),
                 "--keeper", str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, process_group=0)
        self.conn = ours

    def hand_over(self, request: Request, fds: Sequence[int]) -> bool:
        """Send it the rank's request and descriptors; False when it is gone."""
        try:
            if self.proc.poll() is not None:
                return False
            send_message(self.conn, {"argv": list(request.argv), "env": dict(request.env), "cwd": request.cwd}, fds)
            return True
        except OSError:
            return False
        finally:
            self.conn.close()

    def discard(self) -> None:
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_spare: list[Spare] = []  # the keeper's spare, waiting for the next restart (at most one)


def serve(config: StandbyConfig, *, oom_kills: Callable[[], int | None]) -> None:
    """Keep a spare and serve requests one at a time, until the stop signal."""
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, _stop)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(config.listen)
    listener.listen(8)
    _refill(config)
    while True:
        conn, _ = listener.accept()
        try:
            _handle(conn, config, oom_kills)
        except OSError as exc:  # one broken wrapper must not take the standby down
            print(f"slurm-ft standby: request failed: {exc}", file=sys.stderr)
        conn.close()
        if _stopping:
            _quit()
        _refill(config)


def _refill(config: StandbyConfig) -> None:
    """A spare for the next request, unless one waits (a dead one is replaced)."""
    if _spare and _spare[0].proc.poll() is not None:
        _spare.pop().discard()
    if not _spare and not _stopping:
        try:
            _spare.append(Spare(config))
        except OSError as exc:  # no spare: the next restart starts cold
            print(f"slurm-ft standby: cannot start a spare: {exc}", file=sys.stderr)


def preload(modules: Sequence[str]) -> None:
    """Import ``modules``. At normal priority: at idle priority (tried: SCHED_IDLE) a node whose data loaders
    keep the CPUs busy would never finish, and a restart during warm-up would start cold beside it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing optional module: a colder restart, not a failed standby
            print(f"slurm-ft standby: cannot preload {name}: {exc}", file=sys.stderr)


def _stop(signum: int, frame: object) -> None:
    """Exit quietly when idle; while a rank runs (a step-wide SIGUSR2 of the user's), after it ends."""
    if not _busy:
        _quit()
    _stopping.append(True)


def _quit() -> None:
    for spare in _spare:
        spare.proc.kill()
    os._exit(0)


def _handle(conn: socket.socket, config: StandbyConfig, oom_kills: Callable[[], int | None]) -> None:
    conn.settimeout(ASK_TIMEOUT_S)
    message, fds = recv_message(conn, want_fds=3)
    try:
        if peer_uid(conn) != os.getuid():
            send_message(conn, {"refused": "another user"})
            return
        request = parse_request(message, config.python)
        if isinstance(request, str) or len(fds) != 3:
            send_message(conn, {"refused": request if isinstance(request, str) else "stdin, stdout, stderr needed"})
            return
        _refill(config)
        if not _spare:
            send_message(conn, {"refused": "no spare process"})
            return
        spare = _spare.pop()
        before = oom_kills()
        if not spare.hand_over(request, fds):  # it died waiting: the next request gets a new one
            spare.discard()
            send_message(conn, {"refused": "the spare process is gone"})
            return
    finally:
        for fd in fds:
            os.close(fd)
    _busy.append(spare.proc.pid)
    try:
        conn.settimeout(None)
        send_message(conn, {"pid": spare.proc.pid})
        code = _relay(conn, spare.proc, refill=lambda: _refill(config), refill_after_s=config.refill_after_s)
    finally:
        _busy.clear()
    try:  # the cgroup's counter around the rank: the wrapper's end record takes the difference
        send_message(conn, {"exit": code, "oom_before": before, "oom_after": oom_kills()})
    except OSError:
        pass  # the wrapper is gone: nobody to tell


def _relay(conn: socket.socket, rank: subprocess.Popen, *, refill: Callable[[], None], refill_after_s: float) -> int:
    """Pass the wrapper's signals to the rank until it ends; kill it when the wrapper goes away; start the next
    spare once the rank has run ``refill_after_s``. Its status as Popen's returncode (-N: signal N)."""
    refill_at = time.monotonic() + refill_after_s
    try:
        while True:
            code = rank.poll()
            if code is not None:
                return code
            if time.monotonic() >= refill_at:
                refill()
                refill_at = float("inf")
            readable, _, _ = select.select([conn], [], [], 0.05)
            if not readable:
                continue
            message, _ = recv_message(conn)
            if message is None:  # the wrapper died (its step was killed): the rank goes with it
                _kill(rank.pid, signal.SIGKILL)
                return rank.wait()
            sig = message.get("signal")
            if isinstance(sig, int) and 0 < sig < signal.NSIG:
                _kill(rank.pid, sig)
    finally:
        _kill(rank.pid, signal.SIGKILL)  # what the rank left behind, as Slurm does at the end of a step


# --- the spare's side ------------------------------------------------------------------------------------------
def spare_main(fd: int, keeper: int, python: str, modules: Sequence[str]) -> Request | None:
    """In the spare: import ``modules``, then take the rank's request from the keeper (socket ``fd``) with its
    stdio, environment and directory. None when the keeper went away first."""
    _die_with(keeper)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, lambda signum, frame: os._exit(0))  # idle: a stop ends us quietly
    conn = socket.socket(fileno=fd)
    preload(modules)
    message, fds = recv_message(conn, want_fds=3)
    conn.close()
    request = parse_request(message, python)
    if isinstance(request, str) or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    _take_over(fds, request)
    return request


def _take_over(fds: Sequence[int], request: Request) -> None:
    """The wrapper's stdio, environment and directory; default signal handling as a fresh python."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in (*_IGNORED, STOP_SIGNAL):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)


def _die_with(keeper: int) -> None:
    """SIGKILL this process when its keeper (the rank's relay to the wrapper) dies: the wrapper then records the
    rank as killed, and nothing runs on unseen. Best effort: Linux's PR_SET_PDEATHSIG."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() != keeper:  # the keeper died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    """``sig`` to the rank's process group (the rank and what it started)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_rank(request: Request) -> None:
    """Run the request's script or module as ``__main__``, as ``python`` itself would (sys.argv, sys.path[0])."""
    kind, target = script_of(request.argv, request.argv[0]) or ("", "")
    if kind == "module":
        sys.argv = [target, *request.argv[3:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(request.argv[1:])
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


# --- the wrapper's side -----------------------------------------------------------------------------------------
class Remote:
    """A rank run by a standby: its pid, its signals, its end (Popen's returncode) and the OOM killer's counter
    of the standby's cgroup before and after it ran (None: not readable)."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.oom_counts: tuple[int | None, int | None] = (None, None)

    def send_signal(self, sig: int) -> None:
        try:
            send_message(self.conn, {"signal": int(sig)})
        except OSError:
            pass

    def wait(self) -> int:
        """Its status; a standby gone without saying is the rank killed with it (``_die_with_parent``)."""
        while True:
            try:
                message, _ = recv_message(self.conn)
                break
            except InterruptedError:
                continue
            except OSError:  # reset by a standby that died
                message = None
                break
        self.conn.close()
        if message is None or not isinstance(message.get("exit"), int):
            return -signal.SIGKILL
        self.oom_counts = tuple(v if isinstance(v, int) else None
                                for v in (message.get("oom_before"), message.get("oom_after")))
        return message["exit"]


def ask(command: Sequence[str], environ: Mapping[str, str], stderr_fd: int, *, cwd: str | None = None) -> Remote | str:
    """Have this slot's standby run ``command``: the running rank, or why not (the caller starts it cold)."""
    python = environ.get(ENV, "")
    where = slot_address(environ)
    if not python or where is None:
        return "no standby for this attempt"
    if script_of(command, python) is None:
        return "the command is not the standby's interpreter on a script or module"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ASK_TIMEOUT_S)
    try:
        conn.connect(where)
        if peer_uid(conn) != os.getuid():  # someone else took the name: they get neither environment nor stdio
            conn.close()
            return "the standby's address is held by another user"
        send_message(conn, {"argv": list(command), "env": dict(environ), "cwd": cwd or os.getcwd()},
                     fds=(0, 1, stderr_fd))
        conn.settimeout(READY_TIMEOUT_S)
        reply, _ = recv_message(conn)
    except OSError as exc:
        conn.close()
        return f"standby not reachable ({exc.strerror or exc})"
    if reply is None or not isinstance(reply.get("pid"), int):
        conn.close()
        return f"standby refused: {(reply or {}).get('refused', 'no reply')}"
    conn.settimeout(None)
    return Remote(conn, reply["pid"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.launch.standby", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the interpreter path the ranks' command names")
    parser.add_argument("--preload", default=",".join(PRELOAD),
                        help=f"modules to import while waiting, comma separated (default: {','.join(PRELOAD)}), "
                             f"plus ${PRELOAD_ENV}")
    parser.add_argument("--refill-after", type=float, default=REFILL_AFTER_S, metavar="SECONDS",
                        help=f"start the next spare once a rank has run this long (default {REFILL_AFTER_S:g})")
    parser.add_argument("--spare", type=int, metavar="FD", help=argparse.SUPPRESS)  # the keeper's spare
    parser.add_argument("--keeper", type=int, metavar="PID", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    extra = "" if args.spare is not None else os.environ.get(PRELOAD_ENV, "")
    preload = tuple(m.strip() for m in f"{args.preload},{extra}".split(",") if m.strip())
    if args.spare is not None:
        request = spare_main(args.spare, args.keeper or os.getppid(), args.python, preload)
        if request is not None:
            run_rank(request)
        return 0
    return keep(args.python, preload, args.refill_after)


def keep(python: str, preload: Sequence[str], refill_after_s: float) -> int:
    """The keeper of this task's slot: serve until stopped; 1 (with the reason) when it cannot."""
    where = slot_address(os.environ)
    if where is None:
        print("slurm-ft standby: not in a Slurm step (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_LOCALID)", file=sys.stderr)
        return 2
    try:
        config = StandbyConfig(python=python, listen=where, preload=tuple(preload), refill_after_s=refill_after_s)
    except ValueError as exc:
        print(f"slurm-ft standby: {exc}", file=sys.stderr)
        return 2
    try:
        serve(config, oom_kills=oom_kills)
    except OSError as exc:  # the slot's address is taken (a standby already serves it)
        print(f"slurm-ft standby: cannot listen on {where[1:].decode()}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
