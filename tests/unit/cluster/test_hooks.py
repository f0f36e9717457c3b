"""Prolog gate and epilog gatherer, end to end with injected NVML, kernel log and Slurm (real files, real SQLite)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from slurm_ft.cluster.hooks import Deps, JobContext, bounded, run_hook
from slurm_ft.cluster.quarantine import NodeState, Quarantine, QuarantineStore
from slurm_ft.core.config import SiteConfig
from slurm_ft.core.rundir import ErrorRecord, write_error
from slurm_ft.health.kmsg import TextLines
from slurm_ft.health.links import SysfsLinks
from slurm_ft.health.nvml import NvmlProbe
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.health.records import NodeReport, XidEvent
from slurm_ft.slurm.types import NodeInfo

DATA = Path(__file__).parent.parent.parent / "data" / "nvml"


class FakeSlurm:
    def __init__(self, *names: str) -> None:
        self.info = {n: NodeInfo(name=n, state=frozenset({"ALLOCATED"})) for n in names}
        self.calls: list[tuple[str, ...]] = []

    def nodes(self) -> list[NodeInfo]:
        return list(self.info.values())

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))
        self.info[node] = NodeInfo(name=node, state=frozenset({"ALLOCATED", "DRAIN"}), reason=reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE"}))

    def update_job(self, job_id: int, *, comment: str | None = None, excluded_nodes=None) -> None:
        self.calls.append(("update_job", job_id, comment))

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))


class Env:
    """A site config in a temp dir, the injected side effects, and helpers to run a hook."""

    def __init__(self, tmp: Path, *, fake: str = "h100x4_healthy", extra: str = "") -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.snapshots = tmp / "snapshots"
        self.snapshots.mkdir()
        self.config = tmp / "config.toml"
        self.config.write_text(
            f'state_dir = "{self.state}"\n[health]\nexpected_gpus = 4\ntest_mode = true\n'
            f'test_nvml_snapshot_dir = "{self.snapshots}"\n[quarantine]\nmin_quarantine_s = 0\n{extra}')
        self.slurm = FakeSlurm("n1", "n2")
        self.lines: list[str] = []
        self.fake = fake
        self.kmsg = ""
        self.statvfs = os.statvfs
        self.sys = tmp / "sys"  # the node's /sys: link counters (none unless a test writes them)

    def deps(self) -> Deps:
        return Deps(probe=lambda node: NvmlProbe(FakeNvml.from_file(DATA / f"{self.fake}.fake.json")).snapshot(node),
                    client=lambda: self.slurm, log=self.lines.append, statvfs=lambda p: self.statvfs(p),
                    kmsg_sources=[TextLines(self.kmsg)], links=SysfsLinks(self.sys).read)

    def link(self, changes: int, downs: int) -> None:
        """Set the node's eth0 link counters."""
        folder = self.sys / "class/net/eth0"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "carrier_changes").write_text(f"{changes}\n")
        (folder / "carrier_down_count").write_text(f"{downs}\n")

    def run(self, kind: str, environ: dict[str, str], **kwargs) -> int:
        return run_hook(kind, config=str(self.config), environ=environ, deps=self.deps(), **kwargs)

    def quarantine(self) -> Quarantine:
        return Quarantine(QuarantineStore(self.state / "quarantine.db"), client=self.slurm)

    def mark_bad(self, node: str) -> None:
        """TEST-ONLY injection: a recorded snapshot with Xid 79 replaces NVML on ``node``."""
        (self.snapshots / f"{node}.json").write_text((DATA / "xid79.snapshot.json").read_text())


def job_env(job: int = 7, node: str = "n1", **extra: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node, "SLURM_JOB_UID": str(os.getuid()),
            "SLURM_JOB_USER": "alice", **extra}


