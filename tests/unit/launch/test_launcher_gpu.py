"""The launcher's GPU side: the reclaim wait before a restart, a held GPU as evidence, binding, NCCL settings."""

from __future__ import annotations

from slurm_ft.classify import classify
from slurm_ft.core.rundir import GpuBinding, RankEnd, write_end, write_gpu_binding
from slurm_ft.health.records import GpuHold
from slurm_ft.launch.launcher import EX_TEMPFAIL, LaunchConfig, Launcher
from slurm_ft.launch.rank_env import nccl_defaults
from slurm_ft.launch.reclaim import Reclaimed
from tests.unit.launch.test_launcher import Clock, Runner, Script, events, lab_addr


class KilledRank(Script):
    """An attempt whose rank 1 (on n2, GPU 1) is SIGKILLed: its wrapper's end record, its binding record."""

    def poll(self):
        code = super().poll()
        if code is not None and code != 0:
            write_gpu_binding(self.run_dir, GpuBinding(rank=1, host="n2", devices="1", index=1, uuid="GPU-b"))
            write_end(self.run_dir, RankEnd(rank=1, time=1.0, host="n2", pid=4242, signal=9))
        return code


class Reclaim:
    """The per-node helpers, scripted: each call returns the next answer."""

    def __init__(self, *answers: Reclaimed) -> None:
        self.answers, self.calls = list(answers), []

    def __call__(self, nodes, run_dir, attempt):
        self.calls.append((list(nodes), attempt))
        return self.answers.pop(0)


HELD = GpuHold(node="n2", gpu_index=1, uuid="GPU-b", pci_bus="0000:2a:00", pids=(4242,), used_mb=30000,
               waited_s=30.0)


def make(tmp_path, scripts, reclaim, *, allocation=("n1", "n2"), environ=None, comments=None, **cfg):
    clock = Clock()
    cfg = {"hang_timeout_s": 10.0, **cfg}
    config = LaunchConfig(command=("python", "train.py"), run_dir=tmp_path / "run", poll_s=1.0, startup_grace_s=5.0,
                          kill_grace_s=3.0, **cfg)
    runner = Runner(scripts)
    launcher = Launcher(config, allocation=allocation, environ=environ or {"PATH": "/bin"}, runner=runner,
                        classify_fn=classify, clock=clock, sleep=clock.sleep, port=lambda: 29500, addr_of=lab_addr,
                        set_comment=comments.append if comments is not None else None, reclaim=reclaim)
    return launcher, runner


def test_released_gpus_restart_in_place_after_the_wait(tmp_path):
    run = tmp_path / "run"
    reclaim = Reclaim(Reclaimed(waited_s={"n1": 0.0, "n2": 2.1}))
    launcher, runner = make(tmp_path, [KilledRank(run, code=1), Script(run)], reclaim)
    assert launcher.run() == 0
    assert reclaim.calls == [(["n1", "n2"], 1)]
    kinds = [e["event"] for e in events(tmp_path)]
    assert kinds.index("gpu_reclaim") < kinds.index("verdict") < kinds.index("restart_in_place")
    waited = next(e for e in events(tmp_path) if e["event"] == "gpu_reclaim")
    assert waited["waited_s"] == {"n1": 0.0, "n2": 2.1} and waited["held"] == [] and waited["attempt"] == 1
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n2"]


def test_a_gpu_held_at_the_bound_is_hardware_gpu_and_its_node_is_swapped_for_the_spare(tmp_path):
    run = tmp_path / "run"
    reclaim = Reclaim(Reclaimed(held=(HELD,), waited_s={"n1": 0.0, "n2": 30.0}))
    launcher, runner = make(tmp_path, [KilledRank(run, code=1), Script(run)], reclaim,
                            allocation=("n1", "n2", "n3"), spare_nodes=1, max_restarts=0)
    assert launcher.run() == 0  # a membership change uses no retry
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n3"]
    verdict = next(e for e in events(tmp_path) if e["event"] == "verdict")["verdict"]
    assert verdict["category"] == "hardware_gpu" and verdict["culprit"]["nodes"] == ["n2"]
    assert verdict["evidence"][0].startswith("n2 GPU 1 (0000:2a:00): 30000 MiB of the failed attempt's pid 4242")
    assert next(e for e in events(tmp_path) if e["event"] == "spare_swap")["out"] == ["n2"]
    held = next(e for e in events(tmp_path) if e["event"] == "gpu_reclaim")["held"]
    assert [(h["node"], h["gpu_index"]) for h in held] == [("n2", 1)]
    assert runner.calls[1][1]["SLURM_FT_RESTART_CAUSE"] == "hardware_gpu"


