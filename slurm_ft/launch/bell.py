"""The launcher's fault bell: a rank's wrapper rings it the moment its rank ends badly.

Without it the launcher saw a dead rank at its next poll (``poll_s``, 1 s) and ended the attempt a poll after the
evidence wait: 1-2 s of every in-allocation restart, whatever the fault. A ring wakes it at once.

A ring is one UDP datagram to the launcher's node (``SLURM_FT_BELL=addr:port``, ``[addr]:port`` for IPv6, which
the launcher gives each attempt). It is only a wake-up: the launcher then reads the end and error records as at
any poll, so a lost, late, repeated or forged datagram changes when it looks, never what it decides. Ringing never
blocks and never fails the wrapper (UDP: no connect, no wait for a dead or firewalled launcher). A flood wakes the
launcher at most once per ``MIN_GAP_S``.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Mapping

ENV = "SLURM_FT_BELL"  # set by the launcher: where the rank wrappers ring (addr:port)
MIN_GAP_S = 0.05  # the shortest time between two wake-ups, however many rings come
_DRAIN = 256  # datagrams read per wake-up at most


class Bell:
    """The launcher's side: a UDP socket on every interface of its node; ``wait`` sleeps until a ring or the
    timeout."""

    def __init__(self, addr: str) -> None:
        family = _family(addr)
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self._sock.bind(("::" if family == socket.AF_INET6 else "", 0))
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        port = self._sock.getsockname()[1]
        self.address = f"[{addr}]:{port}" if family == socket.AF_INET6 else f"{addr}:{port}"
        self._woken = float("-inf")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a ring ended the sleep early."""
        start = time.monotonic()
        readable, _, _ = select.select([self._sock], [], [], max(0.0, seconds))
        if not readable:
            return False
        self._drain()
        pause = self._woken + MIN_GAP_S - time.monotonic()
        if pause > 0:  # rung again right after the last wake-up: a flood wakes us at most once per MIN_GAP_S
            time.sleep(min(pause, max(0.0, start + seconds - time.monotonic())))
        self._woken = time.monotonic()
        return True

    def _drain(self) -> None:
        for _ in range(_DRAIN):
            try:
                self._sock.recv(512)
            except OSError:  # BlockingIOError: nothing left
                return

    def close(self) -> None:
        self._sock.close()


def ring(environ: Mapping[str, str], rank: int) -> bool:
    """Ring the launcher's bell for ``rank`` when ``$SLURM_FT_BELL`` names one; False when there is none or the
    datagram could not be sent (silently: the launcher's poll still finds the record)."""
    host, _, port = environ.get(ENV, "").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit():
        return False
    try:
        with socket.socket(_family(host), socket.SOCK_DGRAM) as sock:
            sock.sendto(f"end rank {rank}".encode(), (host, int(port)))
    except (OSError, OverflowError, UnicodeError):
        return False
    return True


def _family(addr: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal (it has colons), else IPv4."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
