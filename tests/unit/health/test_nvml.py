"""The NVML probe against recorded device answers (FakeNvml), and once against real NVML where it exists."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurm_ft.health.nvml import NvmlProbe, XidWatcher
from slurm_ft.health.nvml_fake import FakeNvml
from slurm_ft.health.records import snapshot_from_dict

DATA = Path(__file__).parent.parent.parent / "data" / "nvml"
NOW = 1_700_000_000.0


def probe(name: str, **kwargs) -> tuple[FakeNvml, object]:
    fake = FakeNvml.from_file(DATA / f"{name}.fake.json")
    return fake, NvmlProbe(fake, clock=lambda: NOW, **kwargs).snapshot("n1")


def test_healthy_h100_node() -> None:
    fake, snap = probe("h100x4_healthy")
    assert snap.available and snap.error == "" and snap.gpu_count == 4
    assert snap.driver_version == "535.129.03" and snap.time == NOW and snap.node == "n1"
    gpu = snap.gpus[1]
    assert gpu.pci_bus == "0000:2a:00" and gpu.uuid.startswith("GPU-")
    assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_corrected) == (0, 2)
    assert (gpu.remap_pending, gpu.remap_failure, gpu.remapped_rows_uncorrectable) == (False, False, 0)
    assert gpu.retired_pages_sbe is None  # H100 has row remapping instead of page retirement
    assert (gpu.nvlink_up, gpu.nvlink_down, gpu.nvlink_errors) == (4, (), 0)
    assert gpu.temperature_c == 39
    assert fake.initialised == 0  # shut down again


def test_lost_gpu_and_xid_events() -> None:
    _, snap = probe("h100x4_xid79", xid_wait_ms=5)
    assert snap.gpu_count == 4
    assert snap.gpus[2].error == "GPU is lost" and snap.gpus[2].uuid == ""
    assert [(x.xid, x.gpu_index, x.pci_bus, x.source) for x in snap.xids] == [
        (79, 1, "0000:2a:00", "nvml"), (13, 0, "0000:18:00", "nvml")]


def test_without_xid_wait_no_event_set_is_used() -> None:
    fake, snap = probe("h100x4_xid79")
    assert snap.xids == () and fake.registered == set()


def test_remap_ecc_and_nvlink_counters() -> None:
    _, snap = probe("h100x4_remap_nvlink", xid_wait_ms=5)
    bad = snap.gpus[1]
    assert (bad.remapped_rows_correctable, bad.remapped_rows_uncorrectable, bad.remap_pending) == (3, 1, True)
    assert bad.ecc_volatile_uncorrected == 2
    link = snap.gpus[3]
    assert (link.nvlink_up, link.nvlink_down, link.nvlink_errors) == (3, (2,), 130)
    assert [x.xid for x in snap.xids] == [63]


def test_page_retirement_and_unsupported_fields_on_v100() -> None:
    _, snap = probe("v100x2_retired", xid_wait_ms=5)
    first, second = snap.gpus
    assert (first.retired_pages_sbe, first.retired_pages_dbe, first.retired_pages_pending) == (2, 1, True)
    assert first.remapped_rows_correctable is None and first.remap_pending is None
    assert (first.nvlink_up, first.nvlink_down, first.nvlink_errors) == (None, (), None)
    assert second.ecc_volatile_uncorrected is None and second.retired_pages_pending is False


def test_watcher_notes_gpus_without_xid_events() -> None:
    fake = FakeNvml.from_file(DATA / "v100x2_retired.fake.json")
    fake.nvmlInit()
    watcher = XidWatcher(fake, node="n1")
    assert watcher.registered == [0] and watcher.notes == ["gpu 1: xid events unavailable: Not Supported"]
    assert watcher.poll(1) == []


def test_driver_not_loaded_is_a_record() -> None:
    _, snap = probe("driver_not_loaded")
    assert not snap.available and snap.error == "nvml unavailable: Driver Not Loaded" and snap.gpus == ()


def test_no_pynvml_is_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurm_ft.health.nvml.load_pynvml", lambda: None)
    snap = NvmlProbe(clock=lambda: NOW).snapshot("n1")
    assert not snap.available and snap.error == "nvml unavailable: pynvml not installed"


def test_a_driver_fault_mid_read_is_a_record() -> None:
    fake = FakeNvml.from_file(DATA / "h100x4_healthy.fake.json")

    def count() -> int:
        raise OSError("driver went away")

    fake.nvmlDeviceGetCount = count  # type: ignore[method-assign]
    snap = NvmlProbe(fake, clock=lambda: NOW).snapshot("n1")
    assert not snap.available and snap.error == "nvml failed: driver went away" and fake.initialised == 0


@pytest.mark.parametrize("name", ["h100x4_healthy", "h100x4_xid79", "h100x4_remap_nvlink", "v100x2_retired",
                                  "h100x4_recovery_action"])
def test_snapshots_round_trip_through_json(name: str) -> None:
    _, snap = probe(name, xid_wait_ms=5)
    assert snapshot_from_dict(json.loads(json.dumps(dataclasses.asdict(snap)))) == snap


def test_gpu_recovery_action_where_the_driver_has_it() -> None:
    _, snap = probe("h100x4_recovery_action")
    assert [g.recovery_action for g in snap.gpus] == [0, 0, 2, 0]  # GPU 2: NODE_REBOOT
    _, old = probe("h100x4_healthy")  # a 535 driver: no such field
    assert {g.recovery_action for g in old.gpus} == {None}
    fake = FakeNvml.from_file(DATA / "h100x4_recovery_action.fake.json")
    fake.spec["field_values"] = False  # pynvml's call missing from the library
    assert {g.recovery_action for g in NvmlProbe(fake).snapshot("n1").gpus} == {None}


def test_recovery_action_is_authoritative_node_evidence() -> None:
    from slurm_ft.classify import Category, classify
    from slurm_ft.classify.records import Evidence, JobEnd
    from slurm_ft.health.checks import HealthConfig, judge_nvml

    _, snap = probe("h100x4_recovery_action")
    verdict = classify(Evidence(job=JobEnd(state="FAILED", exit_code=1, nodes=("n1", "n2")), nvml=(snap,)))
    assert verdict.category is Category.HARDWARE_GPU and verdict.culprit.nodes == ("n1",)
    assert verdict.attested_nodes == ("n1",) and "recovery action NODE_REBOOT" in verdict.evidence[0]
    assert [f.check for f in judge_nvml(snap, HealthConfig())] == ["recovery_action"]
    _, healthy = probe("h100x4_healthy")
    assert judge_nvml(healthy, HealthConfig()) == []


def test_real_nvml_where_a_gpu_exists() -> None:
    """Runs wherever ``pynvml.nvmlInit()`` succeeds (see device/check_nvml.sh); skipped elsewhere."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    snap = NvmlProbe(xid_wait_ms=10).snapshot()
    assert snap.available, snap.error
    assert snap.gpu_count == count
    for gpu in snap.gpus:
        assert gpu.error == "" and gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.temperature_c is None or 0 < gpu.temperature_c < 120
    assert snapshot_from_dict(json.loads(json.dumps(dataclasses.asdict(snap)))) == snap
