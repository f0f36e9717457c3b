"""The fault bell over real UDP sockets on this host."""

from __future__ import annotations

import time

from slurm_ft.train.bell import ENV, MIN_GAP_S, Bell, ring


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
