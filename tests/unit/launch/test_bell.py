"""The fault bell over real UDP sockets on this host, and against another uid that knows its port."""

from __future__ import annotations

import socket
import subprocess
import textwrap
import time

import pytest

from slurm_ft.launch.bell import ENV, MIN_GAP_S, Bell, is_ring, ring
from tests.uids import SYSTEM_PYTHON


def test_a_ring_ends_the_wait_at_once_and_silence_waits_it_out():
    bell = Bell("127.0.0.1")
    where = bell.arm()
    try:
        started = time.monotonic()
        assert bell.wait(0.2) is False
        assert time.monotonic() - started >= 0.19
        assert ring({ENV: where}, 3) is True
        started = time.monotonic()
        assert bell.wait(30.0) is True
        assert time.monotonic() - started < 5.0  # woken, not timed out
    finally:
        bell.close()


def test_a_flood_of_rings_wakes_the_launcher_at_most_once_per_gap():
    bell = Bell("127.0.0.1")
    where = bell.arm()
    try:
        for _ in range(50):
            ring({ENV: where}, 0)
        assert bell.wait(5.0) is True
        ring({ENV: where}, 0)
        started = time.monotonic()
        assert bell.wait(5.0) is True
        assert time.monotonic() - started >= MIN_GAP_S * 0.9  # the second wake-up waited out the gap
        assert bell.wait(0.1) is False  # the flood was drained: no datagram left to wake it
    finally:
        bell.close()


def test_each_attempt_has_its_own_token_and_an_earlier_attempts_ring_wakes_nobody():
    bell = Bell("127.0.0.1")
    try:
        first = bell.arm()
        second = bell.arm()
        assert first.rsplit(":", 1)[0] == second.rsplit(":", 1)[0] and first != second
        assert ring({ENV: first}, 1) is True  # a wrapper of the attempt before, late
        assert bell.wait(0.3) is False
        assert ring({ENV: second}, 1) is True
        assert bell.wait(5.0) is True
    finally:
        bell.close()


def test_the_bell_listens_on_the_ranks_address_only():
    bell = Bell("127.0.0.1")
    where = bell.arm()
    try:
        assert bell._sock.getsockname()[0] == "127.0.0.1"
        _, port, token = where.rsplit(":", 2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # another address of this host
            sock.sendto(f"{token} 0".encode(), ("127.0.0.2", int(port)))
        assert bell.wait(0.3) is False
    finally:
        bell.close()


@pytest.mark.parametrize("data, token, rung", [
    (b"abc 3", b"abc", True),
    (b"abc", b"abc", False),
    (b"abd 3", b"abc", False),
    (b"end rank 3", b"abc", False),
    (b"", b"abc", False),
    (b"abc 3", b"", False),  # not armed yet: nothing is a ring
])
def test_what_counts_as_a_ring(data, token, rung):
    assert is_ring(data, token) is rung


def test_ringing_without_a_bell_or_at_a_bad_address_is_silent():
    assert ring({}, 0) is False
    assert ring({ENV: "no-port"}, 0) is False
    assert ring({ENV: "127.0.0.1:4242"}, 0) is False  # no token: the launcher would drop it anyway
    assert ring({ENV: "127.0.0.1:99999:abc"}, 0) is False  # port out of range: not sent, no exception


def test_an_ipv6_bell_rings_over_ipv6():
    try:
        bell = Bell("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 here: {exc}")
    try:
        where = bell.arm()
        assert where.startswith("[::1]:")
        assert ring({ENV: where}, 2) is True
        assert bell.wait(30.0) is True
    finally:
        bell.close()


FORGER = textwrap.dedent("""\
    import socket, sys, time
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for data in (b"end rank 3", b"0 3", b"x" * 400, b""):
                sock.sendto(data, ("127.0.0.1", port))
                sent += 1
    print(sent)
    """)


def test_forged_rings_of_another_user_wake_nothing_and_a_flood_does_not_raise_the_poll_rate(users):
    """Another uid found the port (/proc/net/udp lists it with our uid) and floods it with datagrams without
    the attempt's token: the launcher's waits run to their deadlines, and the real ring still wakes it."""
    bell = Bell("127.0.0.1")
    where = bell.arm()
    port = int(where.rsplit(":", 2)[1])
    attacker = users["attacker"]
    forger = attacker.popen([SYSTEM_PYTHON, "-c", FORGER, str(port), "2.0"], attacker.env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)
        waits, woken, started = 0, 0, time.monotonic()
        while time.monotonic() - started < 1.5:  # the launcher's poll loop, at poll_s = 0.25
            woken += bell.wait(0.25)
            waits += 1
        assert woken == 0
        assert waits <= 7  # 1.5 s / 0.25 s, not one poll per forged datagram
        out, _ = forger.communicate(timeout=30)
        assert int(out) > 1000  # it did flood
        assert bell.wait(0.5) is False  # what the flood left in the socket is read and dropped
        assert ring({ENV: where}, 3) is True
        assert bell.wait(5.0) is True
    finally:
        forger.kill()
        forger.wait()
        bell.close()