@pytest.fixture
def lab(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_context_from_environ() -> None:
    ctx = JobContext.from_environ({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "gpu-01", "SLURM_JOB_UID": "1000",
                                   "SPANK_FT_CKPT_DIR": "/ckpt/a", "SLURM_JOB_EXIT_CODE2": "3:0"})
    assert (ctx.job_id, ctx.node, ctx.uid, ctx.ckpt_dir, ctx.run_dir) == (12, "gpu-01", 1000, "/ckpt/a",
                                                                          "/ckpt/a/.slurm-ft")
    assert (ctx.exit_code, ctx.exit_signal) == (3, None)
    assert JobContext.from_environ({"SLURM_JOB_EXIT_CODE": "9"}, node="n1").exit_signal == 9
    assert JobContext.from_environ({"SLURM_JOB_EXIT_CODE": "256"}, node="n1").exit_code == 1
    assert JobContext.from_environ({"SLURM_JOB_EXIT_CODE2": "0:15"}, node="n1").exit_signal == 15


def test_healthy_node_passes_and_leaves_a_record(lab: Env) -> None:
    assert lab.run("prolog", job_env()) == 0
    record = json.loads((lab.state / "prolog" / "7" / "n1.json").read_text())
    assert record["passed"] is True and record["findings"] == []
    assert lab.lines[-1] == "slurm-ft prolog job=7 node=n1: ok" and lab.slurm.calls == []
    assert not (lab.state / "jobs").exists()  # not an --ft job: no registry entry for the monitor


def test_an_ft_job_is_registered_for_the_monitor(lab: Env) -> None:
    assert lab.run("prolog", job_env(SPANK_FT_ENABLED="1", SPANK_FT_CKPT_DIR="/ckpt/x",
                                     SPANK_FT_MAX_RESTARTS="4")) == 0
    entry = json.loads((lab.state / "jobs" / "7.json").read_text())
    assert entry == {"job_id": 7, "ckpt_dir": "/ckpt/x", "run_dir": "/ckpt/x/.slurm-ft", "max_restarts": 4,
                     "user_id": os.getuid(), "no_requeue": False}


def test_the_registration_carries_no_requeue_to_the_monitor(lab: Env) -> None:
    from slurm_ft.cluster.monitor import read_registration
    from slurm_ft.core.registry import FtJob
    from slurm_ft.slurm.types import JobInfo

    assert lab.run("prolog", job_env(SPANK_FT_ENABLED="1", SPANK_FT_CKPT_DIR="/ckpt/x",
                                     SPANK_FT_NO_REQUEUE="1")) == 0  # sbatch --ft --ft-no-requeue
    assert json.loads((lab.state / "jobs" / "7.json").read_text())["no_requeue"] is True
    seen = read_registration(lab.state, JobInfo(job_id=7, user_id=os.getuid()))
    assert seen == FtJob(job_id=7, ckpt_dir="/ckpt/x", run_dir="/ckpt/x/.slurm-ft", user_id=os.getuid(),
                         no_requeue=True)


def test_bad_node_fails_the_prolog_and_is_quarantined(lab: Env) -> None:
    lab.mark_bad("n1")
    assert lab.run("prolog", job_env()) == 1
    (call,) = lab.slurm.calls
    assert call[:2] == ("drain", "n1")
    assert call[2] == ("slurm-ft: hardware_gpu: Xid 79 on gpu 1: GPU has fallen off the bus.; "
                       "gpu 1: NVML cannot read it: GPU is lost")
    rec = lab.quarantine().record("n1")
    assert rec.state is NodeState.QUARANTINED and rec.drained and lab.quarantine().strikes("n1")[0].job_id == 7
    assert any("TEST-ONLY: NVML snapshot read from" in line for line in lab.lines)
    assert any("FAIL hardware_gpu: Xid 79 on gpu 1" in line for line in lab.lines)
    assert lab.run("prolog", job_env(node="n2")) == 0  # the other node probes normally


def test_the_epilog_after_a_failed_prolog_does_not_strike_twice(lab: Env) -> None:
    lab.mark_bad("n1")
    assert lab.run("prolog", job_env()) == 1
    assert lab.run("epilog", job_env()) == 0
    assert len(lab.quarantine().strikes("n1")) == 1 and len(lab.slurm.calls) == 1
    report = json.loads((lab.state / "reports" / "7" / "n1.json").read_text())
    assert report["health"][0]["check"] == "xid"  # the evidence is still in the report


def test_quarantined_node_keeps_failing_until_released(lab: Env) -> None:
    lab.quarantine().add("n1", "admin says so", category="hardware_node")
    lab.slurm.calls.clear()
    assert lab.run("prolog", job_env()) == 1
    assert lab.slurm.calls == []  # already drained by us: nothing to redo
    assert any("node is quarantined (slurm-ft: hardware_node: admin says so)" in line for line in lab.lines)
    lab.quarantine().release("n1")
    assert lab.run("prolog", job_env()) == 0


def test_a_manual_resume_in_slurm_wins_over_the_store(lab: Env) -> None:
    lab.quarantine().add("n1", "x")
    lab.slurm.info["n1"] = NodeInfo(name="n1", state=frozenset({"IDLE"}))  # scontrol update state=resume
    assert lab.run("prolog", job_env()) == 0
    assert lab.quarantine().state("n1") is NodeState.HEALTHY


def test_wrong_gpu_count_fails(tmp_path: Path) -> None:
    lab = Env(tmp_path, extra="[health.expected_gpus_by_node]\nn1 = 8\n")
    assert lab.run("prolog", job_env()) == 1
    assert lab.slurm.calls[0][2] == "slurm-ft: hardware_gpu: expected 8 GPUs, NVML sees 4"


class _StatVfs:
    f_bavail, f_frsize = 100, 4096  # 400 KiB free


def test_low_space_in_the_checkpoint_dir_stops_the_job_and_never_drains_the_node(lab: Env, tmp_path: Path) -> None:
    """The checkpoint dir is the job's word: a typo or a full shared filesystem must not drain every node."""
    lab.statvfs = lambda path: _StatVfs()
    assert lab.run("prolog", job_env(SPANK_FT_CKPT_DIR=str(tmp_path / "ckpt"))) == 0
    reason = (f"slurm-ft: stopped cause=storage by=prolog: the job's checkpoint dir; checkpoint dir {tmp_path}/ckpt: "
              "0.0 GiB free < 1 GiB")
    assert lab.slurm.calls == [("update_job", 7, reason), ("cancel", 7)]
    assert not lab.quarantine().is_quarantined("n1")
    record = json.loads((lab.state / "prolog" / "7" / "n1.json").read_text())
    assert record["passed"] is True and record["job_findings"][0]["check"] == "space"
    assert any("JOB FAIL storage" in line and "node stays in service" in line for line in lab.lines)


def test_a_checkpoint_dir_under_proc_stops_the_job_not_the_node(lab: Env) -> None:
    assert lab.run("prolog", job_env(SPANK_FT_CKPT_DIR="/proc/nonexistent/ckpt")) == 0
    assert [c[0] for c in lab.slurm.calls] == ["update_job", "cancel"] and "drain" not in str(lab.slurm.calls)


def test_a_bad_gpu_and_a_bad_checkpoint_dir_drain_the_node_for_the_gpu_only(lab: Env, tmp_path: Path) -> None:
    lab.statvfs = lambda path: _StatVfs()
    lab.mark_bad("n1")
    assert lab.run("prolog", job_env(SPANK_FT_CKPT_DIR=str(tmp_path / "ckpt"))) == 1
    assert lab.quarantine().record("n1").category == "hardware_gpu"
    assert "storage" not in lab.quarantine().record("n1").reason


def test_a_hung_probe_fails_in_bounded_time(lab: Env) -> None:
    lab.config.write_text(lab.config.read_text() + "[hooks]\nnvml_timeout_s = 0.2\n")
    deps = lab.deps()
    deps.probe = lambda node: time.sleep(30)  # type: ignore[assignment, return-value]
    start = time.monotonic()
    assert run_hook("prolog", config=str(lab.config), environ=job_env(), deps=deps) == 1
    assert time.monotonic() - start < 5
    assert any("nvml probe timed out after 0.2 s" in line for line in lab.lines)


def test_without_a_local_store_the_hook_drains_directly_and_respects_foreign_reasons(lab: Env) -> None:
    lab.config.write_text(lab.config.read_text() + "[hooks]\nuse_quarantine_store = false\n")
    lab.mark_bad("n1")
    lab.mark_bad("n2")
    lab.slurm.info["n2"] = NodeInfo(name="n2", state=frozenset({"DRAIN"}), reason="DIMM swap, ticket 99")
    assert lab.run("prolog", job_env()) == 1 and lab.run("prolog", job_env(node="n2")) == 1
    assert [c[:2] for c in lab.slurm.calls] == [("drain", "n1")]
    assert lab.slurm.info["n2"].reason == "DIMM swap, ticket 99"
    assert not (lab.state / "quarantine.db").exists()


def test_health_check_mode_moves_a_quarantined_node_to_probation(lab: Env) -> None:
    lab.quarantine().add("n1", "Xid 79", category="hardware_gpu")
    assert lab.run("prolog", {"SLURMD_NODENAME": "n1"}, health_check=True) == 0
    assert lab.quarantine().state("n1") is NodeState.PROBATION and lab.slurm.calls[-1] == ("resume", "n1")
    lab.mark_bad("n1")
    assert lab.run("prolog", {"SLURMD_NODENAME": "n1"}, health_check=True) == 1
    assert lab.quarantine().state("n1") is NodeState.QUARANTINED


def test_epilog_writes_the_node_report(lab: Env, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    write_error(ckpt / ".slurm-ft", ErrorRecord(rank=3, time=2.0, exc_type="RuntimeError", message="NCCL timeout"))
    write_error(ckpt / ".slurm-ft", ErrorRecord(rank=1, time=1.0, exc_type="ValueError", message="bad"))
    assert lab.run("prolog", job_env()) == 0
    environ = job_env(SPANK_FT_CKPT_DIR=str(ckpt), SLURM_JOB_EXIT_CODE2="1:0", SLURM_JOB_EXIT_CODE="256")
    assert lab.run("epilog", environ) == 0
    report = NodeReport.from_dict(json.loads((lab.state / "reports" / "7" / "n1.json").read_text()))
    assert (report.job_id, report.node, report.exit_code, report.exit_signal) == (7, "n1", 1, None)
    assert [e["rank"] for e in report.error_files] == [1, 3]  # earliest first: the root cause
    assert report.error_files[1]["message"] == "NCCL timeout"
    assert report.nvml is not None and report.nvml.gpu_count == 4 and report.health == ()
    assert lab.slurm.calls == []


def test_epilog_kernel_xids_since_the_prolog_quarantine_the_node(lab: Env) -> None:
    assert lab.run("prolog", job_env()) == 0
    started = json.loads((lab.state / "prolog" / "7" / "n1.json").read_text())["time"]
    old = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started - 60))
    new = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started + 5))
    lab.kmsg = (f"{old} NVRM: Xid (PCI:0000:2a:00): 48, pid=1, DBE\n"
                f"{new} NVRM: Xid (PCI:0000:2a:00): 79, pid=1, GPU has fallen off the bus.\n")
    assert lab.run("epilog", job_env()) == 0
    report = NodeReport.from_dict(json.loads((lab.state / "reports" / "7" / "n1.json").read_text()))
    assert [x.xid for x in report.kmsg_xids] == [79]
    assert report.health[0]["evidence"] == "Xid 79 on 0000:2a:00 (kernel log): 79, pid=1, GPU has fallen off the bus."
    assert lab.quarantine().state("n1") is NodeState.QUARANTINED
    assert lab.slurm.calls[0][2].startswith("slurm-ft: hardware_gpu: Xid 79 on 0000:2a:00 (kernel log)")


