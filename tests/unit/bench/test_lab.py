"""The lab benchmark's pure parts: what each system submits, the rows and targets it derives, its config."""

import dataclasses
import re
import shlex
import sys
from pathlib import Path

import pytest

from slurm_ft.bench import lab
from slurm_ft.bench.lab_jobs import JobSpec, SlurmFtKnobs, System, Workload, batch_script, sbatch_argv, trainer_argv
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.lab.faults import is_trainer


def _spec(system, nodes=2, **workload):
    return JobSpec(system=system, workload=Workload(**workload), nodes=nodes, dir=Path("/b/j"), name="j",
                   knobs=SlurmFtKnobs(hang_timeout_s=7, spare_nodes=1, min_interval_s=2.0))


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_every_system_trains_the_same_workload_and_only_slurm_ft_saves_asynchronously():
    argvs = {s: trainer_argv(_spec(s, ckpt_every=10)) for s in System}
    for system, argv in argvs.items():
        assert _flag(argv, "-m") == "slurm_ft.train.example"
        assert _flag(argv, "--ckpt-every") == "10" and _flag(argv, "--pg-timeout") == "60"
        assert _flag(argv, "--timeline") == "/b/j/timeline.jsonl" and _flag(argv, "--ckpt-dir") == "/b/j/ckpt"
        assert ("--sync" in argv) == (system is not System.SLURM_FT)
    assert len({tuple(a for a in argv if a != "--sync") for argv in argvs.values()}) == 1


def test_the_reference_run_never_saves_and_auto_is_slurm_ft_only():
    assert _flag(trainer_argv(dataclasses.replace(_spec(System.SLURM_REQUEUE), checkpoint=False)),
                 "--ckpt-every") == str(10**9)
    auto = trainer_argv(_spec(System.SLURM_FT, ckpt_every="auto"))
    assert _flag(auto, "--ckpt-every") == "auto" and _flag(auto, "--ckpt-min-interval") == "2"
    with pytest.raises(ValueError, match="ckpt_every: 'auto' is slurm-ft's"):
        trainer_argv(_spec(System.TORCHRUN, ckpt_every="auto"))


def test_slurm_ft_submits_with_ft_flags_a_spare_and_no_kill():
    argv = sbatch_argv(_spec(System.SLURM_FT, nodes=2))
    assert "--nodes=3" in argv and "--no-kill" in argv and "--ft-spare-nodes=1" in argv
    assert "--ft-hang-timeout=7" in argv and "--ft-ckpt-every=10" in argv and "--ft" in argv
    assert "--requeue" not in argv and argv[-1] == "/b/j/job.sh"
    script = batch_script(_spec(System.SLURM_FT))
    assert " -m slurm_ft.cli launch " in script and "--probe-timeout 5" in script
    assert script.splitlines()[1].startswith("exec ")


def test_the_baselines_requeue_through_slurm_without_ft_flags():
    for system in (System.SLURM_REQUEUE, System.TORCHRUN):
        argv = sbatch_argv(_spec(system, nodes=4))
        assert "--requeue" in argv and "--nodes=4" in argv
        assert not any(a.startswith("--ft") for a in argv) and "--no-kill" not in argv
    script = batch_script(_spec(System.SLURM_REQUEUE, nodes=4))
    assert "srun --kill-on-bad-exit=1 --nodes=4" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and '-lt 5 ]' in script


def test_torchrun_restarts_in_place_under_srun_with_its_own_store_per_attempt():
    script = batch_script(_spec(System.TORCHRUN, nodes=4))
    run = next(line for line in script.splitlines() if line.startswith("exec srun"))
    argv = shlex.split(run)
    assert _flag(argv, "-m") == "torch.distributed.run"
    assert "--nnodes=4" in argv and "--max-restarts=5" in argv and "--rdzv-backend=c10d" in argv
    assert argv[argv.index("--max-restarts=5") + 1:][:2] == ["-m", "slurm_ft.train.example"]
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in script
    assert "scontrol requeue" not in script  # node failures come back through sbatch --requeue only


def test_torchruns_rendezvous_address_is_the_head_nodes_or_the_job_stops():
    """``slurm_ft.slurm.address`` with the job's node count: Slurm's NodeAddr where the name does not resolve, and
    exit 2 with one line where there is none, never the loopback fallback for several hosts."""
    script = batch_script(_spec(System.TORCHRUN, nodes=4))
    [addr] = [line for line in script.splitlines() if line.startswith("addr=")]
    assert addr == f'addr=$({shlex.quote(sys.executable)} -m slurm_ft.slurm.address "$head" 4) || exit 2'
    assert "127.0.0.1" not in script


