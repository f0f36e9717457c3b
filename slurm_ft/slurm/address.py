"""Where a node is on the network: the address the ranks of a job meet at (``MASTER_ADDR``) and the launcher's
store and fault bell bind to.

A node's name is asked of the resolver first; a name that does not resolve (a cluster whose ``NodeName`` is not a
DNS name, ``NodeAddr``/``NodeHostname`` set apart from it) is asked of Slurm: the node's ``NodeAddr`` in
``scontrol show node -o NAME``. Where neither gives an address, a single-node job meets at 127.0.0.1 (its ranks
share the host), and a multi-node job stops with ``NodeAddressError`` naming the node: nothing falls back to
loopback silently when the ranks are on several hosts.

Shared by the ranks (``slurm_ft.train``), the job's supervisor (``slurm_ft.launch``) and the benchmark's torchrun
batch script, which runs ``python -m slurm_ft.slurm.address NODE NODES`` (prints the address, or one line and
exits 2).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from slurm_ft.core.errors import ConfigError
from slurm_ft.slurm.runner import run_command

LOOPBACK = "127.0.0.1"
SCONTROL_TIMEOUT_S = 10.0

ShowNode = Callable[[str], str]
"""``scontrol show node -o NAME``'s output for one node name ("" when Slurm cannot say)."""


class NodeAddressError(ConfigError):
    """A node of a multi-node job has no address: its name does not resolve and Slurm gives no usable NodeAddr."""


def master_addr(node: str, environ: Mapping[str, str], *, nodes: int, resolve=socket.getaddrinfo,
                show_node: ShowNode | None = None) -> str:
    """``$MASTER_ADDR`` if set, else ``node``'s address (``node_addr``) for a job of ``nodes`` nodes."""
    return environ.get("MASTER_ADDR") or node_addr(node, nodes=nodes, resolve=resolve, show_node=show_node)


def node_addr(node: str, *, nodes: int, resolve=socket.getaddrinfo, show_node: ShowNode | None = None) -> str:
    """``node``'s address, IPv4 where it has one, else IPv6 (IPv6-only clusters): by its name, else by its Slurm
    ``NodeAddr``; else 127.0.0.1 in a job of one node, and ``NodeAddressError`` in a job of ``nodes`` > 1."""
    found = _preferred(_lookup(node, resolve))
    if found is None:
        slurm_addr = parse_node_addr((show_node or scontrol_show_node)(node), node)
        if slurm_addr is not None:
            found = _literal(slurm_addr) or _preferred(_lookup(slurm_addr, resolve))
    if found is not None:
        return found
    if nodes > 1:
        raise NodeAddressError(f"node {node!r} has no address: its name does not resolve and Slurm gives no "
                               f"resolvable NodeAddr (scontrol show node {node}); a job of {nodes} nodes cannot "
                               f"meet at 127.0.0.1")
    return LOOPBACK


def node_addrs(node: str, family: socket.AddressFamily, resolve=socket.getaddrinfo,
               show_node: ShowNode | None = None) -> list[str] | None:
    """Every address of ``node`` in ``family`` (a node may have several), by its name, else by its Slurm
    ``NodeAddr``; None when neither gives one."""
    found = _family_addrs(node, family, resolve)
    if found is not None:
        return found
    slurm_addr = parse_node_addr((show_node or scontrol_show_node)(node), node)
    if slurm_addr is None:
        return None
    literal = _literal(slurm_addr)
    if literal is not None:
        return [literal] if ipaddress.ip_address(literal).version == (6 if family == socket.AF_INET6 else 4) else None
    return _family_addrs(slurm_addr, family, resolve)


# --- Slurm's word: NodeAddr -----------------------------------------------------------------------------------
_FIELD = re.compile(r"(?:^|\s)(NodeName|NodeAddr)=(\S*)")


def parse_node_addr(text: str, node: str) -> str | None:
    """``NodeAddr`` of ``node`` in ``scontrol show node -o`` output (one line per node), or None when the text has
    no such node (``Node n9 not found``) or no NodeAddr for it."""
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for key, value in _FIELD.findall(line):
            fields.setdefault(key, value)  # the first of each: a free-text field later on the line never counts
        if fields.get("NodeName") == node and fields.get("NodeAddr") not in (None, "", "(null)"):
            return fields["NodeAddr"]
    return None


def scontrol_show_node(node: str, run=run_command) -> str:
    """``scontrol show node -o NODE``'s output, or "" where it fails (no Slurm here, no such node)."""
    result = run(["scontrol", "show", "node", "-o", node], timeout=SCONTROL_TIMEOUT_S)
    return result.stdout if result.ok else ""


# --- the resolver ---------------------------------------------------------------------------------------------
def _lookup(name: str, resolve) -> list[tuple[int, str]]:
    try:
        return [(family, sockaddr[0]) for family, _, _, _, sockaddr in resolve(name, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return []


def _preferred(found: Sequence[tuple[int, str]]) -> str | None:
    for wanted in (socket.AF_INET, socket.AF_INET6):
        for family, addr in found:
            if family == wanted:
                return addr
    return None


def _family_addrs(name: str, family: socket.AddressFamily, resolve) -> list[str] | None:
    try:
        found = resolve(name, None, family=family, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return sorted({sockaddr[0] for fam, _, _, _, sockaddr in found if fam == family})


def _literal(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


# --- python -m slurm_ft.slurm.address NODE NODES ---------------------------------------------------------------
USAGE = "usage: python -m slurm_ft.slurm.address NODE NODES  (prints NODE's address in a job of NODES nodes)"


def main(argv: Sequence[str], out=sys.stdout, err=sys.stderr, **lookups) -> int:
    """Print ``NODE``'s address for a job of ``NODES`` nodes; one line on stderr and exit 2 where there is none."""
    if len(argv) != 2 or not argv[1].isdigit() or int(argv[1]) < 1:
        print(f"slurm-ft: {USAGE}; got {' '.join(argv) or 'nothing'!r}", file=err)
        return 2
    try:
        print(node_addr(argv[0], nodes=int(argv[1]), **lookups), file=out)
    except NodeAddressError as exc:
        print(f"slurm-ft: {exc}", file=err)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
