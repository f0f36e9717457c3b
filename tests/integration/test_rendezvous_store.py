"""The launcher's rendezvous store (slurm_ft.launch.store) with real gloo ranks connecting as torch's clients."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from slurm_ft.classify import classify
from slurm_ft.launch.bell import Bell
from slurm_ft.launch.launcher import LaunchConfig, Launcher
from slurm_ft.launch.store import StoreKeeper
from tests import uids

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


def ready_keeper(peers: str = "") -> StoreKeeper:
    return ready(StoreKeeper(sys.executable, "127.0.0.1", peers=peers))


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


# --- who may talk to the store (security review 2026-12-05, findings 2 and 3) ----------------------------------
def _reaches(source: str, dest: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        client.bind((source, 0))
        client.settimeout(1.0)
        try:
            client.connect((dest, port))
        except OSError:
            return False
    return True


def test_the_store_listens_on_the_ranks_address_for_the_allocations_nodes_only():
    keeper = ready_keeper(peers="slurm-ft-no-such-node[1-2]")  # the lab's names: they do not resolve, loopback
    try:
        addr, port = keeper.open()
        assert _reaches("127.0.0.1", addr, port)
        assert not _reaches("127.0.0.1", "127.0.0.2", port)  # not on every interface: nothing listens there
        assert not _reaches("127.0.0.2", addr, port)  # from outside the allocation: dropped before torch sees it
        client = TCPStore(addr, port, None, False, timeout=datetime.timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        keeper.close()


def test_the_next_store_opens_while_the_old_one_is_still_held():
    """Connections held to the last attempt's store (the review's 200, here 400) once made its close outlast the
    launcher's 2 s wait for the next port, and the job fell back to rank 0 hosting for good."""
    keeper = ready_keeper()
    held = []
    try:
        addr, port = keeper.open()
        for _ in range(400):
            held.append(socket.create_connection((addr, port), timeout=5))
        started = time.monotonic()
        fresh = keeper.open()
        assert fresh is not None and fresh[1] != port, "the keeper gave up: restarts fall back to rank 0"
        assert time.monotonic() - started < keeper.open_timeout_s
        assert keeper.open() is not None  # and it stays
    finally:
        for conn in held:
            conn.close()
        keeper.close()


TRAIN = textwrap.dedent("""\
    import datetime, os, signal
    import torch, torch.distributed as dist
    from slurm_ft.train.errors import record_errors
    from slurm_ft.train.heartbeat import HeartbeatWriter
    rank, attempt, run = int(os.environ["RANK"]), int(os.environ["SLURM_FT_ATTEMPT"]), os.environ["SLURM_FT_RUN_DIR"]
    with record_errors(run, rank) as step:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        beats = HeartbeatWriter(run, rank, liveness_s=0, stacks=False)
        for i in (1, 2):
            step.step = i
            value = torch.ones(1)
            dist.all_reduce(value)
            beats.beat(i, force=True)
            if attempt == 1 and rank == 1 and i == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # a rank lost on the first attempt: the restart follows
        dist.destroy_process_group()
    """)


class LocalSteps:
    """srun on this host: a step's tasks as local processes (SLURM_PROCID, SLURM_LOCALID), each in a group."""

    def __call__(self, argv, env):
        tasks = int(next(a for a in argv if a.startswith("--ntasks=")).split("=")[1])
        command = argv[argv.index("/bin/sh"):]
        return Tasks([subprocess.Popen(command, env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                                       start_new_session=True) for r in range(tasks)])


class Tasks:
    def __init__(self, procs):
        self.procs = procs

    def poll(self):
        codes = [p.poll() for p in self.procs]
        return None if None in codes else next((c for c in codes if c != 0), 0)

    def send_signal(self, sig):
        for proc in self.procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                continue

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


class Announcing(StoreKeeper):
    """The keeper, telling the attacker the port of its ``nth`` store (it would find it in /proc/net/tcp anyway)."""

    def __init__(self, *args, nth: int, port_file: Path, **kw) -> None:
        super().__init__(*args, **kw)
        self.nth, self.port_file, self.opened = nth, port_file, []

    def open(self):
        held = super().open()
        self.opened.append(held)
        if held is not None and len(self.opened) == self.nth:
            self.port_file.write_text(str(held[1]))
        return held


@pytest.mark.slow
def test_a_junk_key_from_another_user_after_a_restart_costs_one_retry(users, scratch, tmp_path):
    """Another uid overwrites the gloo address keys of attempt 2's store (it reached the store: as torch's own,
    it cannot tell who connects). That attempt fails inside init_process_group; the verdict says the store's data
    did not parse and restarts in place; attempt 3's fresh store is clean and the job succeeds."""
    (tmp_path / "train.py").write_text(TRAIN)
    port_file, stop_file = scratch / "port", scratch / "stop"
    keeper = Announcing(sys.executable, "127.0.0.1", peers="n1", nth=2, port_file=port_file)
    ready(keeper)
    attacker = users["attacker"]
    poisoner = attacker.popen([uids.SYSTEM_PYTHON, str(Path(__file__).with_name("storewire.py")), "poison",
                               str(port_file), str(stop_file), "/default_pg/0//cpu//0/0", "/default_pg/0//cpu//0/1"],
                              attacker.env(), stdout=subprocess.PIPE, text=True)
    run = tmp_path / "run"
    config = LaunchConfig(command=(sys.executable, str(tmp_path / "train.py")), ntasks_per_node=2, run_dir=run,
                          poll_s=0.5, hang_timeout_s=0, max_restarts=3, probe_timeout_s=0, launcher_store=True)
    environ = {**os.environ, "PYTHONPATH": str(uids.REPO), "SLURMD_NODENAME": "n1"}
    bell = Bell("127.0.0.1")
    try:
        launcher = Launcher(config, allocation=["n1"], environ=environ, runner=LocalSteps(), classify_fn=classify,
                            store=keeper, bell=bell)
        code = launcher.run()
    finally:
        stop_file.write_text("")
        poisoned = poisoner.communicate(timeout=30)[0]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    verdicts = [e["verdict"] for e in events if e["event"] == "verdict"]
    assert code == 0 and launcher.attempts == 3, verdicts
    assert int(poisoned) > 0 and all(held is not None for held in keeper.opened)
    assert [e["store"] for e in events if e["event"] == "attempt_start"] == ["launcher"] * 3
    poisoned_verdict = verdicts[1]
    assert (poisoned_verdict["category"], poisoned_verdict["recoverable"]) == ("network", True)
    assert "rendezvous store" in " ".join(poisoned_verdict["evidence"])
    assert [e["event"] for e in events].count("restart_in_place") == 2  # the scripted loss, and the poison: one


def ready(keeper: StoreKeeper) -> StoreKeeper:
    keeper.start()
    deadline = time.monotonic() + 120
    while keeper._proc.poll() is None and not keeper._ready and time.monotonic() < deadline:
        keeper._ready = (keeper._line(1.0) or "").startswith("ready")
    assert keeper._ready, "the keeper did not import torch within 120 s"
    return keeper
