"""The pure parts of ``slurm-ft bench checkpoint``: rows, ratios, targets, unavailable systems, outputs."""

import json

import pytest

from slurm_ft.bench import ckpt_peers as cp
from slurm_ft.core.errors import ConfigError

INFOS = [cp.SystemInfo(cp.MEMCPY, "limit", False, "-"), cp.SystemInfo(cp.DISK, "limit", False, "-"),
         cp.SystemInfo(cp.OURS_ASYNC, "ours", True, "crc32"), cp.SystemInfo("peer a", "peer", True, "no"),
         cp.SystemInfo("peer sync", "peer", False, "no"), cp.SystemInfo("peer down", "peer", True, "no")]


def rec(system, rnd, rank, stall, commit):
    return {"size_mb": 64, "system": system, "round": rnd, "rank": rank, "stall_s": stall, "commit_s": commit}


def records():
    out = []
    for rnd in (0, 1, 2):
        cold = 10.0 if rnd == 0 else 1.0  # round 0 is the cold save: left out of the medians
        for rank in (0, 1):
            slow = 2.0 if rank == 1 else 1.0  # the slowest rank counts
            out += [rec(cp.MEMCPY, rnd, rank, 0.01 * slow * cold, None),
                    rec(cp.DISK, rnd, rank, 0.5 * slow * cold, 0.5 * slow * cold),
                    rec(cp.OURS_ASYNC, rnd, rank, 0.01 * slow, 0.6 * slow),
                    rec("peer a", rnd, rank, 0.04 * slow, 0.5 * slow),
                    rec("peer sync", rnd, rank, 0.8 * slow, 0.8 * slow)]
    out.append({"size_mb": 64, "system": "peer down", "unavailable": "unavailable: AssertionError: no GPU"})
    return out


def memory():
    return [{"size_mb": 64, "system": cp.OURS_ASYNC, "rank": 0, "extra_mb": 60.0},
            {"size_mb": 64, "system": cp.OURS_ASYNC, "rank": 1, "extra_mb": 70.0},
            {"size_mb": 64, "system": "peer a", "rank": 0, "extra_mb": 128.0}]


def rows():
    return {r["system"]: r for r in cp.summarize(64, INFOS, records(), memory())}


def test_rows_take_the_slowest_rank_and_leave_the_cold_save_out():
    r = rows()
    ours = r[cp.OURS_ASYNC]
    assert ours["rounds"] == 2 and ours["status"] == "ok"
    assert ours["stall_s"] == pytest.approx(0.02) and ours["commit_s"] == pytest.approx(1.2)
    assert ours["cold_stall_s"] == pytest.approx(0.02)
    assert r[cp.MEMCPY]["cold_stall_s"] == pytest.approx(0.2)
    # async: written after the caller was released: 1.2 - 0.02 s; the raw disk took 1.0 s in the same round
    assert ours["persist_mbps"] == pytest.approx(64 / 1.18)
    assert ours["persist_per_disk"] == pytest.approx(1.0 / 1.18)
    assert ours["stall_per_memcpy"] == pytest.approx(1.0)
    assert ours["extra_mb"] == 70.0 and ours["extra_per_state"] == pytest.approx(70 / 64)
    sync = r["peer sync"]
    assert sync["persist_per_disk"] == pytest.approx(1.0 / 1.6)  # sync: all of the commit is writing
    assert r[cp.MEMCPY]["commit_s"] is None and r[cp.MEMCPY]["stall_per_memcpy"] is None


def test_an_unavailable_system_is_a_row_with_its_reason_and_no_figures():
    down = rows()["peer down"]
    assert down["status"] == "unavailable: AssertionError: no GPU"
    assert down["stall_s"] is None and down["commit_s"] is None and down["extra_mb"] is None
    text = cp.table(list(rows().values()))
    assert "unavailable: AssertionError: no GPU" in text
    assert len(text.splitlines()) == 2 + len(INFOS)


def test_targets_compare_ours_with_the_best_peer_that_ran():
    checks = {c["target"]: c for c in cp.targets(list(rows().values()))}
    stall = checks["ours stall <= best peer's"]
    assert stall["best_peer"] == "peer a" and stall["met"] is True and stall["ratio"] == pytest.approx(0.25)
    commit = checks["ours durable commit <= best peer's"]
    assert commit["best_peer"] == "peer a" and commit["met"] is False and commit["ratio"] == pytest.approx(1.2)
    assert checks["ours persist bandwidth >= 0.8 x raw disk"]["met"] is True
    assert checks["ours extra host memory <= 1 x state per rank"]["met"] is False


def test_targets_not_measured_without_peers_or_memory():
    alone = cp.summarize(64, INFOS[:3], [r for r in records() if r["system"] in (cp.MEMCPY, cp.DISK, cp.OURS_ASYNC)])
    checks = cp.targets(alone)
    assert [c["met"] for c in checks] == [None, None, True, None]
    assert "not measured" in cp.targets_text(64, checks)


def test_unavailable_reason_is_one_short_line():
    assert cp.unavailable_reason(AssertionError("needs CUDA\nmore")) == "unavailable: AssertionError: needs CUDA"
    assert cp.unavailable_reason(RuntimeError()) == "unavailable: RuntimeError"
    assert len(cp.unavailable_reason(ValueError("x" * 500))) < 160


@pytest.mark.parametrize("kwargs, field", [({"sizes": ()}, "sizes"), ({"sizes": (8,)}, "sizes"),
                                           ({"repeats": 0}, "repeats"), ({"threads": 0}, "threads"),
                                           ({"ranks": True}, "ranks"), ({"dir": ""}, "dir")])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        cp.BenchConfig(**kwargs)


def test_payload_render_and_files(tmp_path):
    config = cp.BenchConfig(sizes=(64,), repeats=2)
    data = cp.payload(config, INFOS, records(), memory(), {"date": "2026-12-04"})
    assert data["schema"] == cp.SCHEMA and data["config"]["sizes"] == (64,)
    assert [r["system"] for r in data["rows"]] == [i.name for i in INFOS]
    assert set(data["targets"]) == {"64"}
    paths = cp.write(tmp_path, data)
    loaded = json.loads((tmp_path / "checkpoint_peers.json").read_text())
    assert loaded["rows"][2]["system"] == cp.OURS_ASYNC and len(loaded["records"]) == len(records())
    text = (tmp_path / "checkpoint_peers.txt").read_text()
    assert "64 MB: ours stall <= best peer's: met" in text and "peer down" in text
    pytest.importorskip("matplotlib")
    assert tmp_path / "checkpoint_peers.png" in paths
    assert (tmp_path / "checkpoint_peers.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_a_system_that_ran_is_a_note(tmp_path):
    from slurm_ft.bench.plots import plot_checkpoint_peers

    note = plot_checkpoint_peers([{"size_mb": 64, "system": "x", "status": "unavailable: y"}], tmp_path / "p.png")
    assert note and not (tmp_path / "p.png").exists()
