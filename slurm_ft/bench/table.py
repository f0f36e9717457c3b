"""Terminal output shared by the benchmarks: a plain aligned table and a one-line progress printer."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; floats shown with 4 significant decimals."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


class Progress:
    """``[3/48] label`` lines on stderr, so stdout stays the table."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr

    def step(self, label: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {label}", file=self.stream, flush=True)
