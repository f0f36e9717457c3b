"""Training-side units: checkpoint config, heartbeats, error files, trainer argument parsing."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.core import rundir as records
from slurm_ft.core.errors import SlurmFtError
from slurm_ft.train.errors import record_errors
from slurm_ft.train.heartbeat import HeartbeatWriter


def test_train_package_import_is_torch_free():
    import subprocess
    code = "import sys, slurm_ft.train, slurm_ft.core.layout, slurm_ft.train.heartbeat; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_train_package_exports_resolve_lazily():
    import slurm_ft.train as train
    from slurm_ft.train.checkpoint import CheckpointManager
    from slurm_ft.train.topology import revalidate
    assert train.CheckpointManager is CheckpointManager and train.revalidate is revalidate
    assert callable(train.record_errors) and train.HeartbeatWriter.__name__ == "HeartbeatWriter"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        train.nope


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"dir": ""}, "dir"), ({"dir": "/x", "every": 0}, "every"), ({"dir": "/x", "keep_last": 0}, "keep_last"),
    ({"dir": "/x", "keep_every": -1}, "keep_every"), ({"dir": "/x", "every": "5"}, "every"),
    ({"dir": "/x", "emergency_deadline_s": 0}, "emergency_deadline_s"), ({"dir": "/x", "async_save": 1}, "async_save"),
    ({"dir": "/x", "verify": "yes"}, "verify"), ({"dir": "/x", "write_threads": 0}, "write_threads"),
    ({"dir": "/x", "collective_timeout_s": -1}, "collective_timeout_s"),
    ({"dir": "/x", "reuse_staging_buffers": None}, "reuse_staging_buffers"),
    ({"dir": "/x", "adopt": "1"}, "adopt"), ({"dir": "/x", "run_id": ""}, "run_id"), ({"dir": "/x", "run_id": 7}, "run_id"),
    ({"dir": "/x", "run_id": "a\nb"}, "run_id"), ({"dir": "/x", "agree_every_s": -1}, "agree_every_s"),
    ({"dir": "/x", "agree_every_s": True}, "agree_every_s"),
])
def test_checkpoint_config_names_bad_field(kwargs, field):
    from slurm_ft.train.checkpoint import CheckpointConfig
    with pytest.raises(ValueError, match=f"^{field}: "):
        CheckpointConfig(**kwargs)


def test_checkpoint_config_from_env_precedence():
    from slurm_ft.train.checkpoint import CheckpointConfig
    cfg = CheckpointConfig.from_env({"SLURM_SPANK_FT_CKPT_DIR": "/spank", "SLURM_FT_CKPT_DIR": "/ft",
                                     "SPANK_FT_CKPT_EVERY": "7"})
    assert (cfg.dir, cfg.every) == ("/ft", 7)
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft"}, every=3, keep_last=2).every == 3
    with pytest.raises(SlurmFtError, match="'seven'"):
        CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft", "SLURM_FT_CKPT_EVERY": "seven"})
    with pytest.raises(SlurmFtError, match="^dir: "):
        CheckpointConfig.from_env({})


def test_checkpoint_config_from_env_run_identity_and_adopt():
    from slurm_ft.train.checkpoint import CheckpointConfig
    ck = {"SLURM_FT_CKPT_DIR": "/ft"}
    assert (CheckpointConfig.from_env(ck).run_id, CheckpointConfig.from_env(ck).adopt) == (None, False)
    assert CheckpointConfig.from_env({**ck, "SLURM_JOB_ID": "42"}).run_id == "42"  # a requeued job keeps it
    assert CheckpointConfig.from_env({**ck, "SLURM_JOB_ID": "42", "SLURM_FT_RUN_ID": "pretrain"}).run_id == "pretrain"
    assert CheckpointConfig.from_env({**ck, "SLURM_FT_CKPT_ADOPT": "1"}).adopt
    assert not CheckpointConfig.from_env({**ck, "SLURM_FT_CKPT_ADOPT": "0"}, adopt=None).adopt
    assert CheckpointConfig.from_env(ck, adopt=True, run_id="x").run_id == "x"
    with pytest.raises(SlurmFtError, match="^adopt: CKPT_ADOPT must be 1 or 0, got 'yes'"):
        CheckpointConfig.from_env({**ck, "SLURM_FT_CKPT_ADOPT": "yes"})


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"every": "Auto"}, "every"), ({"every": "autox"}, "every"), ({"every": -1}, "every"), ({"every": True}, "every"),
    ({"every": 2.0}, "every"), ({"every": "auto", "auto_interval": {"min_interval_s": 5}}, "auto_interval"),
])
def test_checkpoint_config_auto_names_bad_field(kwargs, field):
    from slurm_ft.train.checkpoint import CheckpointConfig
    with pytest.raises(ValueError, match=f"^{field}: .*'auto'" if field == "every" else f"^{field}: "):
        CheckpointConfig(dir="/x", **kwargs)


def test_checkpoint_config_auto_and_its_defaults():
    from slurm_ft.train.checkpoint import CheckpointConfig
    from slurm_ft.train.interval import AdaptiveIntervalConfig
    cfg = CheckpointConfig(dir="/x", every="auto")
    assert cfg.auto and (cfg.auto_interval.min_interval_s, cfg.auto_interval.prior_mtbf_s) == (10.0, 6 * 3600.0)
    assert not CheckpointConfig(dir="/x", every=5).auto
    mine = AdaptiveIntervalConfig(min_interval_s=2.0, prior_mtbf_s=60.0)
    assert CheckpointConfig(dir="/x", every="auto", auto_interval=mine).auto_interval is mine
    with pytest.raises(ValueError, match="^min_interval_s: "):  # the estimator's own config names its field
        AdaptiveIntervalConfig(min_interval_s=0)


def test_checkpoint_config_from_env_auto():
    from slurm_ft.train.checkpoint import CheckpointConfig
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft", "SLURM_FT_CKPT_EVERY": "auto"}).auto
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft", "SPANK_FT_CKPT_EVERY": "auto"}).every == "auto"
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft", "SLURM_FT_CKPT_EVERY": "auto"}, every=4).every == 4
    with pytest.raises(SlurmFtError, match="^every: .*'autox'"):
        CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/ft", "SLURM_FT_CKPT_EVERY": "autox"})


def test_example_ckpt_every_auto_flags(monkeypatch):
    from slurm_ft.train import example
    args = example.parse_args(["--steps", "3", "--ckpt-dir", "/x", "--ckpt-every", "auto", "--ckpt-min-interval",
                               "2.5", "--mtbf-prior", "600"])
    assert args.ckpt_every == "auto"
    assert (args.auto_interval.min_interval_s, args.auto_interval.prior_mtbf_s) == (2.5, 600.0)
    assert example.parse_args(["--steps", "3", "--ckpt-dir", "/x", "--ckpt-every", "7"]).ckpt_every == 7
    monkeypatch.setenv("SLURM_FT_CKPT_EVERY", "auto")
    assert example.parse_args(["--steps", "3", "--ckpt-dir", "/x"]).ckpt_every == "auto"
    monkeypatch.delenv("SLURM_FT_CKPT_EVERY")
    for bad in (["--ckpt-every", "autox"], ["--ckpt-every", "0"], ["--ckpt-min-interval", "0"],
                ["--mtbf-prior", "-1"]):
        with pytest.raises(SystemExit):
            example.parse_args(["--steps", "3", "--ckpt-dir", "/x", *bad])


def test_heartbeat_writes_record_and_respects_interval(tmp_path):
    now = [100.0]
    writer = HeartbeatWriter(tmp_path, 3, interval_s=5.0, clock=lambda: now[0])
    assert writer.beat(1)
    now[0] = 102.0
    assert not writer.beat(2)
    assert writer.beat(2, force=True)
    [beat] = records.read_heartbeats(tmp_path)
    assert (beat.rank, beat.step, beat.time) == (3, 2, 102.0)
    with pytest.raises(ValueError, match="rank"):
        HeartbeatWriter(tmp_path, -1)


def test_a_heartbeat_that_cannot_be_written_does_not_end_training(tmp_path, caplog):
    """A run dir gone read-only or full (here: a file in its place) is said once; training goes on."""
    blocked = tmp_path / "run"
    blocked.write_text("not a directory")
    writer = HeartbeatWriter(blocked, 0, liveness_s=0, stacks=False)
    assert writer.beat(1) is False and writer.beat(2) is False
    assert [r.message for r in caplog.records].count(next(iter(m.message for m in caplog.records))) == 1
    assert "cannot write its heartbeat" in caplog.text and "training goes on" in caplog.text
    blocked.unlink()
    blocked.mkdir()
    assert writer.beat(3) is True and records.read_heartbeats(blocked)[0].step == 3


def test_record_errors_writes_error_file_and_reraises(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with record_errors(tmp_path, 1, clock=lambda: 5.0) as tracker:
            tracker.step = 42
            1 / 0
    [err] = records.read_errors(tmp_path)
    assert (err.rank, err.exc_type, err.step, err.time) == (1, "ZeroDivisionError", 42, 5.0)
    assert "1 / 0" in err.traceback


def test_record_errors_ignores_clean_exit(tmp_path):
    with pytest.raises(SystemExit):
        with record_errors(tmp_path, 0):
            raise SystemExit(0)
    assert records.read_errors(tmp_path) == []


def test_example_fault_spec_parsing():
    from slurm_ft.train import example
    args = example.parse_args(["--steps", "3", "--ckpt-dir", "/x", "--fail-at", "1:7"])
    assert args.fail_at == (1, 7) and args.crash_at is None
    with pytest.raises(SystemExit):
        example.parse_args(["--steps", "3", "--ckpt-dir", "/x", "--crash-at", "one"])


def test_example_world_from_torchrun_or_srun_env():
    from slurm_ft.train.example import _world, rendezvous_env
    assert _world({}) == (0, 1, 0)
    assert _world({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "0"}) == (3, 4, 1)
    assert _world({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}) == (5, 8, 1)
    import socket

    from slurm_ft.slurm.address import master_addr
    host = socket.gethostname()
    environ = {"SLURM_STEP_NODELIST": host, "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123"}
    rendezvous_env(environ)  # rank 0 runs on the step's first node
    assert (environ["MASTER_ADDR"], environ["MASTER_PORT"]) == (master_addr(host, {}, nodes=1), "20123")
    kept = {"MASTER_ADDR": "head", "MASTER_PORT": "1234", "SLURM_JOB_NODELIST": "n1"}
    rendezvous_env(kept)
    assert (kept["MASTER_ADDR"], kept["MASTER_PORT"]) == ("head", "1234")


def test_example_data_position_round_trips():
    import torch

    from slurm_ft.train.example import SyntheticData
    data = SyntheticData(0, 0, 1, torch.device("cpu"))
    data.next(), data.next()
    third = data.next()[0]
    again = SyntheticData(0, 0, 1, torch.device("cpu"))
    again.load_state_dict({"position": 2})
    assert again.next()[0].equal(third) and again.state_dict() == {"position": 3}


def test_example_batches_are_a_pure_function_of_seed_and_step():
    from slurm_ft.train.example import batch
    x1, _ = batch(0, 5, 0, 1)
    x2, _ = batch(0, 5, 0, 1)
    assert x1.equal(x2) and not x1.equal(batch(0, 6, 0, 1)[0])
    halves = [batch(0, 5, r, 2)[0] for r in (0, 1)]
    assert halves[0].shape[0] + halves[1].shape[0] == x1.shape[0]


def test_heartbeat_liveness_thread_beats_without_progress(tmp_path):
    writer = HeartbeatWriter(tmp_path, 2, liveness_s=0.05, stacks=False)
    writer.beat(7)
    first = records.read_heartbeats(tmp_path)[0]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        [beat] = records.read_heartbeats(tmp_path)
        if beat.alive != first.alive:
            break
        time.sleep(0.02)
    writer.close()
    assert (beat.step, beat.time) == (7, first.time) and beat.alive > first.alive  # liveness, not progress


def test_heartbeat_stack_signal_dumps_every_thread(tmp_path):
    writer = HeartbeatWriter(tmp_path, 5, liveness_s=0)
    writer.beat(1)
    [beat] = records.read_heartbeats(tmp_path)
    assert beat.stack_signal == records.STACK_SIGNAL and beat.alive is None
    os.kill(os.getpid(), beat.stack_signal)
    deadline = time.monotonic() + 10
    path = records.stack_path(tmp_path, 5)
    while time.monotonic() < deadline and not (path.exists() and "File" in path.read_text()):
        time.sleep(0.02)
    assert "test_heartbeat_stack_signal_dumps_every_thread" in records.stack_path(tmp_path, 5).read_text()


def test_end_records_of_the_wrong_shape_are_no_evidence(tmp_path):
    import json

    records.write_end(tmp_path, records.RankEnd(rank=1, time=2.0, host="n1", signal=9))
    (tmp_path / "end.rank2.json").write_text(json.dumps({"rank": 2, "time": "soon", "signal": 9}))
    (tmp_path / "end.rank3.json").write_text(json.dumps({"rank": True, "time": 1.0}))
    (tmp_path / "end.rank4.json").write_text(json.dumps({"rank": 4, "time": 1, "exit_code": 1, "tail": ["x"]}))
    assert [e.rank for e in records.read_ends(tmp_path)] == [1]
    (tmp_path / "hang.rank5.json").write_text(json.dumps({"rank": 5, "state": 7}))
    assert records.read_rank_states(tmp_path) == []


class _RunsCode:
    """A pickled callable: what a writer of a shared checkpoint dir could plant in a rank's local state."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/slurm-ft-pwned-by-local-state",))


