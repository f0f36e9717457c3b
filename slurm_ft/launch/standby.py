"""Warm standby ranks: a rank restarted in the allocation starts in an interpreter that has already imported torch.

Restarting a rank cold costs the interpreter and the torch import (seconds per rank, and on a busy node all ranks
import at once). The launcher (``slurm_ft.launch.launcher``) therefore starts, once the first attempt trains, one
standby per task slot (node, local task id) in a step of its own (``srun --overlap``): ``python -m
slurm_ft.launch.standby``. Each is a keeper that never imports torch: it listens on an abstract unix socket named by
a random key the launcher draws for the job and gives only to its own steps (``$SLURM_FT_STANDBY_KEY``), the node
and the slot (``address``), and keeps one spare, a fresh interpreter of its own (``Spare``) that imports the
preload modules and waits.

On a restart, the per-rank wrapper of the new step (``slurm_ft.launch.rank``) asks its slot's keeper for the rank
(``ask``). The exchange, one JSON line each (the first carries the descriptors, SCM_RIGHTS):

=========  ===================  ==========================================================================
from       message              meaning
=========  ===================  ==========================================================================
wrapper    request + 3 fds      ``{argv, env, cwd, deadline}``: the command, stdin, stdout, a stderr pipe;
                                ``deadline`` on CLOCK_MONOTONIC (node-wide): later, nothing may start
keeper     ``{"pid": N}``       the spare holds the request, but runs nothing yet
wrapper    ``{"go": true}``     the wrapper is still there and will not start the rank cold
keeper     (to the spare)       ``{"run": true}``: only now does the spare become the rank
wrapper    ``{"signal": S}``    a signal the step got, for the rank (any number of them)
keeper     ``{"exit", ...}``    how the rank ended: Popen's code, the cgroup's OOM kills before and after
keeper     ``{"refused": why}`` instead of the pid: the wrapper starts the rank cold
=========  ===================  ==========================================================================

The rule: a rank runs from a standby only after the wrapper's ``go``, and a wrapper that sent ``go`` never starts
it cold, so exactly one copy runs. A wrapper gone before ``go`` (its deadline passed, it was killed) leaves a spare
that is killed and reaped, never run. The keeper relays the wrapper's signals to the rank, kills the rank if the
wrapper goes away (the step was killed), and reports how it ended. It starts the next spare once the rank has run
``refill_after_s`` (or has ended).

Why a spare and not a fork of a warm parent (the first design): a process that imported torch is not safe to
fork. On a loaded host a forked rank's first CPU GEMM now and then spun forever in MKL's memory accounting
(``mkl_serv_allocate``), and CUDA, OpenMP and NCCL state do not survive a fork either. A spare is a process like
a cold rank, started early.

Trust: only a process of the keeper's own uid may ask. The keeper reads the peer's uid (SO_PEERCRED) right after
``accept`` and closes another uid's connection unread; it reads each request in a thread of its own with one
deadline for the whole request (``ASK_TIMEOUT_S``), so no connection holds up another, and a request that finds
the slot busy (a rank runs there) is refused at once. The wrapper sends nothing to a keeper of another uid
(SO_PEERCRED on its side: the environment may hold the user's secrets), and the random key means nobody can bind a
slot's name before the keeper (the name shows in /proc/net/unix only once it is the keeper's). Anything else (no
standby on the slot, a busy or gone one, another interpreter, a command of another shape) and the wrapper starts
the rank cold, as before: a standby can make a restart faster, never make one fail.

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
import queue
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_ft.core import env as ft_env
from slurm_ft.health.cgroup import oom_kills

ENV = ft_env.STANDBY  # set by the launcher on attempts that may use a standby: the interpreter it runs
KEY_ENV = ft_env.STANDBY_KEY  # set by the launcher for its own steps: the random part of the slots' socket names
PRELOAD_ENV = ft_env.STANDBY_PRELOAD  # extra modules the standby imports (comma separated)
# torch._dynamo: FSDP2's first fully_shard imports it (through torch._disable_dynamo): 0.5 s and 28 MB on an idle
# core, 3.7 s with 8 ranks starting on this lab's 2 cores, the largest part of a warm rank's start.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch._dynamo",
           "slurm_ft.train.checkpoint", "slurm_ft.train.heartbeat")
MAX_MESSAGE = 1 << 20  # a request (the environment) or a reply, in bytes
ASK_TIMEOUT_S = 2.0  # the whole request's bytes must come this soon after accept; the wrapper's connect, too
READY_TIMEOUT_S = 5.0  # the wrapper's deadline for the pid: the keeper answers at once (the spare imports later)
GO_GRACE_S = 2.0  # how long past the request's deadline the keeper waits for the wrapper's go
MAX_DEADLINE_S = 60.0  # a request's deadline further ahead than this is cut to it
MAX_READERS = 32  # requests read at once; more connections are refused unread
KEY_MIN_CHARS = 16  # a key shorter than this is no key (the launcher draws 32 hex digits)
REFILL_AFTER_S = 30.0  # a served rank runs this long before its keeper starts the next spare
_IGNORED = (signal.SIGUSR1, signal.SIGHUP)  # step-wide signals meant for the ranks, not for us
STOP_SIGNAL = signal.SIGUSR2  # the launcher's "stop": srun passes it on (its SIGTERM is SIGKILL to the tasks)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """What the wrapper hands over: the command (``python script.py ...`` / ``python -m mod ...``), where, how, and
    the moment after which nothing may start (``deadline``, CLOCK_MONOTONIC; None in the keeper's hand-over to its
    spare)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    deadline: float | None = None


