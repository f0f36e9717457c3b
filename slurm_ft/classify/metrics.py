"""The training loop's own numbers: step-log lines parsed into series, and the divergence read from the series.

A job that diverged rarely raises an exception that says so: its log shows the loss and the gradient norm jumping
by orders of magnitude, the fp16 loss scale halving at every step, NaN iterations counted. This module reads those
numbers, whatever the trainer that printed them. Shapes read (one step per line):

  Megatron-LM / Megatron-DeepSpeed  `iteration 7010/ 159576 | ... | lm loss: 1.142026E+01 | loss scale: 2048.0 |
                                     grad norm: 219645.978 | ... | number of skipped iterations: 0 |
                                     number of nan iterations: 0 |`
  DeepSpeed                         `[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 131072.0,
                                     reducing to 65536.0`
  Apex amp (halves; prints the new) `Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to
                                     32768.0`
  HF Trainer (dict print)           `{'loss': 2.3061, 'grad_norm': 1.52, 'learning_rate': 2e-05, 'epoch': 0.3}`
  Lightning progress bar            `Epoch 0:  41%|####| 410/1000 [02:01<02:54, loss=2.31, v_num=0]`
  plain prints                      `| epoch 1 | 200/ 2983 batches | lr 20.0000 | ... | loss nan | ppl nan`,
                                     `step 120 | loss: 3.2041 | lr: ...`, `Epoch 3, Step 40, Loss: 0.6931`

Rule (``judge``), strongest first; each needs a series (two step lines at least), not one word:
  non_finite    a loss or grad norm that is nan or inf in the series, or a positive "number of nan iterations";
  scale_collapse the loss scale halved 4 or more times within the tail (or reached 1 or less) while steps skip;
  diverged      the last loss at least 1.5x the lowest loss before it (and the one before it at least 1.25x: a
                climb, not one noisy print), or the last grad norm at least 100x the median grad norm before it
                (orders of magnitude), with at least 3 steps read;
  spike         a loss at least 1.5x, or a grad norm at least 100x, its predecessors somewhere in the tail, recovered
                by the end: a hint only (low confidence).
Pure: text in, findings' rule names and evidence out. The engine turns them into findings (``numerical``); a
divergence or a spike ranks below any exception the job raised (that exception is what ended the run).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Iterable

MAX_STEPS = 24  # step lines read, from the end of a tail backwards: the series judged
MAX_NON_FINITE = 8  # lines with a nan / inf read anywhere in the tail (a NaN long before the end still counts)
SERIES = 2  # step lines a series needs before anything is judged (one "loss nan" print is a signature's matter)
MIN_STEPS = 3  # steps a series needs before "diverged" or "spike" is judged
LOSS_JUMP = 1.5  # the loss at least this many times its earlier low
LOSS_HOLD = 1.25  # ... and the step before it already this high: a climb, not one noisy print
GRAD_JUMP = 100.0  # the grad norm at least this many times its earlier median: two orders of magnitude
SCALE_HALVINGS = 4  # the loss scale halved this many times in the tail

_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf(?:inity)?)"
_FIELDS = {
    # key -> patterns of the value, tried in order, on one line (lower-cased)
    # the leftmost of: Megatron's "lm loss:", a dict's 'loss':, "loss:" / "loss=" / "train_loss=", "loss 2.3"
    "loss": (re.compile(r"(?:\blm loss:|['\"]loss['\"]:|(?<![\w-])(?:train_)?loss\s*[:=]|(?<![\w-])loss(?=\s))\s*"
                        + _NUM),),
    "grad_norm": (re.compile(r"\bgrad[ _]norm['\"]?\s*[:=]?\s*" + _NUM), re.compile(r"(?<![\w-])norm:\s*" + _NUM)),
    "loss_scale": (re.compile(r"\bloss scale:\s*" + _NUM), re.compile(r"['\"]loss_scale['\"]:\s*" + _NUM)),
    "nan_iters": (re.compile(r"number of nan iterations:\s*(\d+)"),),
    "skipped": (re.compile(r"number of skipped iterations:\s*(\d+)"),),
}
_NEEDS = {"loss": "loss", "grad_norm": "norm", "loss_scale": "scale", "nan_iters": "nan iter", "skipped": "skipped"}
_OVERFLOW = re.compile(r"overflow!.{0,80}?attempted loss scale:\s*" + _NUM + r",\s*reducing to\s*" + _NUM)
_APEX_OVERFLOW = re.compile(r"gradient overflow\.\s+skipping step, loss scaler \d+ reducing loss scale to\s*" + _NUM)
_STEP_HINT = re.compile(r"\b(?:iteration|iter|step|epoch|batch(?:es)?)\b|\{'loss'|\d+/\s*\d+")


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """The numbers one step-log line printed (None: not printed)."""

    line: str
    loss: float | None = None
    grad_norm: float | None = None
    loss_scale: float | None = None
    nan_iters: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Judgement:
    """What the series says: ``kind`` is non_finite, scale_collapse, diverged or spike; ``evidence`` one line."""

    kind: str
    evidence: str


def parse_steps(text: str) -> tuple[list[Step], list[tuple[float, float]]]:
    """The last ``MAX_STEPS`` step lines of ``text`` and its loss-scale reductions (before, after), in text order."""
    steps: list[Step] = []
    overflows: list[tuple[float, float]] = []
    low_text = text.lower()
    if "loss" not in low_text and "norm" not in low_text:
        return steps, overflows
    for line, low in zip(reversed(text.splitlines()), reversed(low_text.splitlines())):
        if len(steps) >= MAX_STEPS:
            break
        if "loss" not in low and "norm" not in low:
            continue
        m = _OVERFLOW.search(low) if "overflow" in low else None
        if m:
            overflows.append((_float(m.group(1)), _float(m.group(2))))
            continue
        m = _APEX_OVERFLOW.search(low) if "overflow" in low else None
        if m:  # apex.amp's LossScaler.update_scale: the scale is halved, only the new one printed
            overflows.append((2 * _float(m.group(1)), _float(m.group(1))))
            continue
        step = _step(line, low)
        if step is not None:
            steps.append(step)
    return steps[::-1], overflows[::-1]


def _step(line: str, low: str) -> Step | None:
    if not _STEP_HINT.search(low):
        return None
    values = {key: _first(patterns, low) if _NEEDS[key] in low else None for key, patterns in _FIELDS.items()}
    if values["loss"] is None and values["grad_norm"] is None:
        return None
    nan_iters = values["nan_iters"]
    return Step(line=line.strip(), loss=values["loss"], grad_norm=values["grad_norm"],
                loss_scale=values["loss_scale"], nan_iters=int(nan_iters) if nan_iters is not None else None)


def _first(patterns: Iterable[re.Pattern[str]], low: str) -> float | None:
    for pattern in patterns:
        m = pattern.search(low)
        if m:
            return _float(m.group(1))
    return None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def judge(text: str) -> Judgement | None:
    """The strongest thing the step log of ``text`` says about divergence, or None."""
    steps, overflows = parse_steps(text)
    if len(steps) < SERIES and len(overflows) < SCALE_HALVINGS:
        return None
    return (_non_finite(_non_finite_steps(text) + steps) or _scale_collapse(steps, overflows) or _diverged(steps)
            or _spike(steps))


def _non_finite_steps(text: str) -> list[Step]:
    """Step lines anywhere in ``text`` that print a nan or an inf (a few: the first ones decide)."""
    low_text, found, pos = text.lower(), [], 0
    while len(found) < MAX_NON_FINITE:
        hits = [i for i in (low_text.find("nan", pos), low_text.find("inf", pos)) if i != -1]
        if not hits:
            break
        start = low_text.rfind("\n", 0, min(hits)) + 1
        end = low_text.find("\n", min(hits))
        end = len(low_text) if end == -1 else end
        step = _step(text[start:end], low_text[start:end])
        if step is not None:
            found.append(step)
        pos = end + 1
    return found


def _non_finite(steps: list[Step]) -> Judgement | None:
    for step in steps:
        bad = [v for v in (step.loss, step.grad_norm) if v is not None and not math.isfinite(v)]
        if bad or (step.nan_iters or 0) > 0:
            return Judgement("non_finite", step.line)
    return None


def _scale_collapse(steps: list[Step], overflows: list[tuple[float, float]]) -> Judgement | None:
    scales = [s.loss_scale for s in steps if s.loss_scale is not None and math.isfinite(s.loss_scale)]
    halvings = max(sum(1 for before, after in overflows if after < before),
                   sum(1 for prev, cur in zip(scales, scales[1:]) if cur < prev))
    floor = bool(scales) and scales[-1] <= 1.0 and max(scales) > 1.0
    if halvings >= SCALE_HALVINGS or floor:
        last = steps[-1].line if steps else f"loss scale reduced {halvings} times"
        return Judgement("scale_collapse", f"loss scale halved {halvings} times in the tail; last step: {last}")
    return None


def _diverged(steps: list[Step]) -> Judgement | None:
    losses = [(s, s.loss) for s in steps if s.loss is not None]
    if len(losses) >= MIN_STEPS and min(v for _, v in losses[:-1]) > 0:
        low = min(v for _, v in losses[:-1])
        if losses[-1][1] >= LOSS_JUMP * low and losses[-2][1] >= LOSS_HOLD * low:
            return Judgement("diverged", f"loss {_g(low)} -> {_g(losses[-1][1])} at the end: {losses[-1][0].line}")
    norms = [(s, s.grad_norm) for s in steps if s.grad_norm is not None]
    if len(norms) >= MIN_STEPS:
        base = statistics.median(v for _, v in norms[:-1])
        if base > 0 and norms[-1][1] >= GRAD_JUMP * base:
            return Judgement("diverged", f"grad norm {_g(base)} -> {_g(norms[-1][1])}: {norms[-1][0].line}")
    return None


def _spike(steps: list[Step]) -> Judgement | None:
    for key, jump in (("loss", LOSS_JUMP), ("grad_norm", GRAD_JUMP)):
        series = [(s, getattr(s, key)) for s in steps if getattr(s, key) is not None]
        if len(series) < MIN_STEPS:
            continue
        for i in range(1, len(series)):
            earlier = [v for _, v in series[:i]]
            before = min(earlier) if key == "loss" else statistics.median(earlier)
            if before > 0 and series[i][1] >= jump * before:
                name = key.replace("_", " ")
                return Judgement("spike", f"{name} {_g(before)} -> {_g(series[i][1])}, recovered: {series[i][0].line}")
    return None


def _g(value: float) -> str:
    return f"{value:.4g}"