def test_local_state_is_loaded_without_running_pickled_code(tmp_path):
    import torch

    from slurm_ft.train.checkpoint import _rng_state, load_local_state

    good = tmp_path / "local.rank0.pt"
    torch.save({"step": 4, "rng": _rng_state(), "extra": {"loader": {"epoch": 1, "order": torch.arange(3)}}}, good)
    assert load_local_state(good)["step"] == 4  # tensors, containers and NumPy's RNG arrays load
    planted = tmp_path / "planted.pt"
    torch.save({"step": _RunsCode()}, planted)
    Path("/tmp/slurm-ft-pwned-by-local-state").unlink(missing_ok=True)
    with pytest.raises(Exception, match="Weights only load failed"):
        load_local_state(planted)
    assert not Path("/tmp/slurm-ft-pwned-by-local-state").exists()


def test_a_closed_heartbeat_says_done_once_and_closing_runs_at_exit(tmp_path, monkeypatch):
    import atexit

    from slurm_ft.core.rundir import read_heartbeats
    from slurm_ft.train.heartbeat import HeartbeatWriter

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    heart = HeartbeatWriter(tmp_path, 0, liveness_s=0, stacks=False)
    heart.beat(7)
    assert [b.done for b in read_heartbeats(tmp_path)] == [False]
    assert registered == [heart.close]  # a script that never closes it still says done when its process exits
    heart.close()
    heart.close()
    (beat,) = read_heartbeats(tmp_path)
    assert (beat.step, beat.done) == (7, True)
