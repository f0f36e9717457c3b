"""The reduction rules, the record adapters and the engine's guarantees (pure, bounded, deterministic)."""

from __future__ import annotations

import builtins
import dataclasses

import pytest

from slurm_ft.classify import Action, Category, Evidence, JobEnd, LogTail, NodeEvent, classify, default_rules
from slurm_ft.classify.engine import explain, victims_view
from slurm_ft.core.rundir import ErrorRecord
from slurm_ft.health.records import GpuHealth, NodeReport, NvmlSnapshot, XidEvent
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo

REMOTE = "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."


def test_hardware_on_a_node_beats_an_earlier_rank_error():
    ev = Evidence(
        errors=(ErrorRecord(rank=0, time=1.0, exc_type="KeyError", message="'x'", host="n1"),),
        kmsg=(XidEvent(node="n2", xid=79, gpu_index=0),),
    )
    v = classify(ev)
    assert (v.category, v.action, v.culprit.nodes) == (Category.HARDWARE_GPU, Action.REQUEUE_EXCLUDE, ("n2",))
    assert any(line.startswith("outweighed: 1 finding on ranks 0") for line in v.evidence)


def test_node_fail_beats_rank_errors_but_not_gpu_hardware():
    job = JobEnd(state="NODE_FAIL", nodes=("n1", "n2", "n3"))
    nodes = (NodeEvent(name="n3", state=frozenset({"DOWN"})),)
    ranks = (LogTail(source=0, text="KeyError: 'x'"),)
    assert classify(Evidence(job=job, nodes=nodes, logs=ranks)).category is Category.HARDWARE_NODE
    both = classify(Evidence(job=job, nodes=nodes, logs=ranks, kmsg=(XidEvent(node="n1", xid=95),)))
    assert both.category is Category.HARDWARE_GPU and both.culprit.nodes == ("n1", "n3")


def test_victims_never_decide_when_a_primary_exists():
    logs = tuple(LogTail(source=r, text=REMOTE) for r in range(1, 8))
    logs += (LogTail(source=0, text="RuntimeError: CUDA error: device-side assert triggered"),)
    v = classify(Evidence(logs=logs))
    assert (v.category, v.culprit.ranks) == (Category.USER_CODE, (0,))
    assert v.evidence[-1] == "secondary, not the cause: 7 findings on ranks 1-7 (nccl_remote_error)"


def test_earliest_rank_needs_every_candidate_timed():
    timed = Evidence(errors=(
        ErrorRecord(rank=1, time=20.0, exc_type="torch.OutOfMemoryError", message="CUDA out of memory."),
        ErrorRecord(rank=2, time=10.0, exc_type="KeyError", message="'x'"),
    ))
    assert classify(timed).culprit.ranks == (2,)
    untimed = dataclasses.replace(timed, logs=(LogTail(source=3, text="ValueError: bad"),))
    v = classify(untimed)  # rank 3 has no time: the most specific error (OOM, priority 65) decides
    assert (v.category, v.culprit.ranks) == (Category.OOM_GPU, (1,))


def test_in_allocation_prefers_restart_in_place_for_transient_categories():
    hang = (LogTail(source=1, text="[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)"),)
    assert classify(Evidence(logs=hang)).action is Action.REQUEUE
    assert classify(Evidence(logs=hang, in_allocation=True)).action is Action.RESTART_IN_PLACE
    oom = (LogTail(source=1, text="torch.OutOfMemoryError: CUDA out of memory."),)
    assert classify(Evidence(logs=oom, in_allocation=True)).action is Action.STOP


def test_final_states_ignore_everything_else():
    xid = (XidEvent(node="n2", xid=79),)
    for state, category in (("COMPLETED", Category.UNKNOWN), ("CANCELLED", Category.CANCELLED)):
        v = classify(Evidence(job=JobEnd(state=state), kmsg=xid))
        assert (v.category, v.action, v.confidence, v.culprit.nodes) == (category, Action.NONE, 1.0, ())


def test_job_nodes_filter_out_other_nodes_records():
    job = JobEnd(state="FAILED", exit_code=1, nodes=("n1",))
    ev = Evidence(job=job, kmsg=(XidEvent(node="n9", xid=79),), nodes=(NodeEvent(name="n9", state=frozenset({"DOWN"})),),
                  nvml=(NvmlSnapshot(node="n9", time=0.0, available=True, gpus=(GpuHealth(index=0, remap_failure=True),)),))
    assert classify(ev).category is Category.UNKNOWN