def test_epilog_reads_no_files_of_another_owner(lab: Env, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    run_dir = tmp_path / "ckpt" / ".slurm-ft"
    write_error(run_dir, ErrorRecord(rank=0, time=1.0, exc_type="E", message="mine"))
    os.symlink("/etc/shadow", run_dir / "error.rank1.json")
    write_error(run_dir, ErrorRecord(rank=2, time=1.0, exc_type="E", message="planted"))
    os.chown(run_dir / "error.rank2.json", 65534, 65534)
    assert lab.run("epilog", job_env(SPANK_FT_CKPT_DIR=str(tmp_path / "ckpt"))) == 0
    report = json.loads((lab.state / "reports" / "7" / "n1.json").read_text())
    assert [e["message"] for e in report["error_files"]] == ["mine"]
    notes = "\n".join(report["notes"])
    assert "error.rank1.json: skipped" in notes and "owned by uid 65534" in notes
    os.chown(run_dir, 65534, 65534)
    assert lab.run("epilog", job_env(SPANK_FT_CKPT_DIR=str(tmp_path / "ckpt"))) == 0
    report = json.loads((lab.state / "reports" / "7" / "n1.json").read_text())
    assert report["error_files"] == [] and "not the job's uid" in "\n".join(report["notes"])


def test_broken_config_fails_the_gate_but_not_the_epilog(lab: Env) -> None:
    lab.config.write_text("[health]\nexpected_gpus = -3\n")
    assert lab.run("prolog", job_env()) == 2
    assert lab.run("epilog", job_env()) == 0


def test_an_internal_error_passes(lab: Env) -> None:
    deps = lab.deps()
    deps.clock = None  # type: ignore[assignment]
    assert run_hook("prolog", config=str(lab.config), environ=job_env(), deps=deps) == 0
    assert any("internal error, passing: TypeError" in line for line in lab.lines)


def test_bounded() -> None:
    assert bounded(lambda: 5, 1, "x") == (5, None)
    assert bounded(lambda: 1 / 0, 1, "x") == (None, "x failed: ZeroDivisionError: division by zero")
    assert bounded(lambda: time.sleep(5), 0.05, "sleep") == (None, "sleep timed out after 0.05 s")


def test_a_corrupt_quarantine_store_keeps_the_gate_on_and_drains_nothing_by_itself(lab: Env) -> None:
    """Issue 16: random bytes in quarantine.db made the prolog print 'internal error, passing' on a bad GPU."""
    lab.state.mkdir(parents=True, exist_ok=True)
    (lab.state / "quarantine.db").write_bytes(os.urandom(4096))
    assert lab.run("prolog", job_env(node="n2")) == 0  # healthy node: passes, nothing drained
    assert lab.slurm.calls == []
    assert any("ERROR quarantine store" in line and "Repair: mv" in line for line in lab.lines)
    lab.mark_bad("n1")
    assert lab.run("prolog", job_env(node="n1")) == 1  # the bad GPU is still refused
    assert not any("internal error" in line for line in lab.lines)


def test_a_checkpoint_path_with_a_comma_or_newline_still_stops_the_job_in_one_comment(lab: Env, tmp_path: Path) -> None:
    """The path is the user's: scontrol's Comment= must get one line without commas, or the job is not stopped."""
    lab.statvfs = lambda path: _StatVfs()
    assert lab.run("prolog", job_env(SPANK_FT_CKPT_DIR=str(tmp_path / "a,b\nc"))) == 0
    (update, cancel) = lab.slurm.calls
    assert update[0] == "update_job" and "," not in update[2] and "\n" not in update[2] and cancel == ("cancel", 7)


def test_a_checkpoint_dir_that_is_no_utf8_does_not_stop_the_epilog_from_quarantining(lab: Env, tmp_path: Path) -> None:
    """os.environ keeps a non-UTF-8 path as surrogates; the hooks' log file wrote it strictly and raised."""
    from dataclasses import replace

    from slurm_ft.cluster.hooks import Settings, _file_logger
    from slurm_ft.core.config import load_site_config

    settings = Settings.load(load_site_config(str(lab.config)))
    real_log = _file_logger(settings)
    lab.deps = lambda base=lab.deps: replace(base(), log=real_log)
    assert lab.run("prolog", job_env()) == 0
    started = json.loads((lab.state / "prolog" / "7" / "n1.json").read_text())["time"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started + 5))
    lab.kmsg = f"{stamp} NVRM: Xid (PCI:0000:2a:00): 79, pid=1, GPU has fallen off the bus.\n"
    bad = os.fsdecode(bytes(tmp_path) + b"/ck\xff\xfe")
    assert lab.run("epilog", job_env(SPANK_FT_CKPT_DIR=bad)) == 0
    assert lab.quarantine().state("n1") is NodeState.QUARANTINED
    logged = (lab.state / "log" / "hooks.log").read_text()
    assert "internal error" not in logged and "Xid 79" in logged


