"""Quarantine store and policy: transitions, drain-reason ownership, concurrency across processes."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_ft.cluster.quarantine import (
    NodeState,
    Quarantine,
    QuarantineConfig,
    QuarantineStore,
    category_of_reason,
    drain_reason,
    parse_slurm_user,
    require_privileged,
)
from slurm_ft.core.errors import ConfigError, SlurmCommandError, SlurmFtError
from slurm_ft.core.taxonomy import Category
from slurm_ft.slurm.types import NodeInfo


class FakeSlurm:
    """Just the node side of SlurmClient, with a log of the calls that change Slurm."""

    def __init__(self, *names: str) -> None:
        self.info = {n: NodeInfo(name=n, state=frozenset({"IDLE"})) for n in names}
        self.calls: list[tuple[str, ...]] = []
        self.fail_drain = False

    def nodes(self) -> list[NodeInfo]:
        return list(self.info.values())

    def drain(self, node: str, reason: str) -> None:
        if self.fail_drain:
            raise SlurmCommandError("scontrol update failed (exit 1): slurm_update error: Invalid node name")
        self.calls.append(("drain", node, reason))
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE", "DRAIN"}), reason=reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE"}))

    def admin_drain(self, node: str, reason: str) -> None:
        self.info[node] = NodeInfo(name=node, state=frozenset({"IDLE", "DRAIN"}), reason=reason)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(tmp_path: Path):
    slurm, clock = FakeSlurm("n1", "n2"), Clock()
    q = Quarantine(QuarantineStore(tmp_path / "q.db"), QuarantineConfig(min_quarantine_s=60, probation_s=600,
                                                                        strike_window_s=3600), slurm, clock)
    return q, slurm, clock


def test_unknown_node_is_healthy_and_reading_creates_nothing(tmp_path: Path) -> None:
    q = Quarantine(QuarantineStore(tmp_path / "q.db"))
    assert q.state("n1") is NodeState.HEALTHY and q.list() == [] and not (tmp_path / "q.db").exists()


def test_hardware_strike_quarantines_and_drains_with_a_tagged_reason(env) -> None:
    q, slurm, _ = env
    assert q.strike("n1", Category.HARDWARE_GPU, "Xid 79 on gpu 1: GPU has fallen off the bus", 42) \
        is NodeState.QUARANTINED
    assert slurm.calls == [("drain", "n1", "slurm-ft: hardware_gpu: Xid 79 on gpu 1: GPU has fallen off the bus")]
    rec = q.record("n1")
    assert rec.state is NodeState.QUARANTINED and rec.drained and rec.category == "hardware_gpu"
    assert q.is_quarantined("n1") and not q.is_quarantined("n2")
    assert q.strikes("n1")[0].job_id == 42
    # a second strike while quarantined records evidence but does not drain again
    q.strike("n1", "hardware_gpu", "Xid 48")
    assert len(slurm.calls) == 1 and len(q.strikes("n1")) == 2


def test_soft_strikes_make_a_lemon(env) -> None:
    q, slurm, clock = env
    assert q.strike("n1", Category.NETWORK, "NCCL timeout") is NodeState.HEALTHY
    clock.now += 60
    assert q.strike("n1", Category.HANG, "no heartbeat 600 s") is NodeState.SUSPECT
    assert q.record("n1").recent_strikes == 2 and slurm.calls == []
    clock.now += 60
    assert q.strike("n1", Category.UNKNOWN, "exit 1, no error file") is NodeState.QUARANTINED
    assert slurm.calls[0][:2] == ("drain", "n1") and slurm.calls[0][2].startswith("slurm-ft: unknown: ")


def test_soft_strikes_age_out_of_the_window(env) -> None:
    q, _, clock = env
    q.strike("n1", Category.NETWORK, "a")
    q.strike("n1", Category.NETWORK, "b")
    assert q.state("n1") is NodeState.SUSPECT
    clock.now += 3601
    assert q.state("n1") is NodeState.HEALTHY
    assert q.strike("n1", Category.NETWORK, "c") is NodeState.HEALTHY  # the old two no longer count
    assert q.history("n1")[0].reason == "strikes aged out"


def test_job_faults_are_history_only(env) -> None:
    q, slurm, _ = env
    for _ in range(5):
        assert q.strike("n1", Category.USER_CODE, "ZeroDivisionError") is NodeState.HEALTHY
    assert slurm.calls == [] and len(q.strikes("n1")) == 5


def test_foreign_drain_is_never_overwritten_or_lifted(env) -> None:
    q, slurm, _ = env
    slurm.admin_drain("n1", "bad DIMM, ticket 1234")
    assert q.strike("n1", Category.HARDWARE_GPU, "Xid 79") is NodeState.QUARANTINED
    assert slurm.calls == [] and slurm.info["n1"].reason == "bad DIMM, ticket 1234"
    assert not q.record("n1").drained
    q.release("n1")
    assert slurm.calls == [] and slurm.info["n1"].drained  # still the admin's drain
    assert any("foreign reason" in h.reason for h in q.history("n1"))


def test_release_resumes_our_drain_and_resets_strikes(env) -> None:
    q, slurm, _ = env
    for _ in range(3):
        q.strike("n1", Category.NETWORK, "x")
    assert q.state("n1") is NodeState.QUARANTINED
    assert q.release("n1", by="alice") is NodeState.HEALTHY
    assert slurm.calls[-1] == ("resume", "n1") and not slurm.info["n1"].drained
    assert q.record("n1").recent_strikes == 0
    assert q.strike("n1", Category.NETWORK, "y") is NodeState.HEALTHY
    released = [h for h in q.history("n1") if h.reason == "released"][0]
    assert released.actor == "alice" and released.from_state == "quarantined"


def test_release_lifts_a_tagged_drain_the_store_never_saw(env) -> None:
    q, slurm, _ = env
    slurm.admin_drain("n2", "slurm-ft: hardware_gpu: set by a prolog without the store")
    q.release("n2")
    assert slurm.calls == [("resume", "n2")]


def test_health_check_then_probation_then_healthy(env) -> None:
    q, slurm, clock = env
    q.add("n1", "Xid 79", category=Category.HARDWARE_GPU)
    assert q.health_passed("n1") is NodeState.QUARANTINED  # too early: min_quarantine_s = 60
    clock.now += 61
    assert q.health_passed("n1") is NodeState.PROBATION
    assert slurm.calls[-1] == ("resume", "n1")
    clock.now += 599
    assert q.state("n1") is NodeState.PROBATION
    clock.now += 2
    assert q.state("n1") is NodeState.HEALTHY


def test_a_soft_strike_on_probation_quarantines_again(env) -> None:
    q, slurm, clock = env
    q.add("n1", "manual", by="root")
    clock.now += 61
    q.health_passed("n1")
    assert q.strike("n1", Category.HANG, "stuck in allreduce") is NodeState.QUARANTINED
    assert [c[0] for c in slurm.calls] == ["drain", "resume", "drain"]


def test_failed_drain_is_retried_by_reconcile(env) -> None:
    q, slurm, _ = env
    slurm.fail_drain = True
    assert q.strike("n1", Category.HARDWARE_NODE, "NODE_FAIL") is NodeState.QUARANTINED
    assert not q.record("n1").drained and "drain failed" in q.history("n1")[0].reason
    slurm.fail_drain = False
    assert q.reconcile() == ["n1: drained 'slurm-ft: hardware_node: NODE_FAIL'"]
    assert q.record("n1").drained


def test_reconcile_adopts_tagged_drains_and_honours_manual_resume(env) -> None:
    q, slurm, _ = env
    slurm.admin_drain("n2", "slurm-ft: hardware_gpu: Xid 79 on gpu 0 (from prolog)")
    q.add("n1", "manual")
    slurm.info["n1"] = NodeInfo(name="n1", state=frozenset({"IDLE"}))  # an admin ran scontrol ... state=resume
    changes = q.reconcile()
    assert sorted(changes) == ["n1: released (resumed outside slurm-ft)",
                               "n2: adopted drain 'slurm-ft: hardware_gpu: Xid 79 on gpu 0 (from prolog)'"]
    assert q.state("n1") is NodeState.HEALTHY
    rec = q.record("n2")
    assert rec.state is NodeState.QUARANTINED and rec.category == "hardware_gpu" and rec.drained
    assert q.reconcile() == []


def test_without_a_client_it_only_records(tmp_path: Path) -> None:
    q = Quarantine(QuarantineStore(tmp_path / "q.db"))
    assert q.add("n1", "x") is NodeState.QUARANTINED and q.reconcile() == []


def test_drain_reason_format() -> None:
    assert drain_reason("hardware_gpu", "Xid 79\non gpu 1\t!") == "slurm-ft: hardware_gpu: Xid 79 on gpu 1 !"
    long = drain_reason("network", "x" * 500, 80)
    assert len(long) == 80 and long.endswith("...") and long.startswith("slurm-ft: network: xxx")
    assert category_of_reason("slurm-ft: hang: no heartbeat") == "hang"
    assert category_of_reason("slurm-ft: nonsense") == "unknown"


def test_store_is_wal(env) -> None:
    q, _, _ = env
    q.add("n1", "x")
    conn = sqlite3.connect(q.store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unknown_category_is_refused(env) -> None:
    q, _, _ = env
    with pytest.raises(ValueError, match="'gpu'"):
        q.strike("n1", "gpu", "x")


@pytest.mark.parametrize(("values", "field"), [
    ({"suspect_after": 0}, "suspect_after"), ({"suspect_after": 4, "quarantine_after": 3}, "suspect_after"),
    ({"probation_s": -1}, "probation_s"), ({"soft_categories": ["flaky"]}, "soft_categories"),
    ({"soft_categories": ["hardware_gpu"]}, "soft_categories"), ({"reason_max_chars": 10}, "reason_max_chars"),
])
def test_bad_config_names_the_field(values: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        QuarantineConfig(**values)


def _hammer(path: str, worker: int) -> None:
    q = Quarantine(QuarantineStore(path), QuarantineConfig(suspect_after=5, quarantine_after=40))
    for i in range(25):
        q.strike("n1", Category.NETWORK, f"worker {worker} strike {i}", source=f"w{worker}")


def test_concurrent_writers_lose_nothing_and_transition_once(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    Quarantine(QuarantineStore(path)).release("n0")  # create the file first
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    q = Quarantine(QuarantineStore(path))
    assert len(q.strikes("n1", limit=1000)) == 100
    moves = [(h.from_state, h.to_state) for h in reversed(q.history("n1", limit=1000))]
    assert moves == [("healthy", "suspect"), ("suspect", "quarantined")]
    assert [s.evidence for s in q.strikes("n1", limit=1000)].count("worker 3 strike 24") == 1


def test_privilege_check() -> None:
    require_privileged(None, euid=0)
    require_privileged("slurm", euid=64030)
    with pytest.raises(SlurmFtError, match="needs root or SlurmUser 'slurm'; you are 'nobody'") as err:
        require_privileged("slurm", euid=65534)
    assert err.value.exit_code == 77


def test_parse_slurm_user() -> None:
    text = "Configuration data as of 2024-03-01T12:00:00\nSlurmUser               = slurm(64030)\nSlurmdUser = root(0)\n"
    assert parse_slurm_user(text) == "slurm"
    assert parse_slurm_user("nothing here") is None


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not shutil.which("su"),
                    reason="needs root, su and a system python to read as an unprivileged user")
def test_an_unprivileged_user_can_list() -> None:
    where = Path(tempfile.mkdtemp(prefix="slurm-ft-q-", dir="/tmp"))  # pytest's tmp dirs are private to root
    where.chmod(0o755)
    db = where / "q.db"
    Quarantine(QuarantineStore(db)).add("n1", "Xid 79", category="hardware_gpu")
    code = (f"from slurm_ft.cluster.quarantine import *; "
            f"print(Quarantine(QuarantineStore({str(db)!r})).list()[0].state.value)")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", f"PYTHONPATH={root} /usr/bin/python3 -c \"{code}\""],
                          capture_output=True, text=True, timeout=60, check=False)
    shutil.rmtree(where)
    assert done.stdout.strip() == "quarantined", done.stderr
