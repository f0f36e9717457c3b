"""Where a node is on the network: the address the ranks of a job meet at (``MASTER_ADDR``) and the launcher's
store and fault bell bind to.

Shared by the ranks (``slurm_ft.train``) and the job's supervisor (``slurm_ft.launch``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping


def master_addr(node: str, environ: Mapping[str, str]) -> str:
    """``$MASTER_ADDR`` if set, else ``node``'s address."""
    return environ.get("MASTER_ADDR") or node_addr(node)


def node_addr(node: str, resolve=socket.getaddrinfo) -> str:
    """``node``'s address: IPv4 where it has one, else IPv6 (IPv6-only clusters); 127.0.0.1 when it does not
    resolve (the lab's nodes)."""
    try:
        found = [(family, sockaddr[0]) for family, _, _, _, sockaddr in resolve(node, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return "127.0.0.1"
    for wanted in (socket.AF_INET, socket.AF_INET6):
        for family, addr in found:
            if family == wanted:
                return addr
    return "127.0.0.1"


def node_addrs(node: str, family: socket.AddressFamily, resolve=socket.getaddrinfo) -> list[str] | None:
    """Every address of ``node`` in ``family`` (a node may have several); None when the name does not resolve."""
    try:
        found = resolve(node, None, family=family, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return sorted({sockaddr[0] for fam, _, _, _, sockaddr in found if fam == family})
