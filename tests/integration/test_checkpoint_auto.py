"""``--ft-ckpt-every=auto``: the Young/Daly interval in the checkpoint manager, in process with an injected clock
and across two real gloo ranks (TCPStore on port 0)."""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from slurm_ft.core import layout
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager
from slurm_ft.train.interval import AdaptiveInterval, AdaptiveIntervalConfig

pytestmark = pytest.mark.gloo


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _manager(ckpt: Path, clock=time.monotonic, every="auto", **interval) -> CheckpointManager:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    cfg = CheckpointConfig(dir=str(ckpt), every=every, async_save=False, keep_last=10,
                           auto_interval=AdaptiveIntervalConfig(**{"min_interval_s": 10.0, **interval}))
    return CheckpointManager(cfg, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), clock=clock)


def _local_state_of(ckpt: Path, step: int) -> dict:
    return torch.load(layout.step_dir(ckpt, step) / "rank_00000.pt", weights_only=False)


def test_first_save_after_min_interval_then_the_daly_interval(tmp_path):
    clock = Clock()
    mgr = _manager(tmp_path, clock, prior_mtbf_s=3600.0)
    saved = []
    for step in range(1, 400):
        clock.now += 1.0  # one second of training per step
        if mgr.maybe_save(step):
            saved.append(step)
            if len(saved) == 1:
                after_first = mgr.stats
    mgr.close()
    assert saved[0] == 10  # min_interval_s of training: the cost gets measured early
    interval, cost = after_first["interval_s"], after_first["cost_s"]
    # Young/Daly for the measured cost and the prior plus 10 s of exposure, never below min_interval_s
    assert 10 <= interval < 400
    assert interval == pytest.approx(max(10.0, math.sqrt(2 * cost * (3600 + 10))), rel=0.05)
    assert saved[1] == 10 + math.ceil(interval)
    assert layout.committed_steps(tmp_path) == saved[-10:]  # keep_last=10


