"""The attempt's rendezvous store, held open on the launcher's node: every rank connects, no rank hosts it.

Without it, rank 0 starts torch's TCPStore server inside ``init_process_group`` and the other ranks connect to it.
A rank that comes before rank 0's server listens is refused and retries with torch's backoff, so a rank 0 late by
0.1 s costs every rank about 0.6 s more (4 gloo ranks on this host: 0.63 s added with rank 0 hosting, 0.006 s with
a store already listening; ``bench/bench_rendezvous.py``, ``bench/reference/2026-12-05-launcher-store/``). Restarted
ranks come up at different times (standbys, srun on each node), so a restart paid it nearly every time.

The launcher starts ``python -m slurm_ft.launch.store --addr ADDR --peers HOSTLIST`` once, when the first attempt
trains (it imports torch: seconds, off every critical path), and before each later attempt asks it for a store
(``open``). The keeper opens a fresh TCPStore server on a free port for every attempt (as torch elastic's agent
does: a dead attempt's keys never reach the next process group), announces it, and only then closes the one
before (connections held to an old store slow its close by seconds). The ranks get its address and port as
``MASTER_ADDR``/``MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE=True``, torch's own switch for "the agent
holds the store": ``init_process_group`` (``env://`` and ``tcp://``) then connects as a client on every rank, and
the user's script is unchanged.

Who may talk to it: TCPStore has no authentication (nor has torch's own ``env://`` store or torchrun's). The keeper
narrows it where it can: the store listens on ``ADDR`` alone, the launcher node's address that the ranks use, not
on every interface (a socket bound here, handed to torch as ``master_listen_fd``), and that socket carries a
classic BPF filter that drops every connection whose source is not an address of one of the allocation's nodes
(``peer_filter``; the kernel drops the SYN, torch never sees it). Where that cannot be checked (a node name that
does not resolve, more addresses than a filter holds) the store takes any peer, as torch's does. Ranks that come
from an address their node's name does not resolve to wait in their connect: the launcher sees that attempt hang
before its first step and lets rank 0 host the store from then on (``launcher_store_off``). Processes of
other users on the allocation's own nodes, and anyone who can send from those addresses, still reach it: only
exclusive nodes and an isolated job network close that (README, "Trust model").

Protocol, one line each way: the keeper prints ``ready peers=N`` (or ``ready peers=any``) once torch is imported;
for ``open`` it prints ``port N`` (or ``error ...``). It exits when its stdin closes (the launcher is gone).
Anything else (no keeper yet, a dead one, a slow answer) and the attempt falls back to rank 0 hosting the store: a
keeper can make a restart faster, never make one fail.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from slurm_ft.slurm.address import node_addrs
from slurm_ft.slurm.parsers import expand_hostlist

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # torch.distributed.rendezvous: "True" -> every rank is a client
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torch < 2.4 read it (a key prefix per attempt) with the above
OPEN_TIMEOUT_S = 2.0  # how long the launcher waits for a ready keeper's port
SO_ATTACH_FILTER = 26  # linux/asm-generic/socket.h (Python's socket module does not name it)
SKF_NET_OFF = -0x100000  # classic BPF: offsets from the network header (linux/filter.h)
BPF_MAXINSNS = 4096


class StoreKeeper:
    """The launcher's handle on its keeper process (``python -m slurm_ft.launch.store``) on this node."""

    def __init__(self, python: str, addr: str, *, peers: str = "", environ: Mapping[str, str] | None = None,
                 open_timeout_s: float = OPEN_TIMEOUT_S) -> None:
        self.python, self.addr, self.peers, self.open_timeout_s = python, addr, peers, open_timeout_s
        self.environ = dict(os.environ if environ is None else environ)
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._ready = False
        self._broken = False

    def start(self) -> None:
        """Start the keeper (once; it imports torch in the background)."""
        if self._proc is not None or self._broken:
            return
        argv = [self.python, "-m", "slurm_ft.launch.store", "--addr", self.addr]
        if self.peers:
            argv += ["--peers", self.peers]
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, env=self.environ, start_new_session=True)
        except OSError:
            self._broken = True

    def open(self) -> tuple[str, int] | None:
        """A fresh store's address and port for the next attempt, or None (no keeper ready: rank 0 hosts it)."""
        proc = self._proc
        if proc is None or self._broken or proc.poll() is not None:
            return None
        if not self._ready:
            self._ready = (self._line(0.0) or "").split(" ")[0] == "ready"
            if not self._ready:
                return None  # still importing torch
        try:
            proc.stdin.write(b"open\n")
            proc.stdin.flush()
        except OSError:
            return self._give_up()
        word, _, port = (self._line(self.open_timeout_s) or "").partition(" ")
        return (self.addr, int(port)) if word == "port" and port.isdigit() else self._give_up()

    def close(self) -> None:
        """Close the keeper's stdin (it exits) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _give_up(self) -> None:
        self._broken = True
        self.close()
        return None

    def _line(self, timeout_s: float) -> str | None:
        """The keeper's next line within ``timeout_s``, or None."""
        deadline = time.monotonic() + timeout_s
        out = self._proc.stdout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if not select.select([out], [], [], max(left, 0.0))[0]:
                return None
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()


