"""Who may connect to the launcher's rendezvous store (slurm_ft.launch.store): the peer filter on real sockets,
no torch."""

from __future__ import annotations

import socket

import pytest

from slurm_ft.launch.store import BPF_MAXINSNS, allowed_peers, listening_socket, peer_filter


def resolver(table):
    def resolve(node, family):
        return table.get(node)
    return resolve


def test_the_store_admits_its_own_address_and_every_address_of_the_allocations_nodes():
    table = {"n1": ["10.0.0.1"], "n2": ["10.0.0.2", "10.0.1.2"]}
    assert allowed_peers("10.0.0.1", ["n1", "n2"], resolve=resolver(table)) == ["10.0.0.1", "10.0.0.2", "10.0.1.2"]


def test_a_node_that_does_not_resolve_leaves_a_routable_store_open_to_anyone_but_not_a_loopback_one():
    assert allowed_peers("10.0.0.1", ["n1", "ghost"], resolve=resolver({"n1": ["10.0.0.1"]})) is None
    assert allowed_peers("127.0.0.1", ["n1", "n2"], resolve=resolver({})) == ["127.0.0.1"]  # the lab's nodes


def test_a_filter_holds_at_most_what_the_kernel_takes():
    assert len(peer_filter(socket.AF_INET, ["10.0.0.1", "10.0.0.2"])) == 8 * 6  # load, 2 x (jeq, ret), ret 0
    assert peer_filter(socket.AF_INET, [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(BPF_MAXINSNS)]) is None
    assert len(peer_filter(socket.AF_INET6, ["fd00::1"])) == 8 * 10


def _connects(source: str, port: int, dest: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET6 if ":" in dest else socket.AF_INET, socket.SOCK_STREAM) as client:
        client.bind((source, 0))
        client.settimeout(1.0)
        try:
            client.connect((dest, port))
        except OSError:  # the SYN was dropped: timed out
            return False
    return True


def test_a_connection_from_an_address_outside_the_allocation_never_reaches_the_store():
    listener = listening_socket("127.0.0.1", peer_filter(socket.AF_INET, ["127.0.0.1", "127.0.0.3"]))
    with listener:
        listener.listen(8)
        port = listener.getsockname()[1]
        assert listener.getsockname()[0] == "127.0.0.1"  # on the ranks' address, not every interface
        assert _connects("127.0.0.1", port) and _connects("127.0.0.3", port)
        assert not _connects("127.0.0.2", port)  # another host, as far as the store can tell


def test_the_ipv6_filter_compares_all_of_the_address():
    try:
        listener = listening_socket("::1", peer_filter(socket.AF_INET6, ["::2", "::1"]))
    except OSError as exc:
        pytest.skip(f"no IPv6 here: {exc}")
    with listener:
        listener.listen(8)
        assert _connects("::1", listener.getsockname()[1], dest="::1")
    with listening_socket("::1", peer_filter(socket.AF_INET6, ["::2", "fd00::1"])) as closed:
        closed.listen(8)
        assert not _connects("::1", closed.getsockname()[1], dest="::1")
