"""The launcher's fault bell: a rank's wrapper rings it the moment its rank ends badly.

Without it the launcher saw a dead rank at its next poll (``poll_s``, 1 s) and ended the attempt a poll after the
evidence wait: 1-2 s of every in-allocation restart, whatever the fault. A ring wakes it at once.

A ring is one UDP datagram to the launcher's node, from ``SLURM_FT_BELL=addr:port:token`` (``[addr]:port:token``
for IPv6), which the launcher gives each attempt's steps and no one else:

==========  ===========================================================================================
part        rule
==========  ===========================================================================================
addr        the launcher's node address, the one the ranks use; the bell listens on it alone
port        the bell's UDP port (ephemeral, one for the whole job)
token       32 random hex digits, new for every attempt (``Bell.arm``)
datagram    ``<token> <rank>``: one that does not start with the attempt's token wakes nobody
==========  ===========================================================================================

It is only a wake-up: the launcher then reads the end and error records as at any poll, so a lost, late or
repeated datagram changes when it looks, never what it decides. A datagram without the token (forged, or from an
earlier attempt) is read and dropped, and the wait goes on to its deadline, reading the socket at most once per
``MIN_GAP_S``: a flood costs reads, never polls. Ringing never blocks and never fails the wrapper (UDP: no
connect, no wait for a dead or firewalled launcher). Rings wake the launcher at most once per ``MIN_GAP_S``.
"""

from __future__ import annotations

import hmac
import secrets
import select
import socket
import time
from collections.abc import Mapping

ENV = "SLURM_FT_BELL"  # set by the launcher: where and how the rank wrappers ring (addr:port:token)
MIN_GAP_S = 0.05  # the shortest time between two wake-ups or two reads, however many datagrams come
_DRAIN = 256  # datagrams read per wake-up at most


class Bell:
    """The launcher's side: a UDP socket on its node's address; ``arm`` gives each attempt its token, ``wait``
    sleeps until a ring with it or the timeout."""

    def __init__(self, addr: str) -> None:
        family = _family(addr)
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self._sock.bind((addr, 0))
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        port = self._sock.getsockname()[1]
        self._where = f"[{addr}]:{port}" if family == socket.AF_INET6 else f"{addr}:{port}"
        self._token = b""
        self._woken = float("-inf")

    def arm(self) -> str:
        """A fresh token for the next attempt (an earlier attempt's rings wake nobody now): its ``$SLURM_FT_BELL``."""
        token = secrets.token_hex(16)
        self._token = token.encode()
        return f"{self._where}:{token}"

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a ring with this attempt's token ended the sleep early."""
        start = time.monotonic()
        deadline = start + max(0.0, seconds)
        while True:
            readable, _, _ = select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return False
            if self._drain():
                break
            # only datagrams without the token: read on, at most once per MIN_GAP_S, until the deadline
            time.sleep(max(0.0, min(MIN_GAP_S, deadline - time.monotonic())))
        pause = self._woken + MIN_GAP_S - time.monotonic()
        if pause > 0:  # rung again right after the last wake-up: a flood wakes us at most once per MIN_GAP_S
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        self._woken = time.monotonic()
        return True

    def _drain(self) -> bool:
        """Read what waits (``_DRAIN`` datagrams at most); whether one of them carried the token."""
        rung = False
        for _ in range(_DRAIN):
            try:
                data = self._sock.recv(512)
            except OSError:  # BlockingIOError: nothing left
                break
            rung = rung or is_ring(data, self._token)
        return rung

    def close(self) -> None:
        self._sock.close()


def is_ring(data: bytes, token: bytes) -> bool:
    """Whether datagram ``data`` is a ring for the attempt whose token is ``token`` (none before ``arm``)."""
    return bool(token) and hmac.compare_digest(data[:len(token) + 1], token + b" ")


def ring(environ: Mapping[str, str], rank: int) -> bool:
    """Ring the launcher's bell for ``rank`` when ``$SLURM_FT_BELL`` names one; False when there is none or the
    datagram could not be sent (silently: the launcher's poll still finds the record)."""
    rest, _, token = environ.get(ENV, "").rpartition(":")
    host, _, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not token:
        return False
    try:
        with socket.socket(_family(host), socket.SOCK_DGRAM) as sock:
            sock.sendto(f"{token} {rank}".encode(), (host, int(port)))
    except (OSError, OverflowError, UnicodeError):
        return False
    return True


def _family(addr: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal (it has colons), else IPv4."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