# --- who may connect: the allocation's nodes ------------------------------------------------------------------
def family_of(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET


def allowed_peers(addr: str, nodes: Iterable[str], *, resolve: Callable[..., list[str] | None] = node_addrs
                  ) -> list[str] | None:
    """The source addresses the store admits: ``addr`` itself and every address (of its family) of every node in
    ``nodes``; None when that cannot be known (a node that does not resolve, while the store is on a routable
    address: its ranks could come from anywhere). A store on loopback only ever sees this host."""
    family = family_of(addr)
    found = {str(ipaddress.ip_address(addr))}
    for node in nodes:
        addrs = resolve(node, family)
        if addrs is None and not ipaddress.ip_address(addr).is_loopback:
            return None
        found.update(str(ipaddress.ip_address(a)) for a in addrs or ())
    return sorted(found)


def peer_filter(family: socket.AddressFamily, peers: Sequence[str]) -> bytes | None:
    """A classic BPF socket filter (the instructions, ``struct sock_filter[]``) that accepts packets whose source
    is one of ``peers`` and drops the rest; None when they do not fit one filter (``BPF_MAXINSNS``)."""
    ret_all, ret_none = _insn(0x06, 0, 0, 0xFFFFFFFF), _insn(0x06, 0, 0, 0)  # BPF_RET|BPF_K
    if family == socket.AF_INET:
        prog = [_insn(0x20, 0, 0, SKF_NET_OFF + 12)]  # BPF_LD|BPF_W|BPF_ABS: the IPv4 source address
        for peer in peers:
            prog += [_insn(0x15, 0, 1, int(ipaddress.IPv4Address(peer))), ret_all]  # BPF_JMP|BPF_JEQ|BPF_K
    else:
        prog = []
        for peer in peers:
            words = struct.unpack("!4I", ipaddress.IPv6Address(peer).packed)
            for i, word in enumerate(words):  # load each word of the source (offset 8), on a mismatch skip the rest
                prog += [_insn(0x20, 0, 0, SKF_NET_OFF + 8 + 4 * i), _insn(0x15, 0, 2 * (3 - i) + 1, word)]
            prog.append(ret_all)
    prog.append(ret_none)
    return b"".join(prog) if len(prog) <= BPF_MAXINSNS else None


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def listening_socket(addr: str, program: bytes | None) -> socket.socket:
    """A TCP socket bound to ``addr`` on a free port, with ``program`` (``peer_filter``) attached."""
    sock = socket.socket(family_of(addr), socket.SOCK_STREAM)
    try:
        sock.bind((addr, 0))
        if program is not None:
            import ctypes

            insns = ctypes.create_string_buffer(program, len(program))
            fprog = struct.pack("@HP", len(program) // 8, ctypes.addressof(insns))  # struct sock_fprog, native
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        sock.close()
        raise
    return sock


# --- the keeper -----------------------------------------------------------------------------------------------
def keep(addr: str, peers: str) -> int:
    """The keeper: one TCPStore server per ``open``, the newest kept, until stdin closes."""
    import datetime

    from torch.distributed import TCPStore

    allowed = allowed_peers(addr, expand_hostlist(peers)) if peers else None
    program = peer_filter(family_of(addr), allowed) if allowed is not None else None
    print(f"ready peers={len(allowed) if program is not None else 'any'}", flush=True)
    store = None
    for line in sys.stdin:
        if line.strip() != "open":
            continue
        try:
            fresh = _open(TCPStore, addr, program, datetime.timedelta(seconds=60))
        except (OSError, RuntimeError, ValueError) as exc:
            print(f"error {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", flush=True)
            continue
        print(f"port {fresh.port}", flush=True)
        store = fresh  # the last attempt's store closes now, after the new one is announced (its ranks are gone)
    del store
    return 0


def _open(tcp_store: type, addr: str, program: bytes | None, timeout: object) -> object:
    """A TCPStore server on a fresh socket bound to ``addr`` with the peer filter. The store owns the socket (it
    closes it), even when it fails: the descriptor is never closed here (its number may be reused by then)."""
    sock = listening_socket(addr, program)
    port = sock.getsockname()[1]
    return tcp_store(addr, port, None, True, timeout=timeout, wait_for_workers=False, master_listen_fd=sock.detach())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ft.launch.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", required=True, help="the launcher node's address, the one the ranks use")
    parser.add_argument("--peers", default="", help="the allocation's nodes (a Slurm hostlist): only they may "
                                                    "connect (default: anyone who reaches ADDR)")
    args = parser.parse_args(argv)
    try:
        ipaddress.ip_address(args.addr)
    except ValueError:
        print(f"slurm-ft store: --addr must be an IP address, got {args.addr!r}", file=sys.stderr)
        return 2
    return keep(args.addr, args.peers)


if __name__ == "__main__":
    sys.exit(main())
