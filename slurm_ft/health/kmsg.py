"""Kernel-log Xid lines: a pure parser over the three text formats, and a bounded reader.

The NVIDIA driver logs GPU faults as ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``
This module finds those lines since a given wall-clock time in:

- ``/dev/kmsg`` records: ``<prio>,<seq>,<usec since boot>,<flags>;<message>`` (read non-blocking, as root),
- ``dmesg --time-format iso`` output: ``2024-03-01T12:34:56,123456+00:00 <message>`` (the fallback),
- plain ``dmesg`` output: ``[12345.678901] <message>`` (seconds since boot; for recorded logs).

Parsing is pure (text in, records out); reading is behind ``KmsgSource`` so tests feed literal text.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from slurm_ft.health.records import XidEvent, normalize_pci_bus

_KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_ISO_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?)\s+(?P<msg>.*)$")
_BRACKET_RE = re.compile(r"^\[\s*(?P<secs>\d+\.\d+)\]\s+(?P<msg>.*)$")

# journalctl -k (short, short-iso, short-precise): "Dec 04 03:12:45 gpu-a02 kernel: ..." or
# "2026-12-04T03:12:45+0000 gpu-a02 kernel: ...": the host is the word before "kernel:".
_JOURNAL_RE = re.compile(r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT[\d:.,]+(?:[+-]\d{2}:?\d{2}|Z)?)"
                         r" (?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,63}) kernel: ")
MAX_LINE_CHARS = 1024  # a kernel record is at most ~1 KiB; longer "lines" are cut, never trusted whole
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."   (current drivers)
# "NVRM: Xid (0000:3b:00): 13, Graphics Exception: ..."                       (older drivers, no "PCI:")
_XID_LINE_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\): "
    r"(?P<xid>\d{1,5})\b,?\s*(?P<text>[^\n]*)"
)
_PID_RE = re.compile(r"\bpid[=:]\s*'?(\d+)")


def parse_xid_line(line: str) -> tuple[str, int, str] | None:
    """``(pci_bus, xid, text)`` of an ``NVRM: Xid`` kernel line, else ``None``.

    ``pci_bus`` is normalised to ``dddd:bb:dd`` (lower case); ``text`` is what follows the Xid number.
    """
    if "Xid" not in line:
        return None
    m = _XID_LINE_RE.search(line[:MAX_LINE_CHARS])
    if m is None:
        return None
    return normalize_pci_bus(m["pci"]), int(m["xid"]), m["text"].strip()


def parse_kmsg_xids(text: str, node: str) -> list[XidEvent]:
    """Every Xid line in ``text`` (dmesg / journal / /dev/kmsg output) as ``XidEvent(source="kmsg")``."""
    events = []
    for line in text.splitlines():
        parsed = parse_xid_line(line)
        if parsed is not None:
            pci, xid, _ = parsed
            events.append(XidEvent(node=node, xid=xid, pci_bus=pci, text=line.strip()[:MAX_LINE_CHARS], source="kmsg"))
    return events


def xid_pid(text: str) -> int | None:
    """The ``pid=N`` an Xid line names (the process that hit it), if any."""
    m = _PID_RE.search(text)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True, slots=True)
class LogLine:
    """One kernel log message with its wall-clock time (``None`` when the line carried none we could read)."""

    time: float | None
    message: str


def journal_host(text: str) -> str:
    """The one host a journalctl kernel log names (its lines carry it); "" when none, or more than one."""
    hosts = {m.group("host") for line in text.splitlines()[:5000] if (m := _JOURNAL_RE.match(line[:MAX_LINE_CHARS]))}
    return hosts.pop() if len(hosts) == 1 else ""


def parse_line(line: str, *, boot_time: float) -> LogLine | None:
    """Split one line of any supported format into time and message; ``None`` for kmsg continuation lines."""
    line = line.rstrip("\n")[:MAX_LINE_CHARS]
    if line.startswith(" "):  # /dev/kmsg " KEY=value" dictionary lines
        return None
    if m := _KMSG_RE.match(line):
        return LogLine(boot_time + int(m["usec"]) / 1e6, m["msg"])
    if m := _ISO_RE.match(line):
        return LogLine(_iso_time(m["ts"]), m["msg"])
    if m := _BRACKET_RE.match(line):
        return LogLine(boot_time + float(m["secs"]), m["msg"])
    return LogLine(None, line)


def _iso_time(text: str) -> float | None:
    try:
        stamp = dt.datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # dmesg prints local time when it omits the offset
    return stamp.timestamp()


def parse_xid_message(message: str, *, node: str, time: float | None = None) -> XidEvent | None:
    """The Xid in one kernel message, or ``None`` when it is not an NVRM Xid line (classify.xid parses)."""
    parsed = parse_xid_line(message)
    if parsed is None:
        return None
    pci, xid, _ = parsed
    return XidEvent(node=node, xid=xid, pci_bus=pci, time=time, text=message.strip(), source="kmsg")


def find_xids(lines: Iterable[str], *, node: str, since: float | None, boot_time: float) -> list[XidEvent]:
    """Xid events in ``lines`` logged at or after ``since`` (all of them when ``since`` is None).

    A line without a readable time is kept: missing a fault is worse than reporting an old one.
    """
    found = []
    for raw in lines:
        parsed = parse_line(raw, boot_time=boot_time)
        if parsed is None or (since is not None and parsed.time is not None and parsed.time < since):
            continue
        event = parse_xid_message(parsed.message, node=node, time=parsed.time)
        if event is not None:
            found.append(event)
    return found


def boot_time_now() -> float:
    """Wall-clock time of boot, as the kernel log's monotonic timestamps count from it."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