def test_the_hooks_judge_xids_by_the_classifiers_table_not_the_fallback_list():
    from slurm_ft.cluster import hooks
    from slurm_ft.health.checks import FALLBACK_DRAIN_XIDS

    table_only = XidEvent(node="n1", xid=109, gpu_index=0, text="Ctx switch timeout")  # drain in rules.toml
    recovery = ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
                "(GPU Reset Required)")
    assert 109 not in FALLBACK_DRAIN_XIDS and hooks.drains(table_only)
    assert hooks.drains(XidEvent(node="n1", xid=154, pci_bus="0000:3b:00", text=recovery, source="kmsg"))
    assert not hooks.drains(XidEvent(node="n1", xid=13, gpu_index=0, text="Graphics Exception"))
    settings = hooks.Settings.load(SiteConfig(sections={}, source="test"))
    found = hooks.judge_epilog(NodeReport(job_id=1, node="n1", time=0.0, kmsg_xids=(table_only,)), settings)
    assert [f.check for f in found] == ["xid"]


def _owned_dir(path: Path, uid: int, gid: int) -> Path:
    path.mkdir(mode=0o700)
    (path / "step_00000001.rank_00000.snap").write_bytes(b"x")
    for p in (path, path / "step_00000001.rank_00000.snap"):
        os.chown(p, uid, gid)
    return path


