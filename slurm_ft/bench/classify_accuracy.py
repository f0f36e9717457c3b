"""Classifier accuracy on the real-failure corpus: category, recoverable, confusion matrix, confidence buckets.

Pure functions over corpus cases (``slurm_ft.bench.classify_bench.Case``) and their verdicts; ``render`` makes the
terminal report of ``slurm-ft bench classify``. The held-back third is named by a file of source sites (one per
line, ``#`` comments), fixed before rules were written from the corpus.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from slurm_ft.classify.engine import classify
from slurm_ft.classify.rules import Rules
from slurm_ft.core.taxonomy import Category

GOAL = 0.90  # issue 18: category and recoverable accuracy on the held-back third
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

    @property
    def category_ok(self) -> bool:
        return self.want_category == self.got_category

    @property
    def recoverable_ok(self) -> bool:
        return self.want_recoverable == self.got_recoverable


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
        result.append(Outcome(name=case.name, want_category=want["category"], got_category=verdict.category.value,
                              want_recoverable=bool(want.get("recoverable", verdict.recoverable)),
                              got_recoverable=verdict.recoverable, confidence=verdict.confidence))
    return result


def render(score: Score) -> str:
    """Accuracy lines, the confusion matrix (rows: expected, columns: predicted) and the confidence buckets."""
    met = lambda x: "met" if x >= GOAL else "NOT met"  # noqa: E731
    cat, rec = score.category_accuracy, score.recoverable_accuracy
    lines = [f"{score.label}: {score.n} cases",
             f"  category accuracy    {cat:6.1%}  (goal {GOAL:.0%}: {met(cat)})",
             f"  recoverable accuracy {rec:6.1%}  (goal {GOAL:.0%}: {met(rec)})"]
    lines += ["  confusion (rows expected, columns predicted):"] + ["    " + row for row in _matrix(score)]
    lines.append("  confidence bucket   cases  category right")
    lines += [f"    {b:<16} {n:>5}  {a:6.1%}" if n else f"    {b:<16} {n:>5}       -" for b, n, a in score.buckets()]
    return "\n".join(lines)


def _matrix(score: Score) -> list[str]:
    cells = score.confusion()
    order = [c.value for c in Category]
    rows_used = [c for c in order if any(w == c for w, _ in cells)]
    cols_used = [c for c in order if any(g == c for _, g in cells)]
    abbrev = {c: c[:8] for c in cols_used}
    head = " " * 14 + " ".join(f"{abbrev[c]:>8}" for c in cols_used)
    body = [f"{w:<14}" + " ".join(f"{cells.get((w, g), 0) or '.':>8}" for g in cols_used) for w in rows_used]
    return [head] + body
