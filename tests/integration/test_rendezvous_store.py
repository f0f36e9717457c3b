"""The launcher's rendezvous store (slurm_ft.launch.store) with real gloo ranks connecting as torch's clients."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time

import pytest
from torch.distributed import TCPStore

from slurm_ft.launch.store import StoreKeeper

RANK = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    if os.environ["RANK"] == "0":
        time.sleep(0.3)  # rank 0 comes last: with the launcher's store nobody waits on its server
    dist.init_process_group("gloo")
    value = torch.tensor([float(os.environ["RANK"]) + 1])
    dist.all_reduce(value)
    print(int(value.item()), flush=True)
    dist.destroy_process_group()
""")


def ready_keeper() -> StoreKeeper:
    keeper = StoreKeeper(sys.executable, "127.0.0.1")
    keeper.start()
    deadline = time.monotonic() + 120
    while keeper._proc.poll() is None and not keeper._ready and time.monotonic() < deadline:
        keeper._ready = keeper._line(1.0) == "ready"
    assert keeper._ready, "the keeper did not import torch within 120 s"
    return keeper


def attempt(addr: str, port: int, restart: int, world: int = 2) -> list[str]:
    env = {**os.environ, "MASTER_ADDR": addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(restart)}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0] * world, [err[-2000:] for _, err in outs]
    return [out.strip() for out, _ in outs]


def test_every_rank_connects_to_the_keepers_store_and_each_attempt_gets_a_fresh_one():
    keeper = ready_keeper()
    try:
        first = keeper.open()
        assert first is not None and first[0] == "127.0.0.1"
        assert attempt(*first, restart=0) == ["3", "3"]  # rank 0 hosted nothing: it came last and joined
        TCPStore("127.0.0.1", first[1], None, False, timeout=datetime.timedelta(seconds=10)).set("stale", "1")
        second = keeper.open()
        assert second is not None and second[1] != first[1]
        client = TCPStore("127.0.0.1", second[1], None, False, timeout=datetime.timedelta(seconds=10))
        assert not client.check(["stale"])  # the last attempt's keys stay behind with its store
        assert attempt(*second, restart=1) == ["3", "3"]
    finally:
        keeper.close()
    assert keeper.open() is None


def fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("body", ["sleep 30", "echo ready; while read line; do echo busy; done", "exit 1"])
def test_a_keeper_not_ready_wrong_or_gone_gives_no_store_and_no_error(tmp_path, body):
    keeper = StoreKeeper(fake_python(tmp_path, body), "127.0.0.1", open_timeout_s=0.5)
    keeper.start()
    time.sleep(0.3)
    try:
        assert keeper.open() is None  # the attempt falls back to rank 0 hosting the store
        assert keeper.open() is None
    finally:
        keeper.close()


def test_a_keeper_that_cannot_start_gives_no_store(tmp_path):
    keeper = StoreKeeper(str(tmp_path / "no-such-python"), "127.0.0.1")
    keeper.start()
    assert keeper.open() is None


def test_the_keeper_exits_when_the_launcher_goes(tmp_path):
    keeper = ready_keeper()
    proc = keeper._proc
    proc.stdin.close()  # what the launcher's death does to the pipe
    assert proc.wait(timeout=10) == 0
