"""Classifier accuracy on the real-failure corpus: category, recoverable, what the verdicts cost, calibration.

Pure functions over corpus cases (``slurm_ft.bench.classify_bench.Case``) and their verdicts; ``render`` makes the
terminal report of ``slurm-ft bench classify``. The held-back parts are named by two files (``Split``), fixed
before rules were written from the cases they hold back.

What a verdict costs a user (issue 33), per case:
  wasted restart   a deterministic failure (expected not recoverable) given a verdict that restarts the job. The
                   restarted job fails the same way; the launcher's "same root cause twice" stop (or the monitor's
                   crash-loop check: no checkpoint progress) then ends it, so at most 1 restart per failure.
  stopped, savable a transient failure (expected recoverable) given a verdict that stops the job (not recoverable,
                   or action stop / none): a retry would have saved it.
  healthy struck   the nodes a verdict would strike (culprits named by the node's own evidence, ``attested_nodes``,
                   of a verdict that requeues: the monitor strikes no node of a job it stops) in a case whose
                   expected category is not hardware_gpu or hardware_node.
Calibration: of the verdicts with confidence >= 0.7, the share right (category and recoverable both).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from slurm_ft.classify.engine import classify
from slurm_ft.classify.rules import Rules
from slurm_ft.core.taxonomy import Action, Category

GOAL = 0.90  # issues 18 and 33: category and recoverable accuracy on the held-back parts
CONFIDENT = 0.7  # issue 33: a verdict this confident ...
CONFIDENT_GOAL = 0.95  # ... is right this often
HARDWARE = frozenset({Category.HARDWARE_GPU.value, Category.HARDWARE_NODE.value})
_STOPPING = frozenset({Action.STOP.value, Action.NONE.value})
BUCKETS = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))  # confidence: [low, high)


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """One case: what was expected and what the classifier said."""

    name: str
    want_category: str
    got_category: str
    want_recoverable: bool
    got_recoverable: bool
    confidence: float
    got_action: str = Action.REQUEUE.value
    struck: tuple[str, ...] = ()  # the nodes the verdict would strike (attested culprits)

    @property
    def category_ok(self) -> bool:
        return self.want_category == self.got_category

    @property
    def recoverable_ok(self) -> bool:
        return self.want_recoverable == self.got_recoverable

    @property
    def right(self) -> bool:
        return self.category_ok and self.recoverable_ok

    @property
    def stops(self) -> bool:
        """Whether the verdict ends the job (no restart)."""
        return not self.got_recoverable or self.got_action in _STOPPING

    @property
    def wasted_restart(self) -> int:
        return int(not self.want_recoverable and not self.stops)

    @property
    def stopped_savable(self) -> int:
        return int(self.want_recoverable and self.stops)

    @property
    def healthy_struck(self) -> int:
        return 0 if self.want_category in HARDWARE else len(self.struck)


@dataclasses.dataclass(frozen=True, slots=True)
class Score:
    """Accuracy figures for one set of outcomes."""

    label: str
    outcomes: tuple[Outcome, ...]

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def category_accuracy(self) -> float:
        return _share(o.category_ok for o in self.outcomes)

    @property
    def recoverable_accuracy(self) -> float:
        return _share(o.recoverable_ok for o in self.outcomes)

    @property
    def deterministic(self) -> int:
        return sum(not o.want_recoverable for o in self.outcomes)

    @property
    def wasted_restarts(self) -> int:
        return sum(o.wasted_restart for o in self.outcomes)

    @property
    def stopped_savable(self) -> int:
        return sum(o.stopped_savable for o in self.outcomes)

    @property
    def healthy_struck(self) -> int:
        return sum(o.healthy_struck for o in self.outcomes)

    def calibration(self, threshold: float = CONFIDENT) -> tuple[int, float]:
        """Verdicts with confidence >= ``threshold``, and the share of them right (category and recoverable)."""
        confident = [o for o in self.outcomes if o.confidence >= threshold]
        return len(confident), _share(o.right for o in confident)

    def confusion(self) -> Counter[tuple[str, str]]:
        """(expected, predicted) -> count."""
        return Counter((o.want_category, o.got_category) for o in self.outcomes)

    def buckets(self) -> list[tuple[str, int, float]]:
        """Per confidence bucket: label, cases in it, share with the right category."""
        rows = []
        for low, high in BUCKETS:
            inside = [o for o in self.outcomes if low <= o.confidence < high]
            rows.append((f"{low:.1f}-{min(high, 1.0):.1f}", len(inside), _share(o.category_ok for o in inside)))
        return rows

    def to_dict(self) -> dict:
        return {"label": self.label, "cases": self.n, "category_accuracy": round(self.category_accuracy, 4),
                "recoverable_accuracy": round(self.recoverable_accuracy, 4),
                "confusion": {f"{w}->{g}": n for (w, g), n in sorted(self.confusion().items())},
                "confidence_buckets": [{"confidence": b, "cases": n, "category_accuracy": round(a, 4)}
                                       for b, n, a in self.buckets()],
                "deterministic": self.deterministic, "wasted_restarts": self.wasted_restarts,
                "transient": self.n - self.deterministic, "stopped_savable": self.stopped_savable,
                "healthy_nodes_struck": self.healthy_struck,
                "confident": dict(zip(("verdicts", "right"), (self.calibration()[0], round(self.calibration()[1], 4)))),
                "wrong": [o.name for o in self.outcomes if not (o.category_ok and o.recoverable_ok)]}


def _share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else 0.0


def load_held_back(path: Path) -> frozenset[str]:
    """The held-back sites named in ``path`` (one per line; blank lines and ``#`` comments ignored)."""
    return frozenset(_lines(path))


def _lines(path: Path) -> list[str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"held-back list {str(path)!r}: {exc.strerror or exc}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


ISSUE_THREAD = "issue_thread"  # issue 18's cases; every case without a [source] kind is one
THIRD, KINDS, SITES, RULES = "held-back third", "held-back kinds", "held-back sites", "rules written from"
HELD_BACK_PARTS = (THIRD, KINDS, SITES)


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """Which cases no rule is written from: issue threads by site (``held_back.txt``, issue 18); other kinds of
    source whole by kind, then by site (``held_back_kinds.txt``, issue 33)."""

    sites: frozenset[str]
    kinds: frozenset[str] = frozenset()
    kind_sites: frozenset[str] = frozenset()

    def part(self, case) -> str:
        """The part of the corpus ``case`` belongs to: one of ``HELD_BACK_PARTS`` or ``RULES``."""
        kind, site = case.source.get("kind", ISSUE_THREAD), case.source.get("site", "")
        if kind == ISSUE_THREAD:
            return THIRD if site in self.sites else RULES
        if kind in self.kinds:
            return KINDS
        return SITES if site in self.kind_sites else RULES


def load_split(held_back: Path, held_back_kinds: Path | None = None) -> Split:
    """The split named by ``held_back.txt`` and, when given, ``held_back_kinds.txt`` (``kind: K`` and ``site: S``
    lines); a line of another form there is an error naming it."""
    kinds, sites = set(), set()
    for line in _lines(held_back_kinds) if held_back_kinds is not None else ():
        key, _, value = line.partition(":")
        if key.strip() not in ("kind", "site") or not value.strip():
            raise ValueError(f"held-back list {str(held_back_kinds)!r}: {line!r} is not 'kind: K' or 'site: S'")
        (kinds if key.strip() == "kind" else sites).add(value.strip())
    return Split(load_held_back(held_back), frozenset(kinds), frozenset(sites))


def is_held_back(case, held: "frozenset[str] | Split") -> bool:
    split = held if isinstance(held, Split) else Split(frozenset(held))
    return split.part(case) != RULES


def outcomes(cases: Sequence, rules: Rules | None = None) -> list[Outcome]:
    """Classify every case; a case without an expected ``recoverable`` counts the category's policy as expected."""
    result = []
    for case in cases:
        verdict = classify(case.evidence, rules)
        want = case.expect
        requeues = verdict.recoverable and verdict.action.value not in _STOPPING  # the monitor strikes only then
        struck = tuple(n for n in verdict.attested_nodes if n in verdict.culprit.nodes) if requeues else ()
        result.append(Outcome(name=case.name, want_category=want["category"], got_category=verdict.category.value,
                              want_recoverable=bool(want.get("recoverable", verdict.recoverable)),
                              got_recoverable=verdict.recoverable, confidence=verdict.confidence,
                              got_action=verdict.action.value, struck=struck))
    return result


def render(score: Score) -> str:
    """Accuracy lines, the confusion matrix (rows: expected, columns: predicted) and the confidence buckets."""
    met = lambda x: "met" if x >= GOAL else "NOT met"  # noqa: E731
    cat, rec = score.category_accuracy, score.recoverable_accuracy
    lines = [f"{score.label}: {score.n} cases",
             f"  category accuracy    {cat:6.1%}  (goal {GOAL:.0%}: {met(cat)})",
             f"  recoverable accuracy {rec:6.1%}  (goal {GOAL:.0%}: {met(rec)})"]
    lines += _cost_lines(score)
    lines += ["  confusion (rows expected, columns predicted):"] + ["    " + row for row in _matrix(score)]
    lines.append("  confidence bucket   cases  category right")
    lines += [f"    {b:<16} {n:>5}  {a:6.1%}" if n else f"    {b:<16} {n:>5}       -" for b, n, a in score.buckets()]
    return "\n".join(lines)


def _cost_lines(score: Score) -> list[str]:
    """What the verdicts would cost users, and how often a confident verdict is right."""
    ok = lambda good: "met" if good else "NOT met"  # noqa: E731
    det, wasted, struck = score.deterministic, score.wasted_restarts, score.healthy_struck
    per = wasted / det if det else 0.0
    n_conf, right = score.calibration()
    return [f"  cost: {wasted} restarts wasted on {det} deterministic failures ({per:.2f} each, at most 1: the same "
            f"root cause twice stops the job; goal <= 1: {ok(per <= 1)})",
            f"        {score.stopped_savable} jobs stopped that a retry would have saved "
            f"(of {score.n - det} transient)",
            f"        {struck} healthy nodes struck (goal 0: {ok(struck == 0)})",
            f"  confidence >= {CONFIDENT}: {n_conf} verdicts, {right:6.1%} right (category and recoverable; goal "
            f"{CONFIDENT_GOAL:.0%}: {ok(right >= CONFIDENT_GOAL) if n_conf else 'no such verdict'})"]


def _matrix(score: Score) -> list[str]:
    cells = score.confusion()
    order = [c.value for c in Category]
    rows_used = [c for c in order if any(w == c for w, _ in cells)]
    cols_used = [c for c in order if any(g == c for _, g in cells)]
    abbrev = {c: c[:8] for c in cols_used}
    head = " " * 14 + " ".join(f"{abbrev[c]:>8}" for c in cols_used)
    body = [f"{w:<14}" + " ".join(f"{cells.get((w, g), 0) or '.':>8}" for g in cols_used) for w in rows_used]
    return [head] + body
