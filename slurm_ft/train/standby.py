"""Warm standby ranks: a rank restarted in the allocation starts from an interpreter that has already imported torch.

Restarting a rank cold costs the interpreter and the torch import (seconds per rank, and on a busy node all ranks
import at once). The launcher (``slurm_ft.launch``) therefore starts, once the first attempt trains, one standby
process per task slot (node, local task id) in a step of its own (``srun --overlap``): ``python -m
slurm_ft.train.standby``. Each listens on an abstract unix socket named by job, node and slot (``address``) and
imports the preload modules in a thread (a request before they are in waits for them: they are under way).

On a restart, the per-rank wrapper of the new step (``slurm_ft.launch_rank``) asks its slot's standby for the rank
(``ask``): it passes its stdin, stdout and a stderr pipe (SCM_RIGHTS), its environment, directory and command. The
standby forks; the fork takes all of that and runs the script or module as ``__main__`` (``python script.py ...``
or ``python -m module ...`` with the standby's own interpreter, nothing else). The standby tells the wrapper the
fork's pid, passes on the signals the wrapper gets (Slurm signals the new step's tasks: the wrappers), kills the
fork if the wrapper goes away (the step was killed), and reports how the fork ended: exit code or signal, and the
OOM killer's kills in its cgroup. The standby stays for the next restart: each fork starts from the same warm,
untouched parent.

Trust: only a process of the standby's own uid may ask, and the wrapper sends nothing to a standby of another uid
(SO_PEERCRED both ways: the environment may hold the user's secrets). Anything else (no standby on the slot, a
busy or gone one, another interpreter, a command of another shape) and the wrapper starts the rank cold, as
before: a standby can make a restart faster, never make one fail.

Limits: the fork runs in the standby step's cgroup, not the new step's (its memory and devices are the standby
step's, which overlaps the job's); environment variables read at import time (rare: most of torch's are read
lazily, ``CUDA_VISIBLE_DEVICES`` at CUDA's first use) are the standby's.
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
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from slurm_ft import env as ft_env

ENV = ft_env.STANDBY  # set by the launcher on attempts that may use a standby: the interpreter it runs
PRELOAD_ENV = ft_env.STANDBY_PRELOAD  # extra modules the standby imports (comma separated)
PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.fsdp",
           "slurm_ft.train.checkpoint", "slurm_ft.train.heartbeat")
MAX_MESSAGE = 1 << 20  # a request (the environment) or a reply, in bytes
ASK_TIMEOUT_S = 2.0  # how long a standby waits for a request's bytes, and the wrapper to connect
READY_TIMEOUT_S = 120.0  # how long the wrapper waits for the pid (a standby still importing finishes first)
_IGNORED = (signal.SIGUSR1, signal.SIGHUP)  # step-wide signals meant for the ranks, not for us
STOP_SIGNAL = signal.SIGUSR2  # the launcher's "stop": srun passes it on (its SIGTERM is SIGKILL to the tasks)
_busy: list[int] = []  # the fork being served; a stop waits for it
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


# --- the standby's side -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class StandbyConfig:
    """``python``: the interpreter path the launcher started us with (requests must name the same);
    ``listen``: our socket address; ``preload``: modules imported before waiting."""

    python: str
    listen: bytes
    preload: tuple[str, ...] = PRELOAD


def serve(config: StandbyConfig, *, oom_kills: Callable[[], int | None]) -> Request:
    """Listen, import in the background, and serve requests one at a time until one is ours to run: returns in
    the fork only."""
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, _stop)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(config.listen)
    listener.listen(8)
    warming = threading.Thread(target=preload, args=(config.preload,), name="slurm-ft-preload", daemon=True)
    warming.start()
    while True:
        conn, _ = listener.accept()
        try:
            ticket = _handle(conn, config, oom_kills, warming)
        except OSError as exc:  # one broken wrapper must not take the standby down
            print(f"slurm-ft standby: request failed: {exc}", file=sys.stderr)
            ticket = None
        if ticket is not None:  # the fork: leave the parent's sockets behind and become the rank
            listener.close()
            return ticket
        conn.close()
        if _stopping:
            os._exit(0)


def preload(modules: Sequence[str]) -> None:
    """Import ``modules``. At normal priority: at idle priority (tried: SCHED_IDLE) a node whose data loaders
    keep the CPUs busy would never finish, and a restart during warm-up would start cold beside it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing optional module: a colder restart, not a failed standby
            print(f"slurm-ft standby: cannot preload {name}: {exc}", file=sys.stderr)