def test_torchruns_rendezvous_port_is_never_one_of_the_labs_daemon_ports():
    from slurm_ft.lab.ports import PORT_RANGE

    script = batch_script(_spec(System.TORCHRUN, nodes=2))
    line = next(line for line in script.splitlines() if line.startswith("port="))
    base, spread = (int(n) for n in re.fullmatch(r"port=\$\(\((\d+) \+ SLURM_JOB_ID % (\d+)\)\)", line).groups())
    assert base + spread <= PORT_RANGE[0] or base >= PORT_RANGE[1]


def test_is_trainer_tells_the_training_process_from_what_carries_its_command():
    python, train = "/usr/bin/python3.11", ["-m", "slurm_ft.train.example", "--steps", "4"]
    assert is_trainer((python, *train))
    assert is_trainer((python, "-u", *train))  # torchrun's workers
    assert not is_trainer((python, "-m", "torch.distributed.run", "--nnodes=2", *train))
    assert not is_trainer((python, "-m", "slurm_ft.cli", "launch", "--", python, *train))
    assert not is_trainer(("srun", "--nodes=2", python, *train))
    assert not is_trainer(())


def _run(records, spec, faults=(), pending=(), state="COMPLETED", restarts=0):
    from slurm_ft.slurm.types import JobState

    run = lab.Run(spec=spec, job_id=7, state=JobState(state), restarts=restarts, records=list(records))
    run.faults = list(faults)
    run.pending_spans = [list(p) for p in pending]
    return run


def _steps(first, last, t0, dt=1.0):
    return [{"ev": "step", "step": s, "t0": t0 + i * dt, "t1": t0 + (i + 1) * dt}
            for i, s in enumerate(range(first, last + 1))]


# a requeued run: steps 1..8 (2..10), a kill at 10.2, all ranks gone at 11, pending 12..40, resumed from 5
REQUEUED = ([{"ev": "launch", "t": 0.0}, {"ev": "start", "t": 2.0, "resumed_from": 0}] + _steps(1, 8, 2.0)
            + [{"ev": "launch", "t": 41.0}, {"ev": "start", "t": 43.0, "resumed_from": 5}] + _steps(6, 10, 43.0)
            + [{"ev": "end", "t": 48.0, "step": 10}])


def test_fault_row_reads_detection_recovery_queue_and_params():
    spec = _spec(System.SLURM_REQUEUE, steps=10)
    run = _run(REQUEUED, spec, [lab.Injected(kind="kill-rank", time=10.2, rank=1, node="n2", pids=(1, 2),
                                             torn_down_at=11.0)], pending=[(12.0, 40.0)], restarts=1)
    run.result = {"param_sha256": "abc"}
    row = lab.fault_row(run, "kill-rank", reference="abc")
    assert row["detection_s"] == pytest.approx(0.8) and row["recovery_s"] == pytest.approx(44.0 - 10.2)
    assert row["queue_wait_s"] == pytest.approx(28.0) and row["steps_lost"] == 3 and row["requeues"] == 1
    assert row["completed"] is True and row["params_equal"] is True
    assert row["relaunch_s"] == pytest.approx(41.0 - 10.2) and row["resume_s"] == pytest.approx(2.0)
    assert row["restart_cpu_s"] is None  # these records carry no cpu
    assert lab.fault_row(run, "kill-rank", reference="def")["params_equal"] is False


def test_ettr_row_splits_the_lost_time_into_detection_queue_recovery_and_rework():
    spec = _spec(System.SLURM_REQUEUE, steps=10)
    run = _run(REQUEUED, spec, [lab.Injected(kind="kill-rank", time=10.2, rank=1, node="n2", pids=(1,),
                                             torn_down_at=11.0)], pending=[(12.0, 40.0)])
    row = lab.ettr_row(run, baseline_every=5)
    assert row["ettr"] == pytest.approx(10 / 48.0)
    over = row["overhead_s"]
    assert over["detection"] == pytest.approx(0.8) and over["queue_wait"] == pytest.approx(28.0)
    assert over["recovery"] == pytest.approx((12.0 - 11.0) + (44.0 - 40.0))
    assert over["rework"] == pytest.approx(3.0) and row["lost_s"] == pytest.approx(38.0)
    assert row["interval_steps"] == 5 and row["faults"] == ["kill-rank"]


