"""Classifier corpus cases, the accuracy benchmark and the throughput benchmark.

A corpus case is one TOML file: the inputs of one failure plus the verdict expected of it
(format in ``tests/data/corpus/README.md``; real failures with their ``[source]`` in
``tests/data/corpus_real/README.md``). ``main()`` (``slurm-ft bench classify``) measures accuracy on the real
corpus, whole and per part: each held-back part and the part rules are written from. ``run()`` times
``classify`` over a mixed corpus and, side by side in the same run, the reference scan (every regex on every
line), so the printed ratio is robust to a noisy machine (``slurm-ft bench classify --speed``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_ft.classify.engine import classify
from slurm_ft.classify.records import Evidence, JobEnd, LogTail, NodeEvent, error_record_from_dict
from slurm_ft.classify.rules import Rules, default_rules
from slurm_ft.core.rundir import RankEnd, RankState
from slurm_ft.health.records import XidEvent, snapshot_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TOP = {"description", "in_allocation", "job", "log", "error", "xid", "node_event", "nvml", "expect", "source",
        "end", "hang", "elastic_error"}
_END = {f.name for f in dataclasses.fields(RankEnd)}
_HANG = {f.name for f in dataclasses.fields(RankState)}
_ELASTIC = {"rank", "host", "file"}
_JOB = {"state", "reason", "exit_code", "signal", "nodes"}
_LOG = {"rank", "node", "on", "kind", "text"}
_NODE_EVENT = {"name", "state", "reason"}
_EXPECT = {"category", "action", "recoverable", "nodes", "ranks", "evidence_contains", "min_confidence",
           "max_confidence"}
_SOURCE = {"url", "site", "kind", "family", "root_cause", "loudest_is_secondary"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    description: str
    evidence: Evidence
    expect: dict[str, Any]
    source: dict[str, Any] = dataclasses.field(default_factory=dict)  # real cases: url, site, root_cause, ...


def load_case(path: Path) -> Case:
    """One corpus file; an unknown key or a bad record raises ``ValueError`` naming the file."""
    data = tomllib.loads(path.read_text())
    try:
        return _case(path.stem, data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def load_corpus(directory: Path) -> list[Case]:
    return [load_case(p) for p in sorted(Path(directory).glob("*.toml"))]


def _case(name: str, data: dict[str, Any]) -> Case:
    _known(data, _TOP, "top level")
    job = None
    if "job" in data:
        _known(data["job"], _JOB, "[job]")
        job = JobEnd(**{**data["job"], "nodes": tuple(data["job"].get("nodes", ()))})
    logs = []
    for entry in data.get("log", []):
        _known(entry, _LOG, "[[log]]")
        source = entry["rank"] if "rank" in entry else entry.get("node", "")
        logs.append(LogTail(source=source, text=entry["text"], node=entry.get("on", ""), kind=entry.get("kind", "log")))
    errors = []
    for entry in data.get("error", []):
        record = error_record_from_dict(entry)
        if record is None:
            raise ValueError(f"[[error]] is not an error record: {entry}")
        errors.append(record)
    for entry in data.get("elastic_error", []):  # a torch elastic error file: {file = JSON text, rank, host}
        _known(entry, _ELASTIC, "[[elastic_error]]")
        record = error_record_from_dict(json.loads(entry["file"]), default_rank=entry.get("rank", -1),
                                        default_host=entry.get("host", ""))
        if record is None:
            raise ValueError(f"[[elastic_error]] is not a torch elastic error file: {entry}")
        errors.append(record)
    ends, hang = [], []
    for entry in data.get("end", []):
        _known(entry, _END, "[[end]]")
        ends.append(RankEnd(**entry))
    for entry in data.get("hang", []):
        _known(entry, _HANG, "[[hang]]")
        hang.append(RankState(**entry))
    nodes = []
    for entry in data.get("node_event", []):
        _known(entry, _NODE_EVENT, "[[node_event]]")
        nodes.append(NodeEvent(name=entry["name"], state=frozenset(entry.get("state", ())),
                               reason=entry.get("reason", "")))
    expect = data["expect"]
    _known(expect, _EXPECT, "[expect]")
    origin = data.get("source", {})
    _known(origin, _SOURCE, "[source]")
    evidence = Evidence(job=job, nodes=tuple(nodes), nvml=tuple(snapshot_from_dict(s) for s in data.get("nvml", [])),
                        kmsg=tuple(XidEvent(**x) for x in data.get("xid", [])), errors=tuple(errors),
                        logs=tuple(logs), ends=tuple(ends), hang=tuple(hang),
                        in_allocation=bool(data.get("in_allocation", False)))
    return Case(name=name, description=str(data.get("description", "")), evidence=evidence, expect=expect,
                source=origin)


def _known(table: dict[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}")


def mismatches(case: Case, verdict_dict: dict[str, Any]) -> list[str]:
    """What in ``verdict_dict`` differs from the case's expectation (empty when it matches)."""
    want, got, problems = case.expect, verdict_dict, []
    for key in ("category", "action", "recoverable"):
        if key in want and want[key] != got[key]:
            problems.append(f"{key}: want {want[key]!r}, got {got[key]!r}")
    for key in ("nodes", "ranks"):
        if key in want and list(want[key]) != got["culprit"][key]:
            problems.append(f"culprit {key}: want {want[key]!r}, got {got['culprit'][key]!r}")
    for needle in want.get("evidence_contains", []):
        if not any(needle in line for line in got["evidence"]):
            problems.append(f"evidence lacks {needle!r}: {got['evidence']!r}")
    if got["confidence"] < want.get("min_confidence", 0.0):
        problems.append(f"confidence {got['confidence']} < {want['min_confidence']}")
    if got["confidence"] > want.get("max_confidence", 1.0):
        problems.append(f"confidence {got['confidence']} > {want['max_confidence']}")
    return problems


