"""The fault bell over real UDP sockets on this host."""

from __future__ import annotations

import socket
import time

import pytest

from slurm_ft.launch.bell import ENV, MIN_GAP_S, Bell, ring
from slurm_ft.slurm.address import node_addr


def test_a_ring_ends_the_wait_at_once_and_silence_waits_it_out():
    bell = Bell("127.0.0.1")
    try:
        started = time.monotonic()
        assert bell.wait(0.2) is False
        assert time.monotonic() - started >= 0.19
        assert ring({ENV: bell.address}, 3) is True
        started = time.monotonic()
        assert bell.wait(30.0) is True
        assert time.monotonic() - started < 5.0  # woken, not timed out
    finally:
        bell.close()


def test_a_flood_of_rings_wakes_the_launcher_at_most_once_per_gap():
    bell = Bell("127.0.0.1")
    try:
        for _ in range(50):
            ring({ENV: bell.address}, 0)
        assert bell.wait(5.0) is True
        ring({ENV: bell.address}, 0)
        started = time.monotonic()
        assert bell.wait(5.0) is True
        assert time.monotonic() - started >= MIN_GAP_S * 0.9  # the second wake-up waited out the gap
        assert bell.wait(0.1) is False  # the flood was drained: no datagram left to wake it
    finally:
        bell.close()


def test_ringing_without_a_bell_or_at_a_bad_address_is_silent():
    assert ring({}, 0) is False
    assert ring({ENV: "no-port"}, 0) is False
    assert ring({ENV: "127.0.0.1:99999"}, 0) is False  # port out of range: not sent, no exception


def test_an_ipv6_bell_rings_over_ipv6():
    try:
        bell = Bell("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 here: {exc}")
    try:
        assert bell.address.startswith("[::1]:")
        assert ring({ENV: bell.address}, 2) is True
        assert bell.wait(30.0) is True
    finally:
        bell.close()


def _resolver(*answers):
    def resolve(node, port, type=0):
        return [(family, socket.SOCK_STREAM, 6, "", (addr, 0)) for family, addr in answers]
    return resolve


def test_the_node_address_prefers_ipv4_and_falls_back_to_ipv6():
    both = _resolver((socket.AF_INET6, "fd00::7"), (socket.AF_INET, "10.0.0.7"))
    assert node_addr("n7", resolve=both) == "10.0.0.7"
    assert node_addr("n7", resolve=_resolver((socket.AF_INET6, "fd00::7"))) == "fd00::7"

    def unknown(node, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert node_addr("n7", resolve=unknown) == "127.0.0.1"
    assert node_addr("localhost") in ("127.0.0.1", "::1")  # the real resolver
