"""The demo's gpu-held scenario: its job (3 nodes, one spare, the step's GPUs, a short bound) and its checks."""

from __future__ import annotations

from pathlib import Path

from slurm_ft.bench.demo import (
    DemoConfig,
    Run,
    batch_script,
    culprit_checks,
    ft_flags,
    gpu_held_checks,
    node_count,
)
from slurm_ft.slurm.types import JobInfo, JobState


def test_the_job_has_a_spare_the_steps_gpus_and_a_short_wait():
    run = Run(name="gpu-held", ckpt=Path("/tmp/ck"))
    script = batch_script(DemoConfig(dir=Path("/tmp/d"), scenarios=("gpu-held",), hosts=False), run)
    assert "export CUDA_VISIBLE_DEVICES=0\n" in script and "--gpu-reclaim-timeout 5 -- " in script
    assert node_count(run) == 3 and "--ft-spare-nodes=1" in ft_flags(run)
    clean = Run(name="clean", ckpt=Path("/tmp/ck"))
    single = DemoConfig(dir=Path("/tmp/d"), hosts=False)
    assert node_count(clean) == 2 and "CUDA_VISIBLE_DEVICES" not in batch_script(single, clean)


def _events(held_node="n2", out=("n2",), later_nodes=("n1", "n3")):
    return [{"event": "attempt_start", "attempt": 1, "nodes": ["n1", "n2"]},
            {"event": "gpu_reclaim", "held": [{"node": held_node, "gpu_index": 0}]},
            {"event": "spare_swap", "out": list(out)},
            {"event": "attempt_start", "attempt": 2, "nodes": list(later_nodes)}]


def test_every_gpu_held_check_holds_on_the_right_evidence_and_fails_on_the_wrong():
    run = Run(name="gpu-held", ckpt=Path("/tmp/ck"), held=("n2", 0),
              final=JobInfo(job_id=2, name="gpu-held", user_id=0, state=JobState.COMPLETED))
    assert all(held for _, held in gpu_held_checks(run, _events()))
    failed = [what for what, held in gpu_held_checks(run, _events(held_node="n1", later_nodes=("n2", "n3"))) if not held]
    assert failed == ["the wait named n2 GPU 0 held", "finished without n2"]
    verdict = {"category": "hardware_gpu", "culprit": {"nodes": ["n2"], "ranks": []}}
    assert all(held for _, held in culprit_checks(run, _events(), verdict))
    wrong = {"category": "unknown", "culprit": {"nodes": ["n2"], "ranks": [1]}}
    assert [what for what, held in culprit_checks(run, _events(), wrong) if not held] == ["hardware_gpu"]