def test_the_epilog_removes_only_the_job_user_s_memory_tier_dir(lab: Env, users, tmp_path: Path) -> None:
    victim, attacker = users["victim"], users["attacker"]
    root = tmp_path / "shm"
    root.mkdir(mode=0o1777)
    os.chmod(root, 0o1777)
    deps = lab.deps()
    deps.shm_root = str(root)
    victim_dir = _owned_dir(root / "slurm-ft-7", victim.uid, victim.gid)
    # a job of the attacker with the same id on this node (or a forged SLURM_JOB_UID) leaves the victim's dir alone
    run_hook("epilog", config=str(lab.config), environ=job_env(SLURM_JOB_UID=str(attacker.uid)), deps=deps)
    assert victim_dir.is_dir() and any("owned by uid" in line for line in lab.lines)
    run_hook("epilog", config=str(lab.config), environ=job_env(SLURM_JOB_UID=str(victim.uid)), deps=deps)
    assert not victim_dir.exists()
    # the attacker's symlink named for its own job, pointing at the victim's files: not followed
    precious = _owned_dir(tmp_path / "precious", victim.uid, victim.gid)
    os.symlink(precious, root / "slurm-ft-8")
    os.lchown(root / "slurm-ft-8", attacker.uid, attacker.gid)
    run_hook("epilog", config=str(lab.config), environ=job_env(job=8, SLURM_JOB_UID=str(attacker.uid)), deps=deps)
    assert (precious / "step_00000001.rank_00000.snap").exists()


