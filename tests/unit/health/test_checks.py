"""Judging NVML snapshots and free space (pure), and the TEST-ONLY recorded-snapshot source."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from slurm_ft.core import env
from slurm_ft.core.errors import ConfigError
from slurm_ft.core.taxonomy import Category
from slurm_ft.health import checks
from slurm_ft.health.checks import HealthConfig, judge_nvml
from slurm_ft.health.nvml import NvmlProbe
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.health.records import NvmlSnapshot, XidEvent

DATA = Path(__file__).parent.parent.parent / "data" / "nvml"


def snap(name: str, node: str = "n1"):
    return NvmlProbe(FakeNvml.from_file(DATA / f"{name}.fake.json"), xid_wait_ms=5).snapshot(node)


def evidence(findings) -> list[tuple[str, str]]:
    return [(f.check, f.evidence) for f in findings]


def test_healthy_node_has_no_findings() -> None:
    assert judge_nvml(snap("h100x4_healthy"), HealthConfig(expected_gpus=4)) == []


def test_wrong_gpu_count() -> None:
    (finding,) = judge_nvml(snap("h100x4_healthy"), HealthConfig(expected_gpus=8))
    assert finding.category is Category.HARDWARE_GPU
    assert evidence([finding]) == [("gpu_count", "expected 8 GPUs, NVML sees 4")]


def test_per_node_expectation_wins() -> None:
    config = HealthConfig(expected_gpus=8, expected_gpus_by_node={"n1": 4})
    assert judge_nvml(snap("h100x4_healthy"), config) == []
    assert judge_nvml(snap("h100x4_healthy", node="n2"), config) != []


def test_xid79_and_lost_gpu_drain_but_xid13_does_not() -> None:
    found = evidence(judge_nvml(snap("h100x4_xid79"), HealthConfig()))
    assert found == [("xid", "Xid 79 on gpu 1: NVML XidCriticalError 79"),
                     ("gpu_lost", "gpu 2: NVML cannot read it: GPU is lost")]


def test_ecc_remap_and_partial_nvlink_outage() -> None:
    found = evidence(judge_nvml(snap("h100x4_remap_nvlink"), HealthConfig(nvlink_error_limit=100)))
    assert found == [
        ("ecc", "gpu 1 (0000:2a:00): 2 uncorrected ECC errors since reset"),
        ("remap", "gpu 1 (0000:2a:00): row remap pending, GPU reset required"),
        ("nvlink", "gpu 3 (0000:5d:00): NVLinks down: 2"),
        ("nvlink", "gpu 3 (0000:5d:00): 130 NVLink errors > 100"),
    ]  # Xid 63 (remap recorded) is informational: the pending remap is what counts


def test_expected_nvlinks_per_gpu() -> None:
    found = evidence(judge_nvml(snap("h100x4_healthy"), HealthConfig(nvlinks_per_gpu=18)))
    assert len(found) == 4 and found[0] == ("nvlink", "gpu 0 (0000:18:00): 4 NVLinks active, expected 18")


def test_pending_page_retirement_and_temperature() -> None:
    found = evidence(judge_nvml(snap("v100x2_retired"), HealthConfig(max_temperature_c=39)))
    assert found == [("retired_pages", "gpu 0 (0000:3b:00): page retirement pending, GPU reset required"),
                     ("temperature", "gpu 1 (0000:af:00): 39 C >= 39 C")]


def test_unavailable_nvml_fails_only_where_gpus_are_expected() -> None:
    absent = NvmlSnapshot(node="n1", time=0.0, available=False, error="nvml unavailable: Driver Not Loaded")
    assert judge_nvml(absent, HealthConfig()) == []
    assert judge_nvml(absent, HealthConfig(expected_gpus=0)) == []
    assert evidence(judge_nvml(absent, HealthConfig(expected_gpus=8))) == [
        ("nvml", "expected 8 GPUs, nvml unavailable: Driver Not Loaded")]


def test_site_drain_xids_override_the_table() -> None:
    s = NvmlSnapshot(node="n1", time=0.0, available=True,
                     xids=(XidEvent(node="n1", xid=13, gpu_index=0, text="Graphics Exception"),))
    assert judge_nvml(s, HealthConfig()) == []
    assert evidence(judge_nvml(s, HealthConfig(drain_xids=[13]))) == [
        ("xid", "Xid 13 on gpu 0: Graphics Exception")]


@pytest.mark.parametrize(("field", "value"), [
    ("expected_gpus", -1), ("expected_gpus", "8"), ("max_temperature_c", 0), ("nvlinks_per_gpu", True),
    ("drain_xids", ["79"]), ("test_mode", "yes"), ("expected_gpus_by_node", {"n1": -2}),
])
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        HealthConfig(**{field: value})


def test_snapshot_dir_is_refused_outside_test_mode() -> None:
    with pytest.raises(ConfigError, match="test_nvml_snapshot_dir: is TEST-ONLY and needs test_mode = true"):
        HealthConfig(test_nvml_snapshot_dir="/tmp")


def test_recorded_snapshot_replaces_the_probe_for_its_node_only(tmp_path: Path) -> None:
    (tmp_path / "n2.json").write_text((DATA / "xid79.snapshot.json").read_text())
    config = HealthConfig(test_mode=True, test_nvml_snapshot_dir=str(tmp_path))
    real = NvmlSnapshot(node="n1", time=9.0, available=False, error="nvml unavailable: x")
    got, notes = checks.nvml_snapshot("n2", config, now=9.0, probe=lambda: real)
    assert got.node == "n2" and got.time == 9.0 and [x.xid for x in got.xids] == [79]
    assert got.xids[0].node == "n2"
    assert notes == [f"TEST-ONLY: NVML snapshot read from {tmp_path / 'n2.json'}"]
    assert checks.nvml_snapshot("n1", config, now=9.0, probe=lambda: real) == (real, [])
    assert checks.nvml_snapshot("../n2", config, now=9.0, probe=lambda: real) == (real, [])


def test_env_snapshot_needs_test_mode(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text((DATA / "healthy.snapshot.json").read_text())
    environ = {env.TEST_NVML_SNAPSHOT: str(path)}
    assert checks.recorded_snapshot_path("n1", HealthConfig(), environ) is None
    assert checks.recorded_snapshot_path("n1", HealthConfig(test_mode=True), environ) == path


def test_a_broken_recorded_snapshot_is_a_record(tmp_path: Path) -> None:
    path = tmp_path / "n1.json"
    path.write_text("{not json")
    got = checks.load_snapshot(path, node="n1", now=1.0)
    assert not got.available and "bad test snapshot" in got.error


def test_free_space_judgement() -> None:
    assert checks.judge_free_space("/ckpt", 5 * 2**30, 10).evidence == "checkpoint dir /ckpt: 5.0 GiB free < 10 GiB"
    assert checks.judge_free_space("/ckpt", 11 * 2**30, 10) is None
    assert checks.judge_free_space("/ckpt", None, 10) is None
    assert checks.judge_free_space("/ckpt", 0, 0) is None


def test_free_bytes_walks_up_to_an_existing_ancestor(tmp_path: Path) -> None:
    where, free = checks.free_bytes_at(str(tmp_path / "not" / "yet"))
    st = os.statvfs(tmp_path)
    assert where == str(tmp_path) and free == pytest.approx(st.f_bavail * st.f_frsize, rel=0.01)


def test_snapshot_records_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap("h100x4_healthy").node = "x"  # type: ignore[misc]