class KmsgSource(Protocol):
    """Yields raw kernel log lines (any supported format). May raise OSError when the log is unreadable."""

    def lines(self) -> Iterator[str]: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DevKmsg:
    """Reads every record in ``/dev/kmsg`` without blocking; stops at ``max_records`` or ``max_seconds``."""

    path: str = "/dev/kmsg"
    max_records: int = 200_000
    max_seconds: float = 2.0

    def lines(self) -> Iterator[str]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        deadline = time.monotonic() + self.max_seconds
        try:
            for _ in range(self.max_records):
                if time.monotonic() > deadline:
                    return
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    return  # read everything there is
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        continue  # the record was overwritten while we read: skip to the next one
                    raise
                if not record:
                    return
                yield record.decode("utf-8", "replace")
        finally:
            os.close(fd)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DmesgCommand:
    """Runs ``dmesg --time-format iso`` (no shell); for hosts where ``/dev/kmsg`` cannot be opened."""

    argv: tuple[str, ...] = ("dmesg", "--time-format", "iso", "--nopager")
    timeout: float = 5.0

    def lines(self) -> Iterator[str]:
        try:
            done = subprocess.run(list(self.argv), capture_output=True, text=True, errors="replace",  # noqa: S603
                                  timeout=self.timeout, check=False, stdin=subprocess.DEVNULL)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise OSError(f"{self.argv[0]}: {exc}") from exc
        if done.returncode != 0:
            raise OSError(f"{' '.join(self.argv)} exited {done.returncode}: {done.stderr.strip()[:200]}")
        return iter(done.stdout.splitlines())


@dataclasses.dataclass(frozen=True, slots=True)
class TextLines:
    """Lines from a string (recorded logs, tests, ``dmesg`` output captured elsewhere)."""

    text: str

    def lines(self) -> Iterator[str]:
        return iter(self.text.splitlines())


def read_xids(node: str, *, since: float | None, sources: Iterable[KmsgSource] | None = None,
              boot_time: float | None = None) -> tuple[list[XidEvent], list[str]]:
    """Xid events since ``since`` from the first readable source (default ``/dev/kmsg``, then ``dmesg``).

    Never raises for an unreadable log: the notes say what failed, and the list is empty.
    """
    boot = boot_time_now() if boot_time is None else boot_time
    notes = []
    for source in sources if sources is not None else (DevKmsg(), DmesgCommand()):
        try:
            return find_xids(source.lines(), node=node, since=since, boot_time=boot), notes
        except OSError as exc:
            notes.append(f"kmsg unavailable ({type(source).__name__}): {exc.strerror or exc}")
    return [], notes
