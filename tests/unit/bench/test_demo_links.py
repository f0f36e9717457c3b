"""The demo's network scenarios (hosts mode): link-down's job has a spare; link-flap's a short hang timeout; their
checks hold on the right evidence and fail on the wrong; both need ``--hosts``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_ft.bench import demo
from slurm_ft.bench.demo import (
    FLAP_HANG_TIMEOUT,
    HANG_TIMEOUT,
    HOSTS_ONLY,
    DemoConfig,
    Run,
    culprit_checks,
    default_scenarios,
    ft_flags,
    jobs_dir,
    link_checks,
    node_count,
)
from slurm_ft.lab.faults import FaultTiming
from slurm_ft.slurm.types import JobInfo, JobState


class _Quarantine:
    def __init__(self, *nodes: str, struck: tuple[tuple[str, int, str], ...] = ()) -> None:
        self.nodes = set(nodes)
        self.struck = struck  # (node, job id, category)

    def is_quarantined(self, node: str) -> bool:
        return node in self.nodes

    def strikes(self, node: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(job_id=job, category=cat) for name, job, cat in self.struck if name == node]


def _final(restarts: int = 0, excluded: tuple[str, ...] = ()) -> JobInfo:
    return JobInfo(job_id=3, name="x", user_id=0, state=JobState.COMPLETED, restart_count=restarts,
                   excluded_nodes=excluded)


def _timing(detection: float) -> FaultTiming:
    return FaultTiming(fault_time=0.0, fault_step=10, detection_s=detection)


def _starts(*attempts: tuple[str, ...]) -> list[dict]:
    return [{"event": "attempt_start", "attempt": i + 1, "nodes": list(n)} for i, n in enumerate(attempts)]


def test_network_scenarios_need_hosts_mode_and_only_link_down_is_in_the_hosts_default():
    with pytest.raises(ValueError, match=r"'link-down' needs a lab whose nodes are hosts \(not with --single-address"):
        DemoConfig(dir=Path("/tmp/d"), scenarios=("link-down",), hosts=False)
    single = DemoConfig(dir=Path("/tmp/d"), hosts=False)
    assert not set(HOSTS_ONLY) & set(single.scenarios)
    assert single.note == "link-down skipped: the lab's nodes are not hosts (--single-address)"
    hosted = DemoConfig(dir=Path("/tmp/d"), hosts=True)
    assert set(hosted.scenarios) - set(single.scenarios) == {"link-down"} and hosted.note == ""
    assert default_scenarios(True) == hosted.scenarios and default_scenarios(False) == single.scenarios
    assert DemoConfig(dir=Path("/tmp/d"), scenarios=("link-flap",), hosts=True).scenarios == ("clean", "link-flap")


def test_the_default_follows_what_this_machine_allows(monkeypatch):
    monkeypatch.setattr(demo.lab_hosts, "refusal", lambda: "not root (euid 5)")
    refused = DemoConfig(dir=Path("/tmp/d"))
    assert (refused.hosts, refused.refused) == (False, "not root (euid 5)") and "link-down" not in refused.scenarios
    assert refused.note == "link-down skipped: the lab's nodes are not hosts (namespaces refused: not root (euid 5))"
    with pytest.raises(ValueError, match=r"hosts \(namespaces refused here: not root \(euid 5\)\)"):
        DemoConfig(dir=Path("/tmp/d"), scenarios=("link-flap",))
    monkeypatch.setattr(demo.lab_hosts, "refusal", lambda: None)
    allowed = DemoConfig(dir=Path("/tmp/d"))
    assert allowed.hosts is True and "link-down" in allowed.scenarios and allowed.note == "" and allowed.auto
    assert not DemoConfig(dir=Path("/tmp/d"), hosts=True).auto


def test_jobs_live_in_the_shared_lab_dir_in_hosts_mode():  # every node's /tmp is its own there
    assert jobs_dir(DemoConfig(dir=Path("/tmp/d"), hosts=True), Path("/tmp/d/lab")) == Path("/tmp/d/lab/jobs")
    assert jobs_dir(DemoConfig(dir=Path("/tmp/d"), hosts=False), Path("/tmp/d/lab")) == Path("/tmp/d/jobs")


def test_link_down_has_a_spare_and_link_flap_a_short_hang_timeout():
    down, flap = Run(name="link-down", ckpt=Path("/c")), Run(name="link-flap", ckpt=Path("/c"))
    assert node_count(down) == 3 and "--ft-spare-nodes=1" in ft_flags(down) and "--no-kill" in ft_flags(down)
    assert f"--ft-hang-timeout={HANG_TIMEOUT}" in ft_flags(down)
    assert node_count(flap) == 2 and f"--ft-hang-timeout={FLAP_HANG_TIMEOUT}" in ft_flags(flap)


def test_link_down_checks():
    run = Run(name="link-down", ckpt=Path("/c"), victim="n2", final=_final())
    good = _starts(("n1", "n2", "n3"), ("n1", "n3"))
    assert all(held for _, held in link_checks(run, _timing(11.0), good, _Quarantine("n2")))
    failed = [what for what, held in link_checks(run, _timing(16.0), _starts(("n1", "n2"), ("n1", "n2")),
                                                 _Quarantine())
              if not held]
    assert failed == [f"detected within the {HANG_TIMEOUT} s hang timeout + 5 s",
                      "went on without n2 (spare or requeue excluding it)"]
    requeued = Run(name="link-down", ckpt=Path("/c"), victim="n2", final=_final(1, ("n2",)))
    assert all(held for _, held in link_checks(requeued, _timing(3.0), good, _Quarantine("n2")))
    verdict = {"category": "network", "culprit": {"nodes": ["n2"], "ranks": []}}
    assert all(held for _, held in culprit_checks(run, [], verdict))
    wrong = {"category": "hang", "culprit": {"nodes": ["n1", "n2"], "ranks": [0, 1]}}
    assert [w for w, held in culprit_checks(run, [], wrong) if not held] == ["culprit n2 only",
                                                                             "network or hardware_node"]


def test_link_flap_checks():
    run = Run(name="link-flap", ckpt=Path("/c"), victim="n2", final=_final(), job_id=3)
    same = _starts(("n1", "n2"), ("n1", "n2"))
    struck = _Quarantine(struck=(("n2", 3, "network"), ("n2", 1, "hang")))
    assert all(held for _, held in link_checks(run, _timing(6.0), same, struck))
    failed = [what for what, held in link_checks(run, _timing(6.0), _starts(("n1", "n2"), ("n1", "n3")),
                                                 _Quarantine("n2")) if not held]
    assert failed == ["recovered in place on the same nodes", "n2 struck once (network, its epilog's own link "
                      "counters)", "n2 not quarantined"]
    flap = {"category": "network", "recoverable": True, "culprit": {"nodes": ["n2"], "ranks": []},
            "evidence": ["n2: link eth0 went down: carrier_down_count 1 -> 2 (+1)"]}
    assert all(held for _, held in culprit_checks(run, [], flap))
    unnamed = {"category": "hang", "recoverable": True, "culprit": {"nodes": [], "ranks": []}, "evidence": []}
    assert [w for w, held in culprit_checks(run, [], unnamed) if not held] == [
        "culprit n2 only", "network, recoverable", "the link's counter in the evidence"]
    blamed = {"category": "network", "recoverable": True, "culprit": {"nodes": ["n1"], "ranks": []},
              "evidence": ["n1: link eth0 went down: carrier_down_count 1 -> 2 (+1)"]}
    assert [w for w, held in culprit_checks(run, [], blamed) if not held] == [
        "culprit n2 only", "the link's counter in the evidence"]


def test_slow_link_must_run_on_without_a_fault_verdict():
    from slurm_ft.bench.demo import run_checks

    cfg = DemoConfig(dir=Path("/tmp/d"), scenarios=("slow-link",), hosts=True)
    run = Run(name="slow-link", ckpt=Path("/c"), victim="n2", final=_final(),
              result={"step": cfg.steps, "param_sha256": "x"})
    one = _starts(("n1", "n2"))
    checks = run_checks(cfg, run, _timing(0.0), one, "x", {}, _Quarantine())
    assert all(held for _, held in checks)
    hung = [*one, {"event": "fault_detected", "kind": "hung"}, *_starts(("n1", "n2"), ("n1", "n2"))[1:]]
    failed = [what for what, held in run_checks(cfg, run, _timing(0.0), hung, "x", {}, _Quarantine()) if not held]
    assert failed == ["no fault detected", "one attempt, not requeued"]
    assert [w for w, held in culprit_checks(run, [], {"category": "hang"}) if not held] == ["no verdict"]
    # its node quarantined by another scenario's fault (link-down on the same node in the matrix) is no failure;
    # a strike for this job is
    slow = Run(name="slow-link", ckpt=Path("/c"), victim="n2", final=_final(), job_id=8,
               result={"step": cfg.steps, "param_sha256": "x"})
    other = _Quarantine("n2", struck=(("n2", 6, "hardware_node"),))
    assert all(held for _, held in run_checks(cfg, slow, _timing(0.0), one, "x", {}, other))
    mine = _Quarantine(struck=(("n2", 8, "network"),))
    assert [w for w, held in run_checks(cfg, slow, _timing(0.0), one, "x", {}, mine) if not held] == [
        "n2 not struck for this job"]


def test_the_demo_lab_keeps_finished_jobs_until_the_checks_read_them():
    from slurm_ft.bench.demo import demo_lab_config

    hosts = demo_lab_config(DemoConfig(dir=Path("/tmp/d"), hosts=True))
    assert hosts.nodes == 5 and hosts.min_job_age >= 1800  # the full matrix ran 539 s: jobs of 300 s were gone
    assert demo_lab_config(DemoConfig(dir=Path("/tmp/d"), hosts=False)).nodes == 4
