"""device/check_gpu.sh's FSDP2 check rehearsed on CPU over gloo: a 1-rank FSDP2 trainer with slurm-ft's checkpoint
manager, SIGKILLed after a committed save and resumed, ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from slurm_ft.bench import gpu_check

pytestmark = pytest.mark.gloo


def test_fsdp2_killed_and_resumed_is_bitwise_equal_on_cpu(tmp_path):
    text, code = gpu_check.fsdp_check(tmp_path, "cpu", timeout_s=600.0)
    assert code == 0, (text, json.loads((tmp_path / "fsdp.json").read_text()))
    assert text.startswith("check_gpu: fsdp: ok: killed at a step, resumed from step 6: parameters bitwise equal")
