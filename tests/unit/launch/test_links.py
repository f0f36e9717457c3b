"""The job's readings of its nodes' link counters (attempt start, probe) and the losses between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ft.health.links import LinkCounters, LinkLoss, LinkSnapshot, SysfsLinks
from slurm_ft.launch import links, probe


def _tree(root: Path, changes: int, downs: int) -> Path:
    folder = root / "class/net/eth0"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "carrier_changes").write_text(f"{changes}\n")
    (folder / "carrier_down_count").write_text(f"{downs}\n")
    return root


def test_start_then_probe_readings_name_the_link_that_went_down(tmp_path):
    run_dir = tmp_path / "run"
    sys_n1, sys_n2 = tmp_path / "sys-n1", tmp_path / "sys-n2"
    links.record(run_dir, links.START, "n1", SysfsLinks(_tree(sys_n1, 2, 1)))
    links.record(run_dir, links.START, "n2", SysfsLinks(_tree(sys_n2, 2, 1)))
    _tree(sys_n2, 4, 2)  # n2's cable out and back in
    links.record(run_dir, links.PROBE, "n1", SysfsLinks(sys_n1))
    links.record(run_dir, links.PROBE, "n2", SysfsLinks(sys_n2))
    assert links.losses(run_dir, ["n1", "n2"]) == (
        LinkLoss(node="n2", interface="eth0", counter="carrier_down_count", before=1, after=2),)
    assert links.losses(run_dir, ["n1"]) == ()  # only the nodes asked about


def test_the_first_rank_of_a_node_records_the_start_reading(tmp_path):
    first = links.record(tmp_path, links.START, "n1", SysfsLinks(_tree(tmp_path / "a", 2, 1)), keep=True)
    links.record(tmp_path, links.START, "n1", SysfsLinks(_tree(tmp_path / "b", 9, 9)), keep=True)
    assert json.loads(first.read_text())["links"] == {"eth0": {"carrier_changes": 2, "carrier_down_count": 1}}


def test_no_reading_or_a_foreign_file_is_no_loss(tmp_path):
    links.record(tmp_path, links.START, "n1", SysfsLinks(_tree(tmp_path / "s", 2, 1)))
    assert links.losses(tmp_path, ["n1"]) == ()  # no probe reading
    links.links_path(tmp_path, links.PROBE, "n1").write_text("{not json")
    assert links.losses(tmp_path, ["n1"]) == ()
    other = LinkSnapshot(node="n9", time=1.0, links=(LinkCounters(interface="eth0", counters={"carrier_changes": 9}),))
    links.links_path(tmp_path, links.PROBE, "n1").write_text(json.dumps(other.to_dict()))
    assert links.losses(tmp_path, ["n1"]) == ()  # a reading that is not n1's


def test_a_node_name_is_no_path():
    with pytest.raises(ValueError, match="'../n1'"):
        links.links_path("/tmp", links.START, "../n1")


def test_the_probe_command_records_the_reading_and_answers_with_the_node_name_and_uptime(tmp_path):
    env = {**os.environ, "SLURMD_NODENAME": "n5"}
    done = subprocess.run(list(links.probe_command(sys.executable, tmp_path)), env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    name, uptime = done.stdout.split()
    assert done.returncode == 0 and name == "n5" and float(uptime) > 0
    assert probe.boot_times(done.stdout, ["n5"], now=float(uptime) + 100.0) == {"n5": 100.0}  # what the probe reads
    assert links.read(tmp_path, links.PROBE, "n5") is not None
