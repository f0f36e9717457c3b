"""Properties: arbitrary input never crashes the classifier, and the fast scan always agrees with the reference."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.classify import Action, Category, Evidence, JobEnd, LogTail, NodeEvent, classify, default_rules
from slurm_ft.classify.records import error_record_from_dict
from slurm_ft.health.kmsg import parse_kmsg_xids, parse_xid_line
from slurm_ft.health.records import GpuHealth, NvmlSnapshot, XidEvent
from slurm_ft.slurm.types import JobState

RULES = default_rules()
# Fragments of real signatures, so that random text keeps brushing against the rules.
FRAGMENTS = sorted({kw for s in RULES.signatures for kw in s.keywords} | {
    "Error: ", "[rank3]: ", "3: ", "\n", " loss ", "nan", "inf", "NVRM: Xid (PCI:0000:3b:00): ", "79, pid=12, ",
    "CUDA out of memory", "ChildFailedError", "Root Cause (first observed failure):\n[0]:\n", "  rank      : 4\n",
    "  host      : n2\n", "  exitcode  : -9\n", "KeyError: 'x'", "İ", "\r", "ſ", "K", "\x00", " ", "*** ",
    "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024 ", "DUE TO TIME LIMIT", "srun: error: n2: task 3: ",
})
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=40).map("".join)
small_ints = st.one_of(st.none(), st.integers(min_value=-(2**70), max_value=2**70))
names = st.one_of(st.sampled_from(["n1", "n2", ""]), st.text(max_size=6))


@st.composite
def evidences(draw):
    job = draw(st.one_of(st.none(), st.builds(
        JobEnd, state=st.one_of(st.sampled_from([s.value for s in JobState]), st.text(max_size=8)),
        reason=texts, exit_code=small_ints, signal=small_ints, nodes=st.lists(names, max_size=3).map(tuple))))
    logs = draw(st.lists(st.builds(
        LogTail, source=st.one_of(st.integers(min_value=-5, max_value=10**9), names), text=texts, node=names,
        kind=st.sampled_from(["log", "kmsg"])), max_size=4))
    errors = draw(st.lists(st.fixed_dictionaries(
        {"rank": st.one_of(st.integers(-3, 64), st.text(max_size=3)), "time": st.one_of(st.floats(), st.integers()),
         "exc_type": st.one_of(st.sampled_from(["KeyError", "torch.OutOfMemoryError", "X.YError"]), st.text(max_size=10)),
         "message": texts, "traceback": texts, "host": names, "pid": st.one_of(st.integers(-5, 10**6), st.none())}),
        max_size=3))
    gpus = st.builds(GpuHealth, index=st.integers(0, 8), ecc_volatile_uncorrected=small_ints,
                     remapped_rows_uncorrectable=small_ints, remap_pending=st.one_of(st.none(), st.booleans()),
                     remap_failure=st.one_of(st.none(), st.booleans()), retired_pages_sbe=small_ints,
                     retired_pages_dbe=small_ints, nvlink_down=st.lists(st.integers(0, 17), max_size=3).map(tuple),
                     temperature_c=small_ints)
    nvml = draw(st.lists(st.builds(NvmlSnapshot, node=names, time=st.floats(allow_nan=False), available=st.booleans(),
                                   error=texts, gpus=st.lists(gpus, max_size=2).map(tuple)), max_size=2))
    xids = draw(st.lists(st.builds(XidEvent, node=names, xid=st.integers(-1, 400), text=texts,
                                   gpu_index=st.one_of(st.none(), st.integers(0, 8))), max_size=3))
    nodes = draw(st.lists(st.builds(NodeEvent, name=names, state=st.frozensets(st.sampled_from(
        ["DOWN", "NOT_RESPONDING", "FAIL", "DRAIN", "IDLE", "mixed"]), max_size=3), reason=texts), max_size=2))
    records = [r for r in (error_record_from_dict(e) for e in errors) if r is not None]
    return Evidence(job=job, logs=tuple(logs), errors=tuple(records), nvml=tuple(nvml), kmsg=tuple(xids),
                    nodes=tuple(nodes), in_allocation=draw(st.booleans()))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evidences())
def test_any_evidence_gives_a_valid_verdict(ev):
    v = classify(ev)
    assert isinstance(v.category, Category) and isinstance(v.action, Action)
    assert 0.0 <= v.confidence <= 1.0 and not math.isnan(v.confidence)
    assert len(v.evidence) <= RULES.limits.max_evidence + 3
    assert all(isinstance(r, int) for r in v.culprit.ranks) and all(isinstance(n, str) and n for n in v.culprit.nodes)
    assert v.to_dict() == classify(ev).to_dict()  # deterministic


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evidences())
def test_fast_scan_agrees_with_reference(ev):
    assert classify(ev).to_dict() == classify(ev, reference_scan=True).to_dict()


@settings(max_examples=150, deadline=None)
@given(texts)
def test_xid_parsers_never_crash(text):
    for line in text.splitlines():
        parsed = parse_xid_line(line)
        assert parsed is None or (isinstance(parsed[1], int) and parsed[1] >= 0)
    assert all(e.node == "n1" for e in parse_kmsg_xids(text, "n1"))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["rank", "time", "exc_type", "message", "host", "pid", "x"]),
                       st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=5), st.booleans(),
                                 st.lists(st.integers(), max_size=2))))
def test_error_record_from_arbitrary_json(data):
    record = error_record_from_dict(data)
    assert record is None or (isinstance(record.rank, int) and isinstance(record.time, float))