def test_resume_counts_a_failure_but_not_after_an_emergency_save(tmp_path):
    clock = Clock()
    first = _manager(tmp_path, clock, prior_mtbf_s=100.0)
    clock.now += 50.0
    assert first.maybe_save(5)
    first.close()
    stored = _local_state_of(tmp_path, 5)
    assert stored["emergency"] is False and stored["interval"]["exposure_s"] == 50.0
    before = AdaptiveInterval.from_dict(stored["interval"], first.config.auto_interval)

    second = _manager(tmp_path, clock, prior_mtbf_s=100.0)
    assert second.resume() == 5
    stats = second.stats
    assert (stats["failures"], stats["exposure_s"], stats["cost_s"]) == (1, 50.0, stored["interval"]["cost_s"])
    assert stats["mtbf_s"] == pytest.approx(150.0 / 2) and stats["interval_s"] < before.interval_s()

    old = signal.getsignal(signal.SIGUSR1)
    try:
        second.install_signal_handlers(signals=(signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)  # preemption notice: an emergency save, then exit
        assert second.maybe_save(6) and second.exit_requested
    finally:
        second.close()
        signal.signal(signal.SIGUSR1, old)
    assert _local_state_of(tmp_path, 6)["emergency"] is True

    third = _manager(tmp_path, clock, prior_mtbf_s=100.0)
    assert third.resume() == 6
    assert third.stats["failures"] == 1  # a preemption is not a failure
    third.close()


@pytest.mark.parametrize(("cause", "emergency", "failures"), [
    ("preemption", False, 0),  # the emergency save did not make it: the launcher's cause still says preempted
    ("time_limit", False, 0),
    ("hardware_node", True, 1),  # an emergency save, but the restart was for a dead node
    ("", True, 0),  # no cause known: the emergency mark decides
])
def test_the_restart_cause_decides_whether_a_resume_counts_a_failure(tmp_path, monkeypatch, cause, emergency,
                                                                       failures):
    clock = Clock()
    first = _manager(tmp_path, clock, prior_mtbf_s=100.0)
    clock.now += 50.0
    first._save(5, blocking=True, emergency=emergency)
    first.close()
    assert _local_state_of(tmp_path, 5)["emergency"] is emergency
    monkeypatch.setenv("SLURM_FT_RESTART_CAUSE", cause)
    second = _manager(tmp_path, clock, prior_mtbf_s=100.0)
    assert second.resume() == 5 and second.stats["failures"] == failures
    second.close()


def test_a_checkpoint_without_estimator_state_starts_a_fresh_one_with_the_failure(tmp_path):
    plain = _manager(tmp_path, every=2)
    assert plain.maybe_save(2) and "interval_s" not in plain.stats
    plain.close()
    mgr = _manager(tmp_path, prior_mtbf_s=100.0)
    assert mgr.resume() == 2
    assert (mgr.stats["failures"], mgr.stats["mtbf_s"]) == (1, pytest.approx(50.0, abs=1.0))
    mgr.close()


# ---- two real gloo ranks ----
STEP_S = 0.03
GLOO_INTERVAL = {"min_interval_s": 0.2, "prior_mtbf_s": 10.0, "initial_cost_s": 0.05}


def _train_run(rank: int, ckpt: str, steps: int) -> dict:
    """One run of the job: resume, train ``steps`` steps saving in auto mode, close (a restart is a new run)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    cfg = CheckpointConfig(dir=ckpt, every="auto", keep_last=20, collective_timeout_s=30,
                           auto_interval=AdaptiveIntervalConfig(**GLOO_INTERVAL))
    mgr = CheckpointManager(cfg, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    start = mgr.resume()
    resumed = mgr.stats
    saved = []
    for step in range(start + 1, start + steps + 1):
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(STEP_S * (1 + rank))  # rank 1 is slower: its clock must not matter
        if mgr.maybe_save(step):
            saved.append(step)
    mgr.close()
    return {"start": start, "resumed": resumed, "saved": saved, "end": mgr.stats}


def _rank(rank: int, world: int, port: int, ckpt: str, out: str, runs: tuple[int, ...]) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    reports = [_train_run(rank, ckpt, steps) for steps in runs]
    Path(out, f"rank{rank}.json").write_text(json.dumps(reports))
    dist.destroy_process_group()


def test_two_ranks_save_at_the_same_steps_and_the_interval_shrinks_after_a_failure(tmp_path):
    ckpt = tmp_path / "ck"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # port 0: any free port
    mp.start_processes(_rank, args=(2, store.port, str(ckpt), str(tmp_path), (70, 10)), nprocs=2,
                       start_method="spawn", join=True)
    (first0, second0), (first1, second1) = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first0["saved"] == first1["saved"] and len(first0["saved"]) >= 2, (first0, first1)
    # min_interval_s (0.2 s) is several steps: a save is never followed by another at the next step (the
    # agreement started in the step that acted on a due save must not carry the same due save again)
    for saved in (first0["saved"], second0["saved"]):
        assert all(later - earlier > 1 for earlier, later in zip(saved, saved[1:])), saved
    assert first1["end"]["interval_s"] is None  # the estimator lives on rank 0
    end = first0["end"]
    assert end["saves"] == len(first0["saved"]) and end["failed"] == 0 and end["failures"] == 0
    # measured: the first save's cost replaces the prior guess (a bound on its size timed this host, not the code)
    assert end["cost_s"] != GLOO_INTERVAL["initial_cost_s"] and end["write_s"] > 0
    committed = layout.committed_steps(ckpt)
    assert committed[:len(first0["saved"])] == first0["saved"]
    stored = _local_state_of(ckpt, first0["saved"][-1])["interval"]
    before = AdaptiveInterval.from_dict(stored, AdaptiveIntervalConfig(**GLOO_INTERVAL)).interval_s()

    assert second0["start"] == second1["start"] == first0["saved"][-1]
    resumed = second0["resumed"]
    assert resumed["failures"] == stored["failures"] + 1 == 1
    assert resumed["cost_s"] == stored["cost_s"] and resumed["exposure_s"] >= stored["exposure_s"] > 0
    assert resumed["interval_s"] < before  # one failure more: a shorter interval
    assert second0["saved"] == second1["saved"] and second0["saved"]  # min_interval_s into the new run
    assert committed == first0["saved"] + second0["saved"]


def test_example_trainer_reports_the_chosen_interval(tmp_path, capsys):
    from slurm_ft.train import example
    argv = ["--steps", "15", "--ckpt-every", "auto", "--ckpt-min-interval", "0.1", "--mtbf-prior", "30",
            "--step-time", "0.02", "--hidden", "8", "--ckpt-dir", str(tmp_path)]
    capsys.readouterr()
    assert example.main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["checkpoint"]
    assert stats["saves"] >= 1 and stats["failed"] == 0 and stats["failures"] == 0
    assert stats["interval_s"] >= 0.1 and stats["mtbf_s"] >= 30 and stats["cost_s"] < 5.0
    assert layout.committed_steps(tmp_path)
