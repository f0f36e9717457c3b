"""Fast line matching: which signatures, exception lines and Xid lines occur in a text.

Running every regex over every line costs ``lines x signatures`` regex calls. Instead each signature names
literal keywords that every match contains; keywords are grouped under a few short *anchors* (``"error"``,
``"nccl"`` ...). One ``str.find`` pass per anchor over the lower-cased text finds the few candidate lines,
and only there are keywords checked and regexes run. ``scan_naive`` is the plain loop, kept as the
reference the fast path must agree with (tests) and as the benchmark's baseline.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from slurm_ft.health.kmsg import parse_xid_line

# Short substrings shared by many keywords; a keyword containing none of them is its own anchor.
COARSE_ANCHORS = ("error", "xception", "nccl", "cuda", "kill", "fail", "abort", "terminat", "cancelled", "timed out",
                  "sig", "errno", "nan", "inf", "finite", "space", "stale", "quota", "connect", "mismatch", "xid",
                  "memory", "respond")

# The last line of a Python traceback: "[rank3]: torch.OutOfMemoryError: CUDA out of memory ..."
EXCEPTION_LINE_RE = re.compile(
    r"^(?:\[rank\d{1,6}\]:\s?|\[default\d{1,6}\]:\s?|\d{1,6}: )?"
    r"(?P<exc>[A-Za-z_]\w{0,80}(?:\.[A-Za-z_]\w{0,80}){0,10})(?::\s(?P<msg>.*)|:?\s*)$"
)
XID_KEYWORD = "nvrm: xid"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class Matchable(Protocol):
    """What the scanner needs of a signature."""

    keywords: tuple[str, ...]  # lower-case; any of them
    require: tuple[str, ...]  # lower-case; all of them
    regex: re.Pattern[str]


@dataclasses.dataclass(frozen=True, slots=True)
class LineHit:
    """One line with something on it."""

    pos: int  # offset of the line in the scanned text
    line: str
    signatures: tuple[tuple[Any, re.Match[str]], ...]  # (signature, match), in signature order
    exception: re.Match[str] | None  # EXCEPTION_LINE_RE match, when the line looks like one
    xid: tuple[str, int, str] | None  # parse_xid_line() result


_EXC = object()
_XID = object()


def lower_same_length(text: str) -> str:
    """Lower-case ``text`` keeping every offset (``str.lower`` can lengthen a few non-ASCII characters)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


class Scanner:
    """Finds ``LineHit``s for one set of signatures (one input kind: log, kmsg, error file, reason)."""

    def __init__(self, signatures: Sequence[Matchable], *, exception_names: Iterable[str] = (),
                 xids: bool = False, max_line_chars: int = 512) -> None:
        self.signatures = tuple(signatures)
        self._order = {id(s): i for i, s in enumerate(self.signatures)}
        self.exceptions = bool(exception_names)
        self.xids = xids
        self.max_line_chars = max_line_chars
        entries: list[tuple[str, Any]] = [(kw, sig) for sig in self.signatures for kw in sig.keywords]
        if self.exceptions:
            # Exception lines are looked for on any line with "error"/"exception"; a table name containing
            # neither (an admin's "StopIteration") is a keyword of its own.
            names = {n.lower() for n in exception_names if n != "*"} | {"error", "exception"}
            entries += [(name, _EXC) for name in sorted(names) if name in ("error", "exception")
                        or ("error" not in name and "exception" not in name)]
        if xids:
            entries.append((XID_KEYWORD, _XID))
        groups: dict[str, dict[str, list[Any]]] = {}
        for keyword, target in entries:
            targets = groups.setdefault(_anchor_for(keyword), {}).setdefault(keyword, [])
            if target not in targets:
                targets.append(target)
        # anchor -> ((keyword, (targets...)), ...): each keyword is checked once per candidate line
        self.anchors = tuple((anchor, tuple((kw, tuple(ts)) for kw, ts in group.items()))
                             for anchor, group in groups.items())

    def scan(self, text: str) -> list[LineHit]:
        """The hits in ``text``, in line order (the fast path)."""
        low = lower_same_length(text)
        candidates: dict[int, tuple[int, list[Any]]] = {}
        for anchor, group in self.anchors:
            i = low.find(anchor)
            while i != -1:
                start = low.rfind("\n", 0, i) + 1
                end = low.find("\n", i)
                if end == -1:
                    end = len(low)
                slot = candidates.get(start)
                if slot is None:
                    candidates[start] = (end, [group])
                else:
                    slot[1].append(group)
                i = low.find(anchor, end)
        hits = []
        for start in sorted(candidates):
            end, groups = candidates[start]
            end = min(end, start + self.max_line_chars)
            hit = self._match_line(start, text[start:end].rstrip("\r"), low[start:end], groups)
            if hit is not None:
                hits.append(hit)
        return hits

    def _match_line(self, start: int, line: str, low_line: str,
                    groups: list[tuple[tuple[str, tuple[Any, ...]], ...]]) -> LineHit | None:
        sigs: dict[int, tuple[Any, re.Match[str]]] = {}
        want_exc = want_xid = False
        for group in groups:
            for keyword, targets in group:
                if keyword not in low_line:
                    continue
                for target in targets:
                    if target is _EXC:
                        want_exc = True
                    elif target is _XID:
                        want_xid = True
                    elif id(target) not in sigs and all(r in low_line for r in target.require):
                        m = target.regex.search(line)
                        if m is not None:
                            sigs[id(target)] = (target, m)
        exc = EXCEPTION_LINE_RE.match(line) if want_exc else None
        xid = parse_xid_line(line) if want_xid else None
        if not sigs and exc is None and xid is None:
            return None
        ordered = tuple(sorted(sigs.values(), key=lambda pair: self._order[id(pair[0])]))
        return LineHit(start, line, ordered, exc, xid)

    def scan_naive(self, text: str) -> list[LineHit]:
        """Every regex on every line: the reference ``scan`` must agree with (and the benchmark baseline)."""
        hits = []
        pos = 0
        for raw in text.split("\n"):
            line = raw[: self.max_line_chars].rstrip("\r")
            sigs = tuple((s, m) for s in self.signatures if (m := s.regex.search(line)) is not None)
            exc = EXCEPTION_LINE_RE.match(line) if self.exceptions else None
            xid = parse_xid_line(line) if self.xids else None
            if sigs or exc is not None or xid is not None:
                hits.append(LineHit(pos, line, sigs, exc, xid))
            pos += len(raw) + 1
        return hits


def _anchor_for(keyword: str) -> str:
    for anchor in COARSE_ANCHORS:
        if anchor in keyword:
            return anchor
    return keyword
