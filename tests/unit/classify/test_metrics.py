"""The step-log parser and the divergence rule (issue 33), on real step logs (tests/data/metrics, source in each
file's first line) and on the documented shapes of the trainers whose prints have no real case here yet."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slurm_ft.classify import Category, Evidence, LogTail, classify
from slurm_ft.classify.metrics import judge, parse_steps

DATA = Path(__file__).resolve().parents[2] / "data" / "metrics"


def _real(name: str) -> str:
    text = (DATA / name).read_text()
    assert text.startswith("# source: https://")
    return text


def test_megatron_fields_are_read():
    steps, _ = parse_steps(_real("megatron_diverged.txt"))
    assert [round(s.loss, 3) for s in steps] == [6.366, 6.598, 7.314, 9.122, 10.239]
    assert steps[3].grad_norm == pytest.approx(283384.130) and steps[0].loss_scale == 4096.0
    assert steps[0].nan_iters == 0


@pytest.mark.parametrize("name,kind", [
    ("megatron_diverged.txt", "diverged"),  # lm loss 6.4 -> 10.2 and climbing
    ("deepspeed_overflow_collapse.txt", "scale_collapse"),  # OVERFLOW: loss scale 1048576 -> 32768
    ("apex_overflow_collapse.txt", "scale_collapse"),  # apex: "reducing loss scale to" 32768 -> 2048
    ("hf_trainer_nan_grad_norm.txt", "non_finite"),
    ("megatron_spike_recovered.txt", "spike"),  # grad norm 0.24 -> 960, back to 0.2: a hint only
])
def test_real_step_logs_are_judged(name, kind):
    assert judge(_real(name)).kind == kind


def test_healthy_numbers_say_nothing():
    assert judge(_real("megatron_healthy_wrapped.txt")) is None


def test_the_divergence_decides_numerical_and_a_recovered_spike_stays_a_hint():
    diverged = classify(Evidence(logs=(LogTail(source=0, text=_real("megatron_diverged.txt")),)))
    assert diverged.category is Category.NUMERICAL and not diverged.recoverable and diverged.confidence >= 0.7
    spike = classify(Evidence(logs=(LogTail(source=0, text=_real("megatron_spike_recovered.txt")),)))
    assert spike.category is Category.NUMERICAL and spike.confidence < 0.5
    # any real error in the same tail outranks a hint
    illegal = "RuntimeError: CUDA error: an illegal memory access was encountered"
    with_error = _real("megatron_spike_recovered.txt") + "\n" + illegal
    assert classify(Evidence(logs=(LogTail(source=0, text=with_error),))).category is Category.USER_CODE


SHAPES = {
    # Lightning's tqdm progress bar (postfix "loss=...")
    "lightning": "Epoch 0:  41%|####      | 410/1000 [02:01<02:54, 3.38it/s, loss={}, v_num=0]",
    # pytorch/examples word_language_model
    "plain_bar": "| epoch   1 |   200/ 2983 batches | lr 20.0000 | ms/batch 11.61 | loss {} | ppl 1000.0",
    # nanoGPT / llm.c style
    "plain_step": "step 120 | loss: {} | lr: 6.0000e-04 | norm: 0.9812 | time: 4431.57ms",
    # keras-like / hand-written
    "plain_words": "Epoch 3, Step 40, Loss: {}",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_common_shapes_parse_and_a_nan_in_the_series_is_non_finite(shape):
    text = "\n".join(SHAPES[shape].format(v) for v in ("2.31", "2.29", "nan"))
    steps, _ = parse_steps(text)
    assert [s.loss for s in steps][:2] == [2.31, 2.29] and math.isnan(steps[2].loss)
    assert judge(text).kind == "non_finite"


def test_one_nan_print_is_no_series():
    assert judge("step 10 loss nan") is None


def test_a_loss_that_falls_is_no_divergence():
    text = "\n".join(SHAPES["plain_step"].format(v) for v in ("9.1", "6.2", "4.8", "4.1", "3.9"))
    assert judge(text) is None


def test_the_loss_scale_reaching_one_is_a_collapse():
    # the Megatron fields, fp16 loss scale falling to 1 while the loss is flat
    lines = [f" iteration {i}/ 100 | lm loss: 3.0E+00 | loss scale: {s} | grad norm: 1.0 |" for i, s in
             enumerate((4.0, 2.0, 1.0), start=1)]
    assert judge("\n".join(lines)).kind == "scale_collapse"


def test_apex_overflows_are_halvings_and_outrank_the_division_by_zero_they_cause():
    # https://github.com/jiangnanboy/chatbot_chinese (README L91-L97): apex prints only the new scale; the scale
    # reached zero and the run died in ZeroDivisionError, a victim of the collapse
    _, overflows = parse_steps(_real("apex_overflow_collapse.txt"))
    assert overflows[0] == (65536.0, 32768.0) and len(overflows) == 5
    verdict = classify(Evidence(logs=(LogTail(source=0, text=_real("apex_overflow_collapse.txt")
                                              + "...\nZeroDivisionError: float division by zero"),)))
    assert verdict.category is Category.NUMERICAL and not verdict.recoverable
