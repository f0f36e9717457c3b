"""Terminal output shared by the benchmarks (sim, lab): an aligned table and a progress printer.

Generic on purpose: a table is column headers plus rows of values; numbers are right-aligned, text left-aligned.
A column may carry a format spec (``Column("ettr", ".4f")``); otherwise floats get 4 decimals (0 when >= 1000).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    header: str
    fmt: str | None = None  # a format spec for numbers, e.g. ".3f", ".1%", ",d"


def render_table(columns: Sequence[str | Column], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned plain-text table: header, rule, one line per row (``None`` shows as ``-``)."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    for row in rows:
        if len(row) != len(cols):
            raise ValueError(f"rows: a row has {len(row)} values for {len(cols)} columns: {row!r}")
    cells = [[_cell(v, c.fmt) for v, c in zip(row, cols)] for row in rows]
    numeric = [all(_is_number(row[i]) or row[i] is None for row in rows) and bool(rows) for i in range(len(cols))]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return "\n".join([line([c.header for c in cols]), line(["-" * w for w in widths])] + [line(r) for r in cells])


def records_table(records: Sequence[Mapping[str, Any]],
                  columns: Mapping[str | Column, str | Callable[[Mapping[str, Any]], Any]]) -> str:
    """A table from dicts: ``columns`` maps each header to a key or a function of the record."""
    getters = [(lambda r, k=key: r.get(k)) if isinstance(key, str) else key for key in columns.values()]
    return render_table(list(columns), [[get(r) for get in getters] for r in records])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt and _is_number(value):
        return format(value, fmt)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


class Progress:
    """``[3/48 1.2s] label`` lines on stderr, so stdout stays the table."""

    def __init__(self, total: int, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()

    def step(self, label: str) -> None:
        self.done += 1
        elapsed = self.clock() - self.started
        print(f"[{self.done}/{self.total} {elapsed:.1f}s] {label}", file=self.stream, flush=True)