# ---- benchmark -------------------------------------------------------------------------------------------------

def _rate(fn: Callable[[Evidence], object], evidences: Sequence[Evidence], seconds: float) -> tuple[float, int]:
    """Verdicts per CPU second of ``fn`` cycling through ``evidences`` for about ``seconds`` of CPU time.

    CPU time of this (single-threaded) process is what "per core" means, and it does not count the time
    spent waiting for the CPU behind other processes on a shared machine.
    """
    count, start = 0, time.process_time()
    deadline = start + seconds
    while True:
        for ev in evidences:
            fn(ev)
        count += len(evidences)
        now = time.process_time()
        if now >= deadline:
            return count / (now - start), count


def run(corpus_dir: Path, *, seconds: float = 2.0, rules: Rules | None = None) -> dict[str, Any]:
    """Time the classifier on the corpus: fast path, reference scan, and the ratio between them."""
    rules = rules or default_rules()
    cases = load_corpus(corpus_dir)
    if not cases:
        raise ValueError(f"{corpus_dir}: no corpus cases (*.toml)")
    evidences = [c.evidence for c in cases]
    chars = sum(len(t.text) for ev in evidences for t in ev.logs) + sum(
        len(r.message) + len(r.traceback) for ev in evidences for r in ev.errors)
    fast, n_fast = _rate(lambda ev: classify(ev, rules), evidences, seconds)
    slow, n_slow = _rate(lambda ev: classify(ev, rules, reference_scan=True), evidences, max(seconds / 4, 0.2))
    wrong = [c.name for c in cases if mismatches(c, classify(c.evidence, rules).to_dict())]
    return {
        "cases": len(cases),
        "mean_text_chars": round(chars / len(cases)),
        "verdicts_per_s": round(fast),
        "reference_verdicts_per_s": round(slow),
        "speedup": round(fast / slow, 1) if slow else None,
        "verdicts_timed": n_fast + n_slow,
        "mismatching_cases": wrong,
    }


# ---- accuracy (``slurm-ft bench classify``) ----------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL_CORPUS = REPO_ROOT / "tests" / "data" / "corpus_real"


def main(argv: list[str] | None = None) -> int:
    """Accuracy on the real corpus, whole and per part (each held-back part, the part rules are written from);
    ``--speed`` runs the throughput benchmark instead."""
    import argparse
    import json

    from slurm_ft.bench import classify_accuracy as acc

    parser = argparse.ArgumentParser(prog="slurm-ft bench classify", description=main.__doc__)
    parser.add_argument("--corpus", type=Path, default=REAL_CORPUS / "cases", help="directory of case TOML files")
    parser.add_argument("--held-back", type=Path, default=REAL_CORPUS / "held_back.txt",
                        help="file naming the held-back issue-thread sites, one per line")
    parser.add_argument("--held-back-kinds", type=Path, default=REAL_CORPUS / "held_back_kinds.txt",
                        help="file naming the held-back kinds of source and sites of other kinds "
                             "('kind: K', 'site: S')")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--wrong", action="store_true",
                        help="also list the wrong answers of the part rules are written from (never a held-back part)")
    parser.add_argument("--speed", action="store_true", help="verdicts per second instead (bench/bench_classify.py)")
    args, rest = parser.parse_known_args(argv)
    if args.speed:
        return _speed(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not args.corpus.is_dir():
        parser.error(f"--corpus {str(args.corpus)!r}: not a directory (the corpus ships with the source tree)")
    try:
        split = acc.load_split(args.held_back, args.held_back_kinds)
        cases = load_corpus(args.corpus)
    except ValueError as exc:
        parser.error(str(exc))
    if not cases:
        parser.error(f"--corpus {str(args.corpus)!r}: no cases (*.toml)")
    rules = default_rules()
    outcomes = {o.name: o for o in acc.outcomes(cases, rules)}
    parts = {c.name: split.part(c) for c in cases}
    scores = [acc.Score("whole corpus", tuple(outcomes.values()))]
    scores += [acc.Score(part, tuple(outcomes[c.name] for c in cases if parts[c.name] == part))
               for part in (*acc.HELD_BACK_PARTS, acc.RULES)]
    scores.insert(4, acc.Score("held-back, all parts", tuple(outcomes[c.name] for c in cases
                                                             if parts[c.name] != acc.RULES)))
    if args.json:
        print(json.dumps({"scores": [s.to_dict() for s in scores], "goal": acc.GOAL,
                          "confident": {"threshold": acc.CONFIDENT, "goal": acc.CONFIDENT_GOAL}}))
        return 0
    print("\n\n".join(acc.render(s) for s in scores))
    if args.wrong:
        print("\nwrong answers in the part rules are written from (expected -> got):")
        for o in (outcomes[c.name] for c in cases if parts[c.name] == acc.RULES):
            if not (o.category_ok and o.recoverable_ok):
                print(f"  {o.name}: {o.want_category}/{o.want_recoverable} -> {o.got_category}/{o.got_recoverable}"
                      f" ({o.confidence:.2f})")
    return 0


def _speed(argv: list[str]) -> int:
    from slurm_ft.bench.cli import run_script  # the CLI imports this module: import at call time

    script = REPO_ROOT / "bench" / "bench_classify.py"
    if not script.is_file():
        raise SystemExit(f"bench classify --speed: {script} is not in this build (a source checkout has it)")
    return run_script(script, argv)