def _stop(signum: int, frame: object) -> None:
    """Exit quietly when idle; while a fork runs (a step-wide SIGUSR2 of the user's), after it ends."""
    if not _busy:
        os._exit(0)
    _stopping.append(True)


def _handle(conn: socket.socket, config: StandbyConfig, oom_kills: Callable[[], int | None],
            warming: threading.Thread) -> Request | None:
    conn.settimeout(ASK_TIMEOUT_S)
    message, fds = recv_message(conn, want_fds=3)
    try:
        if peer_uid(conn) != os.getuid():
            send_message(conn, {"refused": "another user"})
            return None
        request = parse_request(message, config.python)
        if isinstance(request, str) or len(fds) != 3:
            send_message(conn, {"refused": request if isinstance(request, str) else "stdin, stdout, stderr needed"})
            return None
        warming.join()  # a restart during warm-up waits for the imports under way: sooner than starting over
        before = oom_kills()
        pid = os.fork()
        if pid == 0:
            conn.close()
            _take_over(fds, request)
            fds = []  # they are our 0, 1, 2 now
            return request
    finally:
        for fd in fds:
            os.close(fd)
    _busy.append(pid)
    try:
        conn.settimeout(None)
        send_message(conn, {"pid": pid})
        code = _relay(conn, pid)
    finally:
        _busy.clear()
    try:  # the cgroup's counter around the rank: the wrapper's end record takes the difference
        send_message(conn, {"exit": code, "oom_before": before, "oom_after": oom_kills()})
    except OSError:
        pass  # the wrapper is gone: nobody to tell
    return None


def _take_over(fds: Sequence[int], request: Request) -> None:
    """In the fork: the wrapper's stdio, environment and directory; default signal handling as a fresh python."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in (*_IGNORED, STOP_SIGNAL):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _busy.clear()
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    os.setpgid(0, 0)  # its own group: signals and the final kill reach what it starts (data loader workers ...)
    _die_with_parent()


def _die_with_parent() -> None:
    """SIGKILL this process when the standby (its relay to the wrapper) dies: the wrapper then records the rank
    as killed, and nothing runs on unseen. Best effort: Linux's PR_SET_PDEATHSIG."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the standby died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _relay(conn: socket.socket, pid: int) -> int:
    """Pass the wrapper's signals to the fork until it ends; kill it when the wrapper goes away. Its status as
    Popen's returncode (-N: signal N)."""
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            readable, _, _ = select.select([conn], [], [], 0.05)
            if not readable:
                continue
            message, _ = recv_message(conn)
            if message is None:  # the wrapper died (its step was killed): the rank goes with it
                _kill(pid, signal.SIGKILL)
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            sig = message.get("signal")
            if isinstance(sig, int) and 0 < sig < signal.NSIG:
                _kill(pid, sig)
    finally:
        _kill(pid, signal.SIGKILL)  # what the rank left behind, as Slurm does at the end of a step


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
    from slurm_ft.launch_rank import oom_kills

    parser = argparse.ArgumentParser(prog="python -m slurm_ft.train.standby", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the interpreter path the ranks' command names")
    parser.add_argument("--preload", default=",".join(PRELOAD),
                        help=f"modules to import while waiting, comma separated (default: {','.join(PRELOAD)}), "
                             f"plus ${PRELOAD_ENV}")
    args = parser.parse_args(argv)
    where = slot_address(os.environ)
    if where is None:
        print("slurm-ft standby: not in a Slurm step (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_LOCALID)", file=sys.stderr)
        return 2
    preload = tuple(m.strip() for m in f"{args.preload},{os.environ.get(PRELOAD_ENV, '')}".split(",") if m.strip())
    try:
        request = serve(StandbyConfig(python=args.python, listen=where, preload=preload), oom_kills=oom_kills)
    except OSError as exc:  # the slot's address is taken (a standby already serves it)
        print(f"slurm-ft standby: cannot listen on {where[1:].decode()}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    run_rank(request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
