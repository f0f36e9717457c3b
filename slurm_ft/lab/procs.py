"""Starting and stopping the lab's daemons by pid, checking a pid is still *our* process before signalling it."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Popen handles of daemons this process started, kept so they can be reaped (no zombies, no ResourceWarning).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Daemon:
    """One started daemon: its pid plus what identifies it (argv and kernel start time) against pid reuse."""

    name: str
    pid: int
    argv: tuple[str, ...]
    start_ticks: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "argv": list(self.argv), "start_ticks": self.start_ticks}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Daemon":
        return cls(name=str(data["name"]), pid=int(data["pid"]), argv=tuple(str(a) for a in data["argv"]),
                   start_ticks=int(data["start_ticks"]))


def spawn(name: str, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> Daemon:
    """Start ``argv`` (a foreground daemon) in its own session, stdout/stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argument list, no shell
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env), start_new_session=True, close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    ticks = _start_ticks(proc.pid)
    daemon = Daemon(name=name, pid=proc.pid, argv=tuple(argv), start_ticks=ticks if ticks is not None else -1)
    _settle(daemon)
    return daemon


def spawn_via(name: str, argv: Sequence[str], final_argv: Sequence[str], *, env: Mapping[str, str],
              log_path: Path, timeout: float = 10.0) -> Daemon:
    """Start ``argv``, a wrapper (namespace entry) that becomes or starts ``final_argv``; the Daemon is that
    process (the wrapper's pid or a descendant), so ``is_running`` and ``stop`` act on the program itself."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argument list, no shell
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env), start_new_session=True, close_fds=True, cwd="/",
        )
    _CHILDREN[proc.pid] = proc
    want = tuple(final_argv)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next((pid for pid in descendants(proc.pid) if cmdline(pid) == want), None)
        if found is not None and (ticks := _start_ticks(found)) is not None:
            return Daemon(name=name, pid=found, argv=want, start_ticks=ticks)
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    return Daemon(name=name, pid=proc.pid, argv=want, start_ticks=-1)  # not running: the caller reports it


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (by parent pid, from /proc)."""
    parents: dict[int, list[int]] = {}
    for child in all_pids():
        parents.setdefault(parent(child), []).append(child)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def pid_namespace(pid: int) -> str:
    """The PID namespace of ``pid`` (``pid:[4026532382]``; '' when gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def in_pid_namespace(namespace: str) -> list[int]:
    """Every live (not zombie) pid, as this namespace numbers them, in PID namespace ``namespace``."""
    return [pid for pid in all_pids() if namespace and pid_namespace(pid) == namespace
            and (_stat(pid) or ("Z", 0))[0] != "Z"]


def nspids(status_text: str) -> tuple[int, ...]:
    """The ``NSpid:`` line of ``/proc/PID/status``: the process's pid in each PID namespace it is in, this
    namespace's first, its own (innermost) last; () when absent."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(field) for field in line.split()[1:])
    return ()


def inner_pid(pid: int) -> int:
    """``pid`` as its own PID namespace numbers it (a process on a lab host: its pid there, as the host's own
    tools and drivers see it); ``pid`` itself in ours, or when it is gone."""
    try:
        ids = nspids(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return pid
    return ids[-1] if ids else pid


def outer_pid(inner: int, namespace: str) -> int | None:
    """The pid, as this namespace numbers it, of the process that is ``inner`` inside PID namespace ``namespace``
    (a lab host's: what a rank there writes as its pid), or None when there is none. In this process's own
    namespace that is ``inner`` itself."""
    for pid in in_pid_namespace(namespace):
        try:
            ids = nspids(Path(f"/proc/{pid}/status").read_text())
        except OSError:
            continue
        if ids and ids[-1] == inner:
            return pid
    return None


def parent(pid: int) -> int:
    """The parent pid of ``pid`` (0 when gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rfind(")") + 2:].split()[1])


def _settle(daemon: Daemon, timeout: float = 2.0) -> None:
    """Wait until /proc shows the new argv: exec closes the Popen error pipe a moment before it sets it."""
    deadline = time.monotonic() + timeout
    while cmdline(daemon.pid) != daemon.argv and time.monotonic() < deadline:
        if _stat(daemon.pid) is None or daemon.pid in _CHILDREN and _CHILDREN[daemon.pid].poll() is not None:
            return  # exited at once; the caller sees it is not running
        time.sleep(0.005)


def is_running(daemon: Daemon) -> bool:
    """True when ``daemon.pid`` is alive (not a zombie) and still the process we started."""
    _reap(daemon.pid)
    stat = _stat(daemon.pid)
    if stat is None or stat[0] == "Z":
        return False
    if daemon.start_ticks >= 0 and stat[1] != daemon.start_ticks:
        return False
    return cmdline(daemon.pid) == daemon.argv


def stop(daemons: Iterable[Daemon], *, timeout: float = 10.0,
         sleep: Callable[[float], None] = time.sleep) -> list[Daemon]:
    """SIGTERM every daemon that is still ours, SIGKILL what remains after ``timeout``; return the ones signalled."""
    alive = [d for d in daemons if is_running(d)]
    for daemon in alive:
        _signal(daemon, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(is_running(d) for d in alive) and time.monotonic() < deadline:
        sleep(0.1)
    for daemon in alive:
        if is_running(daemon):
            _signal(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(is_running(d) for d in alive) and time.monotonic() < deadline:
        sleep(0.05)
    return alive


def cmdline(pid: int) -> tuple[str, ...]:
    """The argv of ``pid`` from /proc (empty when gone or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])


def environ_value(pid: int, name: str) -> str | None:
    """The value of environment variable ``name`` in process ``pid`` (None when unreadable or unset)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def all_pids() -> list[int]:
    """Every pid in /proc."""
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]


def comm(pid: int) -> str:
    """The short process name of ``pid`` ('' when gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pids_named(name: str) -> list[int]:
    """Pids whose /proc/<pid>/comm is ``name``."""
    return [pid for pid in all_pids() if comm(pid) == name]


def ancestors(pid: int) -> set[int]:
    """``pid`` and all its parents up to init."""
    found = set()
    while pid > 0 and pid not in found:
        found.add(pid)
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rfind(")") + 2:].split()[1])
    return found


def identify(pid: int, *, name: str) -> Daemon | None:
    """A Daemon record for an existing process (so ``stop`` can check it is still the same one)."""
    argv = cmdline(pid)
    ticks = _start_ticks(pid)
    if not argv or ticks is None:
        return None
    return Daemon(name=name, pid=pid, argv=argv, start_ticks=ticks)


def _signal(daemon: Daemon, sig: signal.Signals) -> None:
    try:
        os.kill(daemon.pid, sig)
    except ProcessLookupError:
        pass  # exited between the check and the signal: what we wanted


def _reap(pid: int) -> None:
    """Reap every exited child (wrappers from ``spawn_via`` end when their program does)."""
    for child, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[child]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid``, or None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[19])


def _start_ticks(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]
