"""Topology judgement (pure) and revalidate() in a single process."""

import dataclasses
import socket

import pytest

from slurm_ft.train import topology
from slurm_ft.train.topology import Observed, TopologyError, judge


def _obs(**kw):
    base = dict(world_size=4, rank_hosts=["n1", "n1", "n2", "n2"], allocated_nodes=["n1", "n2"], expected_tasks=4,
                excluded_nodes=[], checkpoint_world_size=4)
    return Observed(**{**base, **kw})


def test_healthy_topology_has_no_problems():
    assert judge(_obs()) == []


def test_judge_names_ranks_and_nodes():
    assert judge(_obs(expected_tasks=8)) == ["world size 4 != SLURM_NTASKS 8"]
    [msg] = judge(_obs(rank_hosts=["n1", "n1", "n3", "n3"]))
    assert "ranks [2, 3]" in msg and "'n3'" in msg
    [msg] = judge(_obs(excluded_nodes=["n2"]))
    assert msg == "ranks [2, 3] run on excluded node 'n2'"
    assert "all-reduce check failed: boom" in judge(_obs(allreduce_ok=False, allreduce_error="boom"))
    assert "below floor" in judge(_obs(bandwidth_gbps=0.5), min_bandwidth_gbps=1.0)[0]
    assert judge(_obs(bandwidth_gbps=0.5)) == []  # floor off by default


def test_revalidate_single_process_reports_resharding_and_excluded(tmp_path):
    from slurm_ft.core import layout
    tmp = tmp_path / layout.tmp_dir_name(3, "aa")
    tmp.mkdir()
    layout.commit(tmp, layout.step_dir(tmp_path, 3), layout.Manifest(step=3, world_size=2, files={}))
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "1"}
    report = topology.revalidate(ckpt_dir=tmp_path, environ=env)
    assert report.resharding == (2, 1) and report.rank_hosts == ["n1"]
    with pytest.raises(TopologyError, match="ranks \\[0\\] run on excluded node 'n1'"):
        topology.revalidate(environ={**env, "SLURM_FT_EXCLUDED_NODES": "n[1,3]"})
    with pytest.raises(TopologyError, match="SLURM_NTASKS 2"):
        topology.revalidate(environ={**env, "SLURM_NTASKS": "2"})
    assert topology.revalidate(environ={}).rank_hosts == [socket.gethostname().split(".")[0]]


def test_moved_ranks_and_allocation_fallback():
    assert topology.moved_ranks(["n1", "n2"], ["n1", "n3", "n4"]) == ["rank 1: n2 -> n3"]
    assert topology.moved_ranks([], ["n1"]) == []
    assert topology.allocated_nodes({"SLURM_NODELIST": "n[1-2]"}) == ["n1", "n2"]
    assert topology.allocated_nodes({"SLURM_JOB_NODELIST": "a1", "SLURM_NODELIST": "n1"}) == ["a1"]


def test_nccl_topo_dump_goes_next_to_the_checkpoint_unless_set(tmp_path):
    environ = {}
    path = topology.prepare_nccl_topo_dump(tmp_path, environ, host="n1")
    assert path == str(tmp_path / "topology" / "nccl_topo.n1.xml") == environ["NCCL_TOPO_DUMP_FILE"]
    assert (tmp_path / "topology").is_dir()
    assert topology.prepare_nccl_topo_dump(tmp_path, {"NCCL_TOPO_DUMP_FILE": "/x.xml"}) == "/x.xml"


def test_revalidate_reports_moved_ranks_and_nccl_dump(tmp_path):
    from slurm_ft.core import layout
    tmp = tmp_path / layout.tmp_dir_name(3, "aa")
    tmp.mkdir()
    layout.commit(tmp, layout.step_dir(tmp_path, 3),
                  layout.Manifest(step=3, world_size=1, files={}, rank_hosts=["n9"]))
    dump = tmp_path / "dump.xml"
    dump.write_text("<system/>")
    report = topology.revalidate(ckpt_dir=tmp_path, environ={"SLURMD_NODENAME": "n1",
                                                             "NCCL_TOPO_DUMP_FILE": str(dump)})
    assert report.resharding is None and report.moved == ["rank 0: n9 -> n1"]
    assert report.nccl_topo_file == str(dump)


# --- each rank's GPU against its last attempt's ---------------------------------------------------------------
def test_a_changed_gpu_is_reported_and_an_unknown_one_is_not():
    from slurm_ft.core.rundir import GpuBinding
    from slurm_ft.train.topology import gpu_changes

    a = GpuBinding(rank=1, host="n2", index=0, uuid="GPU-a", pci_bus="0000:18:00")
    assert gpu_changes(a, a) == [] and gpu_changes(None, a) == [] and gpu_changes(a, None) == []
    moved = GpuBinding(rank=1, host="n3", index=0, uuid="GPU-c", pci_bus="0000:18:00")
    assert gpu_changes(a, moved) == ["rank 1: GPU n2 GPU 0 (GPU-a, 0000:18:00) -> n3 GPU 0 (GPU-c, 0000:18:00)"]
    assert gpu_changes(GpuBinding(rank=1, devices="0"), moved) == []  # nothing known before: nothing to compare


def test_check_gpu_compares_the_wrappers_records_of_two_attempts(tmp_path):
    from slurm_ft.core.rundir import GpuBinding, write_gpu_binding
    from slurm_ft.train.topology import check_gpu

    before = GpuBinding(rank=1, host="n2", attempt=1, devices="1", index=1, uuid="GPU-b", pci_bus="0000:29:00")
    write_gpu_binding(tmp_path / "attempt-1", before)
    write_gpu_binding(tmp_path, dataclasses.replace(before, attempt=2))
    now, changed = check_gpu(1, {"SLURM_FT_ATTEMPT": "2"}, tmp_path)
    assert now.uuid == "GPU-b" and changed == []  # a restart in place keeps the rank on its GPU
    write_gpu_binding(tmp_path, GpuBinding(rank=1, host="n3", attempt=2, devices="1", index=1, uuid="GPU-z",
                                           pci_bus="0000:29:00"))
    assert check_gpu(1, {"SLURM_FT_ATTEMPT": "2"}, tmp_path)[1] == [
        "rank 1: GPU n2 GPU 1 (GPU-b, 0000:29:00) -> n3 GPU 1 (GPU-z, 0000:29:00)"]
    assert check_gpu(1, {"SLURM_FT_ATTEMPT": "1"}, tmp_path)[1] == []  # a first attempt has nothing before it
    assert check_gpu(0, {"SLURM_FT_ATTEMPT": "2"}, tmp_path) == (None, [])  # a CPU rank: no GPU, no change
