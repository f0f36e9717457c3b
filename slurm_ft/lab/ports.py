"""Picking a block of free TCP ports on the loopback for one lab (slurmctld + one per slurmd)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
from collections.abc import Iterator

PORT_RANGE = (20000, 32000)  # below the usual ephemeral range (32768-60999)
HOST_LOCK = "/tmp/.slurm-ft-lab.lock"  # serializes port choice + daemon start across labs on this host


def port_is_free(port: int) -> bool:
    """True when nothing is bound to ``port`` (slurmctld binds the wildcard address, so probe that)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def pick_block(count: int, *, rng: random.Random | None = None, attempts: int = 200,
               port_range: tuple[int, int] = PORT_RANGE) -> int:
    """Return the first port of ``count`` consecutive free ports, chosen at random within ``port_range``."""
    rng = rng or random.Random()
    low, high = port_range
    if count < 1 or high - low < count:
        raise ValueError(f"count: cannot fit {count} ports in {low}-{high}")
    for _ in range(attempts):
        base = rng.randrange(low, high - count)
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise OSError(f"no block of {count} free ports found in {low}-{high} after {attempts} tries")


@contextlib.contextmanager
def host_lock(path: str = HOST_LOCK) -> Iterator[None]:
    """Hold an exclusive host-wide lock (so two labs starting at once don't pick the same ports)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def can_connect(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
