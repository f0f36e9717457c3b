"""``slurm-ft bench lab`` end to end on its own lab, shrunk to one node, the small model and one fault type.

It checks what the benchmark measures and records, never how fast: every system finishes the same training
with the same final parameters, slurm-ft recovers inside the allocation, the requeue baseline goes through the
queue, and the outputs hold every figure.
"""

from __future__ import annotations

import json

import pytest

from slurm_ft.bench import lab as bench_lab
from slurm_ft.bench.lab_jobs import SlurmFtKnobs, System, Workload

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def test_bench_lab_runs_every_phase_and_records_every_figure(lab, tmp_path):  # `lab`: skipped where none can run
    config = bench_lab.LabBenchConfig(
        dir=tmp_path / "bench", out=tmp_path / "out", nodes=(1,), models=("small",), faults=("kill-rank",),
        workload=Workload(model="small", steps=24, step_time_s=0.2, ckpt_every=5, collective_timeout_s=30.0),
        knobs=SlurmFtKnobs(hang_timeout_s=10.0, min_interval_s=2.0), fault_step=9,
        ettr_nodes=1, ettr_minutes=1.0, ettr_step_time_s=0.3, fault_every_s=30.0, run_timeout_s=300.0)
    lines: list[str] = []
    payload = bench_lab.run_bench(config, lines.append)
    notes = bench_lab.write_outputs(config.out, payload)

    (tput,) = payload["throughput"]
    assert tput["model"] == "small" and tput["nodes"] == 1
    for label in ("reference", "slurm-ft", "sync"):
        assert tput[f"{label}_steps_per_s"] > 0 and tput[f"{label}_sha256"] == tput["reference_sha256"]
    assert tput["reference_stall_s"] is None  # the reference run never saves
    assert tput["slurm-ft_stall_s"] > 0 and tput["sync_stall_s"] > 0 and tput["sync_yd_interval_s"] > 0

    faults = {row["system"]: row for row in payload["faults"]}
    assert set(faults) == {s.value for s in System}
    for row in faults.values():
        assert row["completed"] and row["params_equal"] is True, row
        assert row["fault_step"] >= 9 and 0 <= row["steps_lost"] <= 5 and row["recovery_s"] > row["detection_s"]
    ours, requeue, torchrun = (faults[s.value] for s in System)
    assert ours["requeues"] == 0 and ours["queue_wait_s"] == 0 and ours["attempts"] == 2  # inside the allocation
    assert torchrun["requeues"] == 0 and torchrun["attempts"] == 2  # torchrun restarted its workers in place
    assert requeue["requeues"] == 1 and requeue["queue_wait_s"] > 0  # back through the queue

    ettr = {row["system"]: row for row in payload["ettr"]}
    assert set(ettr) == {s.value for s in System}
    for row in ettr.values():
        assert row["completed"] and 0 < row["ettr"] <= 1, row
        assert row["productive_steps"] == round(60 / 0.3), row  # every step done once, whatever was redone
        assert row["lost_s"] == pytest.approx(row["wall_s"] - row["productive_s"])
    assert ettr[System.SLURM_FT.value]["faults"] and ettr[System.SLURM_FT.value]["interval_s"] > 0  # auto
    assert ettr[System.SLURM_REQUEUE.value]["interval_steps"] >= 1

    assert any(c["target"].startswith("rank crash, 1 node(s)") for c in payload["targets"])
    assert payload["sim_costs"]["restart_in_alloc_s"] > 0
    saved = json.loads((config.out / "lab.json").read_text())
    assert saved["schema"] == bench_lab.SCHEMA and len(saved["faults"]) == 3
    assert (config.out / "recovery_vs_size.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("kill-rank on rank 0" in line for line in lines) and notes
    assert "ETTR side by side" in bench_lab.render(payload)