def _payload():
    faults = []
    for system, recovery in ((System.SLURM_FT, 6.0), (System.SLURM_REQUEUE, 45.0), (System.TORCHRUN, 7.0)):
        faults.append({"nodes": 2, "fault": "kill-rank", "system": system.value, "recovery_s": recovery,
                       "detection_s": 1.0, "queue_wait_s": 30.0 if system is System.SLURM_REQUEUE else 0.0})
    faults.append({"nodes": 2, "fault": "hang", "system": System.SLURM_FT.value, "recovery_s": 16.0,
                   "detection_s": 14.0})
    faults.append({"nodes": 2, "fault": "hang", "system": System.SLURM_REQUEUE.value, "recovery_s": 100.0,
                   "detection_s": 61.0})
    ettr = [{"system": System.SLURM_FT.value, "ettr": 0.96, "lost_s": 40.0},
            {"system": System.SLURM_REQUEUE.value, "ettr": 0.7, "lost_s": 400.0},
            {"system": System.TORCHRUN.value, "ettr": 0.9, "lost_s": 30.0}]
    tput = [{"model": "medium", "nodes": 2, "slurm-ft_stall_s": 0.02, "sync_stall_s": 0.08}]
    return {"faults": faults, "ettr": ettr, "throughput": tput}


def _config(**kw):
    kw = {"nodes": (2,), **kw}
    return lab.LabBenchConfig(dir=Path("/tmp/x"), out=Path("/tmp/x/out"), models=("medium",),
                              knobs=SlurmFtKnobs(hang_timeout_s=10.0), **kw)


def test_targets_compare_within_the_run_and_say_which_held():
    checks = {c["target"]: c for c in lab.check_targets(_payload(), _config())}
    crash = next(c for t, c in checks.items() if t.startswith("rank crash"))
    assert crash["value"] == 7.5 and crash["met"]
    hang = next(c for t, c in checks.items() if t.startswith("hang"))
    assert hang["value"] == 14.0 and hang["met"] and "15 s" in next(t for t in checks if t.startswith("hang"))
    assert checks["lab ETTR under a fault every 300 s >= 0.95"]["met"]
    assert checks["less lost time than slurm --requeue in the same run"]["met"]
    assert not checks["less lost time than torchrun --max-restarts in the same run"]["met"]


def test_recovery_growth_compares_the_largest_size_with_the_smallest():
    payload = _payload()
    payload["faults"].append({"nodes": 8, "fault": "kill-rank", "system": System.SLURM_FT.value,
                              "recovery_s": 15.0, "detection_s": 1.0})
    checks = lab.check_targets(payload, _config(nodes=(2, 8)))
    growth = next(c for c in checks if "grows" in c["target"])
    assert growth["target"] == "rank crash: recovery grows at most 2x from 2 to 8 nodes"
    assert growth["value"] == 2.5 and not growth["met"]
    payload["faults"][-1]["recovery_s"] = 9.0
    assert next(c for c in lab.check_targets(payload, _config(nodes=(2, 8))) if "grows" in c["target"])["met"]
    assert not any("grows" in c["target"] for c in lab.check_targets(_payload(), _config()))  # one size


def test_measured_costs_are_in_the_simulators_terms():
    from slurm_ft.bench.sim import SimCosts

    costs = lab.measured_costs(_payload(), _config())
    assert costs == {"detect_crash_s": 1.0, "restart_in_alloc_s": 5.0, "detect_hang_s": 14.0,
                     "baseline_detect_hang_s": 61.0, "requeue_wait_s": 30.0, "checkpoint_stall_s": 0.02,
                     "checkpoint_write_s": 0.08}
    assert SimCosts.from_mapping(costs, source="lab").restart_in_alloc_s == 5.0


def test_the_baselines_interval_is_young_daly_for_their_own_cost():
    from slurm_ft.train.interval import young_daly_interval

    assert lab.baseline_interval_steps(0.2, 300.0, 0.5) == round(young_daly_interval(0.2, 300.0) / 0.5)
    assert lab.baseline_interval_steps(None, 300.0, 0.5) == round(young_daly_interval(1.0, 300.0) / 0.5)
    assert lab.baseline_interval_steps(0.01, 1.0, 10.0) == 1