def test_a_held_gpu_without_a_spare_leaves_its_node_out_at_once(tmp_path):
    run = tmp_path / "run"
    comments = []
    launcher, _ = make(tmp_path, [KilledRank(run, code=1)], Reclaim(Reclaimed(held=(HELD,))), comments=comments,
                       node_fail_wait_s=60.0)
    assert launcher.run() == EX_TEMPFAIL
    assert comments == ["slurm-ft: tempfail bad_nodes=n2 attempts=1"]  # the monitor requeues the job without n2
    kinds = [e["event"] for e in events(tmp_path)]
    assert "node_fail_wait" not in kinds  # Slurm never declares a held GPU: no waiting for it
    assert events(tmp_path)[-1]["bad"] == ["n2"]


def test_only_the_nodes_that_run_again_are_waited_on_and_a_cpu_job_not_at_all(tmp_path):
    run = tmp_path / "run"
    reclaim = Reclaim(Reclaimed(waited_s={"n1": 0.0}))
    launcher, runner = make(tmp_path, [KilledRank(run, code=1), Script(run)], reclaim,
                            allocation=("n1", "n2", "n3"), spare_nodes=1)
    launcher.probe = lambda nodes, since: {"n2": "probe step failed (exit 1)"}
    assert launcher.run() == 0
    assert reclaim.calls == [(["n1"], 1)]  # n2 failed the probe: it is out anyway
    assert [c[0][4] for c in runner.calls] == ["--nodelist=n1,n2", "--nodelist=n1,n3"]

    cpu = tmp_path / "cpu"
    reclaim = Reclaim()
    launcher, _ = make(cpu, [Script(cpu / "run", code=1), Script(cpu / "run")], reclaim)
    assert launcher.run() == 0 and reclaim.calls == []  # no GPU records, no GPUs from Slurm: no helpers


def test_a_job_with_gpus_from_slurm_is_waited_on_even_before_a_rank_recorded_one(tmp_path):
    run = tmp_path / "run"
    reclaim = Reclaim(Reclaimed(waited_s={"n1": 0.0, "n2": 0.0}))
    launcher, _ = make(tmp_path, [Script(run, code=1), Script(run)], reclaim, environ={"SLURM_JOB_GPUS": "0,1"})
    assert launcher.run() == 0 and len(reclaim.calls) == 1


def test_zero_turns_the_wait_off(tmp_path):
    run = tmp_path / "run"
    reclaim = Reclaim()
    launcher, _ = make(tmp_path, [KilledRank(run, code=1), Script(run)], reclaim, gpu_reclaim_timeout_s=0)
    assert launcher.run() == 0 and reclaim.calls == []


def test_each_attempts_gpu_and_reclaim_records_are_archived_with_it(tmp_path):
    run = tmp_path / "run"

    def reclaim(nodes, run_dir, attempt):
        (run_dir / "reclaim.n1.json").write_text("{}")
        return Reclaimed()

    launcher, _ = make(tmp_path, [KilledRank(run, code=1), Script(run)], reclaim)
    assert launcher.run() == 0
    assert {p.name for p in (run / "attempt-1").iterdir()} >= {"gpu.rank1.json", "reclaim.n1.json"}
    assert not (run / "reclaim.n1.json").exists()


def test_ranks_get_nccl_fault_settings_but_keep_the_users_and_are_bound_to_gpus(tmp_path):
    run = tmp_path / "run"
    user = {"PATH": "/bin", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "900", "NCCL_ASYNC_ERROR_HANDLING": "1"}
    launcher, runner = make(tmp_path, [Script(run)], Reclaim(), environ=user, hang_timeout_s=120.0)
    assert launcher.run() == 0
    argv, env = runner.calls[0]
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "900"  # the user's, not ours
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env and env["NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT"} & set(nccl_defaults({}, hang_timeout_s=120.0))
    assert "CUDA_VISIBLE_DEVICES" in argv[argv.index("-c") + 1]  # the per-rank line binds the GPUs

    unbound = tmp_path / "unbound"
    launcher, runner = make(unbound, [Script(unbound / "run")], Reclaim(), gpu_bind=False)
    assert launcher.run() == 0
    argv, env = runner.calls[0]
    assert "CUDA_VISIBLE_DEVICES" not in argv[argv.index("-c") + 1]
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "10"