def test_a_link_that_went_down_during_the_job_strikes_the_node_once_and_never_drains_it(lab: Env) -> None:
    lab.link(2, 1)
    assert lab.run("prolog", job_env()) == 0
    assert json.loads((lab.state / "prolog" / "7" / "n1.json").read_text())["links"]["links"] == {
        "eth0": {"carrier_changes": 2, "carrier_down_count": 1}}
    lab.link(4, 2)  # the cable out and back in while the job ran
    assert lab.run("epilog", job_env()) == 0
    report = NodeReport.from_dict(json.loads((lab.state / "reports" / "7" / "n1.json").read_text()))
    assert report.link_losses == ({"node": "n1", "interface": "eth0", "counter": "carrier_down_count", "before": 1,
                                   "after": 2},)
    (strike,) = lab.quarantine().strikes("n1")
    assert (strike.category, strike.job_id, strike.source) == ("network", 7, "epilog")
    assert strike.evidence == "n1: link eth0 went down: carrier_down_count 1 -> 2 (+1)"
    assert lab.quarantine().state("n1") is NodeState.HEALTHY and lab.slurm.calls == []  # struck, not drained
    assert "STRIKE network: n1: link eth0 went down" in lab.lines[-2]


def test_a_steady_link_gives_no_strike_and_without_a_store_a_flap_is_only_reported(tmp_path: Path) -> None:
    lab = Env(tmp_path, extra="[hooks]\nuse_quarantine_store = false\n")
    lab.link(2, 1)
    assert lab.run("prolog", job_env()) == 0 and lab.run("epilog", job_env()) == 0
    assert NodeReport.from_dict(json.loads((lab.state / "reports" / "7" / "n1.json").read_text())).link_losses == ()
    lab.link(3, 2)
    assert lab.run("prolog", job_env(job=8)) == 0
    lab.link(5, 3)
    assert lab.run("epilog", job_env(job=8)) == 0
    assert "in the report only, no strike" in " ".join(lab.lines) and lab.slurm.calls == []
    assert not (lab.state / "quarantine.db").exists()