def address(key: str, node: str, slot: str) -> bytes:
    """The abstract unix socket name of a slot's standby (no file: nothing to clean, nothing on shared disks)."""
    return f"\0slurm-ft-standby/{key}/{node}/{slot}".encode()


def slot_address(environ: Mapping[str, str]) -> bytes | None:
    """This task's slot address from the launcher's key and Slurm's variables, or None (no key: no standby)."""
    key, node, slot = (environ.get(k, "") for k in (KEY_ENV, "SLURMD_NODENAME", "SLURM_LOCALID"))
    if len(key) < KEY_MIN_CHARS or not key.isalnum() or not node or "/" in node or not slot.isdigit():
        return None
    return address(key, node, slot)


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


class Channel:
    """One end of a stream socket that carries JSON lines: what one ``recv`` read past a line waits for the next."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: Mapping[str, object], fds: Sequence[int] = (), *, deadline: float | None = None) -> None:
        """Send ``message`` (and ``fds`` with its first byte); TimeoutError when it is not out by ``deadline``."""
        self.sock.settimeout(_left(deadline))
        send_message(self.sock, message, fds)

    def recv(self, deadline: float | None = None, want_fds: int = 0) -> tuple[dict | None, list[int]]:
        """The next message and the descriptors sent with it; ``(None, fds)`` at end of stream or on a malformed or
        oversized one; TimeoutError when the whole line is not there by ``deadline`` (CLOCK_MONOTONIC; the
        descriptors already received are closed)."""
        fds: list[int] = []
        try:
            while b"\n" not in self._buffer:
                if len(self._buffer) > MAX_MESSAGE:
                    return None, fds
                self.sock.settimeout(_left(deadline))
                if want_fds and not fds:
                    data, fds, _, _ = socket.recv_fds(self.sock, 65536, want_fds)
                else:
                    data = self.sock.recv(65536)
                if not data:
                    return None, fds
                self._buffer += data
        except OSError:
            close_all(fds)
            raise
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            return None, fds
        return (message if isinstance(message, dict) else None), fds

    def pending(self) -> bool:
        """Whether a whole message already waits in the buffer (the socket may show nothing more to read)."""
        return b"\n" in self._buffer

    def close(self) -> None:
        self.sock.close()


def _left(deadline: float | None) -> float | None:
    """A socket timeout for ``deadline``: None (block) without one; TimeoutError once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            continue


def peer_uid(conn: socket.socket) -> int:
    pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", pid_uid_gid)[1]