def test_requeue_exclude_without_a_node_becomes_requeue():
    v = classify(Evidence(logs=(LogTail(source=2, text="RuntimeError: CUDA error: uncorrectable ECC error encountered"),)))
    assert (v.category, v.action, v.culprit.ranks) == (Category.HARDWARE_GPU, Action.REQUEUE, (2,))
    assert "no node to exclude: plain requeue" in v.evidence


def test_xid_pid_maps_to_the_rank_of_the_error_file():
    ev = Evidence(errors=(ErrorRecord(rank=6, time=1.0, exc_type="RuntimeError", message="boom", host="n2", pid=777),),
                  logs=(LogTail(source="n2", kind="kmsg", text="NVRM: Xid (PCI:0000:3b:00): 79, pid=777, GPU has fallen off the bus."),))
    v = classify(ev)
    assert (v.culprit.nodes, v.culprit.ranks) == (("n2",), (6,))


def test_rank_prefixes_in_node_logs():
    text = "[rank5]: KeyError: 'a'\n3: AssertionError: b\n[PG 0 (default_pg) Rank 7] Watchdog caught collective operation timeout: WorkNCCL(x)"
    ranks = {f.rank for f in explain(Evidence(logs=(LogTail(source="n1", text=text),)))}
    assert ranks == {3, 5, 7}


def test_from_node_reports_merges_and_dedupes():
    err = {"rank": 3, "time": 5.0, "exc_type": "KeyError", "message": "'labels'", "host": "", "pid": 10}
    r1 = NodeReport(job_id=7, node="n1", time=9.0, error_files=(err, {"garbage": True}),
                    log_tails={"rank:3": "KeyError: 'labels'", "node:n1": "srun: error: n1: task 3: Exited with exit code 1"},
                    exit_code=1, nvml=NvmlSnapshot(node="n1", time=9.0, available=True))
    r2 = NodeReport(job_id=7, node="n2", time=9.0, error_files=(err,), kmsg_xids=(XidEvent(node="n2", xid=45),))
    ev = Evidence.from_node_reports(JobEnd(state="FAILED"), [r1, r2])
    assert len(ev.errors) == 1 and ev.errors[0].host == "n1"  # default host: the report's node
    assert ev.job.exit_code == 1
    assert [(t.source, t.node) for t in ev.logs] == [("n1", ""), (3, "n1")]
    assert len(ev.nvml) == 1 and ev.kmsg[0].xid == 45
    v = classify(ev)
    assert (v.category, v.culprit.ranks, v.culprit.nodes) == (Category.USER_CODE, (3,), ("n1",))


def test_adapters_from_slurm_records():
    job = JobEnd.from_job_info(JobInfo(job_id=4, state=JobState.NODE_FAIL, nodes=("n1",), exit_code=0, exit_signal=9))
    assert (job.state, job.signal, job.job_id) == ("NODE_FAIL", 9, 4)
    assert JobEnd(state="CANCELLED by 1000").state == JobEnd(state="cancelled+").state == "CANCELLED"
    assert classify(Evidence(job=JobEnd(state="CANCELLED by 0"))).action is Action.NONE
    node = NodeEvent.from_node_info(NodeInfo(name="n1", state=frozenset({"down", "NOT_RESPONDING"}), reason="x"))
    assert node.state == frozenset({"DOWN", "NOT_RESPONDING"})
    with pytest.raises(ValueError, match="source"):
        LogTail(source=True, text="")
    with pytest.raises(ValueError, match="kind"):
        LogTail(source=1, text="", kind="stdout")


def test_classify_is_deterministic_and_does_no_io(monkeypatch):
    default_rules()  # the shipped rules are read once, before
    ev = Evidence(logs=tuple(LogTail(source=r, text=f"KeyError: {r}\n{REMOTE}") for r in range(8)),
                  kmsg=(XidEvent(node="n2", xid=13),))

    def no_io(*args, **kwargs):
        raise AssertionError("classify opened a file")

    monkeypatch.setattr(builtins, "open", no_io)
    first = classify(ev).to_dict()
    assert all(classify(ev).to_dict() == first for _ in range(5))
    assert first["culprit"]["ranks"] == list(range(8))


