"""Every corpus case gets its expected verdict, by the fast scan and by the reference scan alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ft.bench.classify_bench import load_corpus, mismatches
from slurm_ft.classify import Category, classify, default_rules
from slurm_ft.classify.engine import explain
from slurm_ft.classify.xid import XidKind

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
CASES = load_corpus(CORPUS)


def test_corpus_is_large_enough():
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_verdict(case):
    verdict = classify(case.evidence).to_dict()
    assert mismatches(case, verdict) == [], case.description


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fast_scan_agrees_with_reference_scan(case):
    assert classify(case.evidence).to_dict() == classify(case.evidence, reference_scan=True).to_dict()


def _fired() -> set[str]:
    """Rules seen firing in this corpus or in the part of the real corpus that rules are written from."""
    from slurm_ft.bench.classify_accuracy import is_held_back, load_split

    real = CORPUS.parent / "corpus_real"
    held = load_split(real / "held_back.txt", real / "held_back_kinds.txt")
    fired = set()
    for case in CASES + [c for c in load_corpus(real / "cases") if not is_held_back(c, held)]:
        fired |= {f.rule.id for f in explain(case.evidence)}
        job = case.evidence.job
        if job is not None and job.state in default_rules().job_states:
            fired.add(f"job_state:{job.state}")
    return fired


def test_every_rule_has_a_case():
    rules, fired = default_rules(), _fired()
    missing = [s.rule.id for s in rules.signatures if s.rule.id not in fired]
    missing += [f"job_state:{k}" for k in rules.job_states if f"job_state:{k}" not in fired]
    missing += [f"node_state:{k}" for k in rules.node_states if f"node_state:{k}" not in fired]
    missing += [f"xid:{k.value}" for k in XidKind if k is not XidKind.WATCH and f"xid:{k.value}" not in fired]
    missing += [r for r in ("nvml:gpu_lost", "nvml:fault", "nvml:pending", "nvml:wear", "torchrun:root_cause",
                            "rank_end:oom_kill", "rank_end:killed", "rank_end:exit", "rank_end:after_root",
                            "hang:stuck", "hang:behind", "hang:no_progress", "hang:waiting", "hang:outside_collective",
                            "nvml:recovery_action", "xid_log:drain", "xid_log:restart", "xid_log:application",
                            "xid_log:secondary", "metrics:non_finite", "metrics:scale_collapse", "metrics:diverged",
                            "metrics:spike", "cuda_oom:in_setup")
                if r not in fired]
    assert missing == []


def test_corpus_covers_every_category():
    seen = {classify(c.evidence).category.value for c in CASES}
    assert seen == {c.value for c in Category}