def parse_request(message: Mapping[str, object] | None, python: str) -> Request | str:
    """The request in ``message``, or why it is refused (one line)."""
    if message is None:
        return "malformed request"
    argv, env, cwd, deadline = (message.get(k) for k in ("argv", "env", "cwd", "deadline"))
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return "argv must be a list of strings"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env must map strings to strings"
    if not isinstance(cwd, str) or not cwd:
        return "cwd must be a path"
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))):
        return "deadline must be a number (CLOCK_MONOTONIC seconds)"
    if script_of(argv, python) is None:
        return f"not `{python} SCRIPT` or `{python} -m MODULE`: {' '.join(argv)[:200]}"
    return Request(argv=tuple(argv), env=dict(env), cwd=cwd, deadline=None if deadline is None else float(deadline))


def refusal(request: Request | str, fds: Sequence[int], now: float) -> str:
    """Why the keeper will not take ``request`` (with ``fds``) at ``now``; "" when it will."""
    if isinstance(request, str):
        return request
    if len(fds) != 3:
        return "stdin, stdout, stderr needed"
    if request.deadline is None:
        return "no deadline"
    if request.deadline <= now:
        return "too late: the request's deadline has passed"
    return ""


# --- the standby's side: a keeper (no torch) and its spare (a fresh interpreter that imported it) ---------------
@dataclasses.dataclass(frozen=True, slots=True)
class StandbyConfig:
    """One warm standby keeper: its slot's socket and the spare it keeps."""

    python: str
    """The interpreter path the launcher started it with: requests must name the same, spares run it."""
    listen: bytes
    """The keeper's socket address (``address``: the launcher's key, the node, the slot)."""
    preload: tuple[str, ...] = PRELOAD
    """Modules a spare imports before it waits."""
    refill_after_s: float = REFILL_AFTER_S
    """How long a rank runs before its keeper starts the next spare (sooner, the spare's imports would compete with the
    restarted ranks' own start; a rank that ends sooner gets its successor at once)."""

    def __post_init__(self) -> None:
        if not self.refill_after_s >= 0:
            raise ValueError(f"refill_after_s must be >= 0, got {self.refill_after_s!r}")