def test_lab_size_fits_the_biggest_job_with_its_spare_or_the_ettr_jobs_at_once():
    assert _config(phases=("faults",)).lab_nodes == 2 + 1 + 1
    assert lab.LabBenchConfig(dir=Path("/x"), out=Path("/o"), nodes=(1, 8)).lab_nodes == 8 + 1 + 1
    assert _config(phases=("ettr",), ettr_nodes=2).lab_nodes == 3 * 2 + 1 + 1


@pytest.mark.parametrize("argv, words", [
    (["--phases", "faults,nope"], ["phases", "'nope'"]),
    (["--faults", "meteor"], ["faults", "'meteor'"]),
    (["--nodes", "0"], ["nodes", "[0]"]),
    (["--models", "huge"], ["model", "'huge'"]),
    (["--fault-step", "40"], ["fault_step", "--fault-step", "40"]),
    (["--systems", "ft,slurm"], ["systems", "'slurm'"]),
])
def test_bad_arguments_are_one_clear_error(argv, words):
    with pytest.raises(SlurmFtError) as err:
        lab.config_from_args(lab.parse_args([*argv, "--dir", "/tmp/never-made"]))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_systems_are_picked_by_their_short_names():
    picked = lab.config_from_args(lab.parse_args(["--systems", "ft,torchrun", "--dir", "/tmp/q"])).systems
    assert picked == (System.SLURM_FT, System.TORCHRUN)
    assert lab.config_from_args(lab.parse_args(["--dir", "/tmp/q"])).systems == tuple(System)


def test_quick_shrinks_the_run_and_flags_win_over_it():
    quick = lab.config_from_args(lab.parse_args(["--quick", "--dir", "/tmp/q"]))
    assert quick.nodes == (1, 2) and quick.models == ("medium",) and quick.fault_every_s == 60.0
    assert lab.config_from_args(lab.parse_args(["--quick", "--nodes", "4", "--dir", "/tmp/q"])).nodes == (4,)


def test_save_gaps_are_measured_within_an_attempt():
    records = [{"ev": "start", "t": 0.0}, {"ev": "save", "t0": 10.0, "t1": 10.1}, {"ev": "save", "t0": 25.0, "t1": 25.1},
               {"ev": "start", "t": 40.0}, {"ev": "save", "t0": 50.0, "t1": 50.1},
               {"ev": "save", "t0": 56.5, "t1": 56.6}]
    assert lab.save_gaps(records) == [15.0, 6.5]  # not 25 -> 50 across the restart


@pytest.mark.parametrize("flag, value", [("--mtbf-prior", "0"), ("--hang-timeout", "-1")])
def test_a_bad_knob_is_one_error_naming_it(flag, value):
    with pytest.raises(SlurmFtError, match=r"bench lab: (mtbf_prior_s|hang_timeout_s): must be > 0"):
        lab.config_from_args(lab.parse_args([flag, value, "--dir", "/tmp/q"]))


def test_a_running_job_is_stalled_only_while_its_timeline_does_not_grow():
    """torchrun's job once hung after a node death with no step for 14 minutes; the bench now cancels such a job
    after ``stall_cancel_s`` instead of waiting out the whole ETTR budget."""
    run = _run(REQUEUED[:3], _spec(System.TORCHRUN, steps=10), state="RUNNING")
    assert run.stalled_for(100.0) == 0.0
    assert run.stalled_for(400.0) == 300.0
    run.records.append({"ev": "step", "step": 2, "t0": 401.0, "t1": 402.0})
    assert run.stalled_for(450.0) == 0.0  # a new record: progress
    from slurm_ft.slurm.types import JobState

    run.state = JobState.PENDING  # requeued and waiting for nodes: not a stall
    assert run.stalled_for(2000.0) == 0.0
    run.state = JobState.RUNNING
    assert run.stalled_for(2100.0) == 0.0 and run.stalled_for(2200.0) == 100.0


def test_the_stall_limit_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="stall_cancel_s"):
        lab.LabBenchConfig(dir=tmp_path, out=tmp_path, stall_cancel_s=0)


def test_jobs_live_in_the_shared_lab_dir_when_the_nodes_are_hosts():  # every node's /tmp is its own there
    assert lab.jobs_dir(Path("/tmp/b"), Path("/tmp/b/lab"), hosts=True) == Path("/tmp/b/lab/jobs")
    assert lab.jobs_dir(Path("/tmp/b"), Path("/tmp/b/lab"), hosts=False) == Path("/tmp/b/jobs")