def test_evidence_stays_bounded():
    text = "\n".join(f"[rank{r}]: KeyError: '{'k' * 2000}'" for r in range(500))
    v = classify(Evidence(logs=(LogTail(source="n1", text=text),)))
    limits = default_rules().limits
    assert len(v.evidence) <= limits.max_evidence + 3
    assert all(len(line) <= 400 for line in v.evidence)


def test_nvml_thresholds_follow_the_rules():
    gpu = GpuHealth(index=0, ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=500, temperature_c=99)
    ev = Evidence(nvml=(NvmlSnapshot(node="n1", time=0.0, available=True, gpus=(gpu,)),))
    assert classify(ev).category is Category.UNKNOWN  # aggregate and temperature limits are off by default
    rules = dataclasses.replace(default_rules(), nvml=dataclasses.replace(default_rules().nvml, temperature_max_c=95))
    assert classify(ev, rules).category is Category.HARDWARE_GPU


def test_error_files_naming_other_nodes_blame_none_of_them_and_attest_nothing():
    """Issue 16: a job on n1 wrote error files with "host": n2/n3/n4 and an ECC message; n2-n4 were drained."""
    ecc = "CUDA error: uncorrectable ECC error encountered"
    forged = tuple(ErrorRecord(rank=r, time=1.0 + r, exc_type="RuntimeError", message=ecc, host=f"n{r + 2}")
                   for r in range(3))
    v = classify(Evidence(job=JobEnd(state="FAILED", exit_code=1, nodes=("n1",)), errors=forged))
    assert not set(v.culprit.nodes) & {"n2", "n3", "n4"}
    assert v.attested_nodes == ()


def test_a_log_line_naming_a_node_is_the_jobs_word_even_for_its_own_node():
    logs = (LogTail(source=0, text="slurmstepd: error: *** JOB 7 ON n1 CANCELLED DUE TO NODE FAILURE, node n1"),)
    v = classify(Evidence(job=JobEnd(state="FAILED", exit_code=1, nodes=("n1", "n2")), logs=logs))
    assert v.attested_nodes == ()


def test_the_nodes_own_evidence_is_attested():
    v = classify(Evidence(job=JobEnd(state="FAILED", nodes=("n1", "n2")), kmsg=(XidEvent(node="n2", xid=79),)))
    assert v.culprit.nodes == ("n2",) and v.attested_nodes == ("n2",)


@pytest.mark.parametrize("exc_type, message, victim", [
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                     "[127.0.0.1]:35233", True),
    ("RuntimeError", "CUDA error: an illegal memory access was encountered", False),
    ("ValueError", "bad batch shape", False),
])
def test_victims_view_tells_a_peers_closed_connection_from_an_error_of_its_own(exc_type, message, victim):
    assert victims_view(ErrorRecord(rank=0, time=1.0, exc_type=exc_type, message=message)) is victim


def test_a_gpu_that_kept_a_dead_attempts_memory_is_hardware_gpu_on_its_node():
    from slurm_ft.core.rundir import RankEnd
    from slurm_ft.health.records import GpuHold

    held = GpuHold(node="n2", gpu_index=1, pci_bus="0000:2a:00", pids=(4242,), used_mb=30000, waited_s=30.0)
    killed = RankEnd(rank=1, time=10.0, host="n2", pid=4242, signal=9)
    verdict = classify(Evidence(ends=(killed,), held_gpus=(held,), in_allocation=True))
    assert verdict.category is Category.HARDWARE_GPU and verdict.recoverable
    assert verdict.culprit.nodes == ("n2",) and verdict.attested_nodes == ("n2",)  # NVML, read on n2
    assert verdict.evidence[0] == held.describe()
    # without the hold the same kill is a rank killed from outside, not the GPU's fault
    assert classify(Evidence(ends=(killed,), in_allocation=True)).category is Category.UNKNOWN
    # a held GPU on a node outside the job is none of its business
    outside = classify(Evidence(job=JobEnd(state="FAILED", nodes=("n1",)), held_gpus=(held,)))
    assert outside.category is not Category.HARDWARE_GPU