class Spare:
    """A fresh interpreter started by the keeper, in a process group of its own: it imports the preload, takes one
    rank's request on its end of a socket pair (``hand_over``), and becomes that rank only when told (``run``)."""

    def __init__(self, config: StandbyConfig) -> None:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)  # a request fits while the spare imports
        with theirs:
            self.proc = subprocess.Popen(
                [config.python, "-m", "slurm_ft.launch.standby", "--python", config.python,
                 "--preload", ",".join(config.preload), "--spare", str(theirs.fileno()),
                 "--keeper", str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, process_group=0)
        self.chan = Channel(ours)

    def hand_over(self, request: Request, fds: Sequence[int], deadline: float) -> bool:
        """Send it the rank's request and descriptors (it runs nothing yet); False when it is gone or the request
        is not out by ``deadline`` (a spare that takes only part of it runs nothing)."""
        if self.proc.poll() is not None:
            return False
        try:
            self.chan.send({"argv": list(request.argv), "env": dict(request.env), "cwd": request.cwd}, fds,
                           deadline=deadline)
        except OSError:
            return False
        return True

    def run(self) -> None:
        """Let it become the rank it holds; a spare that died meanwhile shows in its exit code."""
        try:
            self.chan.send({"run": True}, deadline=time.monotonic() + ASK_TIMEOUT_S)
        except OSError:
            _kill(self.proc.pid, signal.SIGKILL)
        self.chan.close()

    def discard(self) -> None:
        """Kill it with what it started, and reap it."""
        self.chan.close()
        _kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Spawner:
    """Starts the spares from one thread that lives as long as the keeper: Linux sends a child's parent-death
    signal (``_die_with``) when the *thread* that started it ends, so a spare started by a request's thread would
    die with that thread."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="slurm-ft-spawner", daemon=True).start()

    def start(self, config: StandbyConfig) -> Spare:
        done: queue.Queue = queue.Queue(maxsize=1)
        self._jobs.put((config, done))
        spare = done.get()
        if isinstance(spare, OSError):
            raise spare
        return spare

    def _loop(self) -> None:
        while True:
            config, done = self._jobs.get()
            try:
                done.put(Spare(config))
            except OSError as exc:
                done.put(exc)


class Keeper:
    """A slot's keeper: accepts on the main thread (another uid's connection is closed unread), reads and answers
    each request on a thread of its own, and serves one rank at a time (``slot``) from its spare."""

    def __init__(self, config: StandbyConfig, oom_kills: Callable[[], int | None]) -> None:
        self.config, self.oom_kills = config, oom_kills
        self.slot = threading.Lock()  # held from a request's hand-over until its rank has ended
        self.readers = threading.BoundedSemaphore(MAX_READERS)
        self.spare: Spare | None = None  # the next rank's interpreter (touched only by the slot's holder)
        self.held: Spare | None = None  # a spare holding a request, waiting for the wrapper's go
        self.running: subprocess.Popen | None = None  # the rank being served: a stop waits for it
        self.stopping = False
        self.spawner = Spawner()

    def serve(self) -> None:
        """Keep a spare and serve requests, until the stop signal. OSError when the address is taken."""
        for sig in _IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(STOP_SIGNAL, self._stop)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.config.listen)
        listener.listen(64)
        with self.slot:
            self.refill()
        while True:
            conn, _ = listener.accept()
            self.admit(conn, time.monotonic())

    def admit(self, conn: socket.socket, accepted: float) -> None:
        """Close another uid's connection before reading a byte; read and answer ours on a thread of its own."""
        try:
            ours = peer_uid(conn) == os.getuid()
        except OSError:
            ours = False
        if not ours or not self.readers.acquire(blocking=False):
            conn.close()
            return
        threading.Thread(target=self.answer, args=(Channel(conn), accepted), daemon=True).start()

    def answer(self, chan: Channel, accepted: float) -> None:
        """One request, from its first byte to its rank's end; nothing here takes the keeper down."""
        try:
            message, fds = chan.recv(accepted + ASK_TIMEOUT_S, want_fds=3)
        except OSError as exc:  # the whole request did not come in time, or the connection broke
            self.readers.release()
            chan.close()
            print(f"slurm-ft standby: request not read: {exc}", file=sys.stderr)
            return
        self.readers.release()
        try:
            self._answer(chan, parse_request(message, self.config.python), fds, accepted)
        except OSError as exc:  # one broken wrapper must not take the standby down
            print(f"slurm-ft standby: request failed: {exc}", file=sys.stderr)
        finally:
            close_all(fds)
            chan.close()
        if self.stopping and self.running is None:
            self.quit()

    def _answer(self, chan: Channel, request: Request | str, fds: list[int], accepted: float) -> None:
        why = refusal(request, fds, time.monotonic())
        if why:
            chan.send({"refused": why}, deadline=time.monotonic() + ASK_TIMEOUT_S)
            return
        deadline = min(request.deadline, accepted + MAX_DEADLINE_S)
        # a rank runs (or will not die: D state after an Xid): busy at once; a hand-over ends by its own deadline
        if self.running is not None or not self.slot.acquire(timeout=max(0.0, deadline - time.monotonic())):
            chan.send({"refused": "busy: the slot still serves a rank"}, deadline=time.monotonic() + ASK_TIMEOUT_S)
            return
        try:
            self._serve(chan, request, fds, deadline)
        finally:
            self.refill()
            self.slot.release()

    def _serve(self, chan: Channel, request: Request, fds: list[int], deadline: float) -> None:
        """Under the slot: hand the request to the spare, tell the wrapper its pid, and run it on the wrapper's go."""
        self.refill()
        spare, self.spare = self.spare, None
        why = "no spare process" if spare is None else _hand_over(spare, request, fds, deadline)
        if why:
            chan.send({"refused": why}, deadline=time.monotonic() + ASK_TIMEOUT_S)
            return
        self.held = spare
        before = self.oom_kills()
        try:
            chan.send({"pid": spare.proc.pid}, deadline=deadline + GO_GRACE_S)
            go, _ = chan.recv(deadline + GO_GRACE_S)
        except OSError:
            go = None
        if not (isinstance(go, dict) and go.get("go") is True):  # the wrapper is gone: the rank never runs
            self.held = None
            spare.discard()
            return
        self.running, self.held = spare.proc, None
        spare.run()
        try:
            code = _relay(chan, spare.proc, refill=self.refill, refill_after_s=self.config.refill_after_s)
        finally:
            self.running = None
        try:  # the cgroup's counter around the rank: the wrapper's end record takes the difference
            chan.send({"exit": code, "oom_before": before, "oom_after": self.oom_kills()},
                      deadline=time.monotonic() + ASK_TIMEOUT_S)
        except OSError:
            return  # the wrapper is gone: nobody to tell

    def refill(self) -> None:
        """A spare for the next request, unless one waits (a dead one is replaced). Only the slot's holder calls."""
        if self.spare is not None and self.spare.proc.poll() is not None:
            spare, self.spare = self.spare, None
            spare.discard()
        if self.spare is None and not self.stopping:
            try:
                self.spare = self.spawner.start(self.config)
            except OSError as exc:  # no spare: the next restart starts cold
                print(f"slurm-ft standby: cannot start a spare: {exc}", file=sys.stderr)

    def _stop(self, signum: int, frame: object) -> None:
        """Exit quietly when no rank runs; while one runs (a step-wide SIGUSR2 of the user's), after it ends."""
        self.stopping = True
        if self.running is None:
            self.quit()

    def quit(self) -> None:
        """Kill the spares (idle or holding a request that never ran) and exit."""
        for spare in (self.spare, self.held):
            if spare is not None:
                _kill(spare.proc.pid, signal.SIGKILL)
        os._exit(0)


def _hand_over(spare: Spare, request: Request, fds: Sequence[int], deadline: float) -> str:
    """Give ``spare`` the request by ``deadline``: "" when it holds it, else why not (the spare is discarded)."""
    if time.monotonic() < deadline and spare.hand_over(request, fds, deadline):
        return ""
    late = time.monotonic() >= deadline
    spare.discard()
    return "too late: the request's deadline has passed" if late else "the spare process is gone or stuck"


def serve(config: StandbyConfig, *, oom_kills: Callable[[], int | None]) -> None:
    """Keep a spare and serve requests until the stop signal (``Keeper``)."""
    Keeper(config, oom_kills).serve()


def preload(modules: Sequence[str]) -> None:
    """Import ``modules``. At normal priority: at idle priority (tried: SCHED_IDLE) a node whose data loaders
    keep the CPUs busy would never finish, and a restart during warm-up would start cold beside it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing optional module: a colder restart, not a failed standby
            print(f"slurm-ft standby: cannot preload {name}: {exc}", file=sys.stderr)


def _relay(chan: Channel, rank: subprocess.Popen, *, refill: Callable[[], None], refill_after_s: float) -> int:
    """Pass the wrapper's signals to the rank until it ends; kill it when the wrapper goes away; start the next
    spare once the rank has run ``refill_after_s``. Its status as Popen's returncode (-N: signal N); the rank is
    reaped whatever happens."""
    refill_at = time.monotonic() + refill_after_s
    try:
        while True:
            code = rank.poll()
            if code is not None:
                return code
            if time.monotonic() >= refill_at:
                refill()
                refill_at = float("inf")
            if not chan.pending() and not select.select([chan.sock], [], [], 0.05)[0]:
                continue
            message, _ = chan.recv(time.monotonic() + ASK_TIMEOUT_S)
            if message is None:  # the wrapper died (its step was killed): the rank goes with it
                _kill(rank.pid, signal.SIGKILL)
                return rank.wait()
            sig = message.get("signal")
            if isinstance(sig, int) and 0 < sig < signal.NSIG:
                _kill(rank.pid, sig)
    finally:
        _kill(rank.pid, signal.SIGKILL)  # what the rank left behind, as Slurm does at the end of a step
        rank.wait()


# --- the spare's side ------------------------------------------------------------------------------------------
def spare_main(fd: int, keeper: int, python: str, modules: Sequence[str]) -> Request | None:
    """In the spare: import ``modules``, take the rank's request from the keeper (socket ``fd``), and, once the
    keeper says run, its stdio, environment and directory. None when the keeper went away or never said run."""
    _die_with(keeper)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, lambda signum, frame: os._exit(0))  # idle: a stop ends us quietly
    chan = Channel(socket.socket(fileno=fd))
    preload(modules)
    message, fds, go = None, [], None
    try:
        message, fds = chan.recv(want_fds=3)
        if message is not None:
            go, _ = chan.recv()  # {"run": true} once the wrapper said go; the keeper kills us otherwise
    except OSError:
        pass
    chan.close()
    request = parse_request(message, python)
    if isinstance(request, str) or len(fds) != 3 or not (isinstance(go, dict) and go.get("run") is True):
        close_all(fds)
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

    def __init__(self, chan: Channel, pid: int) -> None:
        self.chan, self.pid = chan, pid
        self.oom_counts: tuple[int | None, int | None] = (None, None)

    def send_signal(self, sig: int) -> None:
        try:
            self.chan.send({"signal": int(sig)})
        except OSError:
            pass

    def wait(self) -> int:
        """Its status; a standby gone without saying is the rank killed with it (``_die_with``)."""
        while True:
            try:
                message, _ = self.chan.recv()
                break
            except InterruptedError:
                continue
            except OSError:  # reset by a standby that died
                message = None
                break
        self.chan.close()
        if message is None or not isinstance(message.get("exit"), int):
            return -signal.SIGKILL
        self.oom_counts = tuple(v if isinstance(v, int) else None
                                for v in (message.get("oom_before"), message.get("oom_after")))
        return message["exit"]


def ask(command: Sequence[str], environ: Mapping[str, str], stderr_fd: int, *, cwd: str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S) -> Remote | str:
    """Have this slot's standby run ``command``: the running rank, or why not (the caller starts it cold). Once
    this returns a Remote, the rank is the standby's: the caller must not start it cold too."""
    python = environ.get(ENV, "")
    where = slot_address(environ)
    if not python or where is None:
        return "no standby for this attempt"
    if script_of(command, python) is None:
        return "the command is not the standby's interpreter on a script or module"
    deadline = time.monotonic() + ready_timeout_s
    chan = Channel(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        chan.sock.settimeout(ASK_TIMEOUT_S)
        chan.sock.connect(where)
        if peer_uid(chan.sock) != os.getuid():  # someone else took the name: they get neither environment nor stdio
            chan.close()
            return "the standby's address is held by another user"
        chan.send({"argv": list(command), "env": dict(environ), "cwd": cwd or os.getcwd(), "deadline": deadline},
                  fds=(0, 1, stderr_fd), deadline=deadline)
        reply, _ = chan.recv(deadline)
        if reply is not None and isinstance(reply.get("pid"), int):
            chan.send({"go": True}, deadline=deadline + GO_GRACE_S)  # from here on the rank is the standby's
            return Remote(chan, reply["pid"])
    except OSError as exc:
        chan.close()
        return f"standby not reachable ({exc.strerror or exc})"
    chan.close()
    return f"standby refused: {(reply or {}).get('refused', 'no reply')}"


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
        print(f"slurm-ft standby: no slot address: needs ${KEY_ENV} (from the launcher, {KEY_MIN_CHARS}+ letters "
              f"and digits), SLURMD_NODENAME and SLURM_LOCALID", file=sys.stderr)
        return 2
    try:
        config = StandbyConfig(python=python, listen=where, preload=tuple(preload), refill_after_s=refill_after_s)
    except ValueError as exc:
        print(f"slurm-ft standby: {exc}", file=sys.stderr)
        return 2
    try:
        serve(config, oom_kills=oom_kills)
    except OSError as exc:  # the slot's address is taken (a standby already serves it)
        print(f"slurm-ft standby: cannot listen on this slot's address: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
