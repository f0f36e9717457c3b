"""The memory tier's pure parts: file names, the snapshot format, the commit rule and the choice of source, the
peer ring, auto spacing, the config and flag checks; and its files on a real directory (no ranks)."""

from __future__ import annotations

import os

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.train import memtier
from slurm_ft.train.memtier import Copy, Inventory


def test_names_round_trip_and_temp_files_are_no_tier_files():
    assert memtier.parse_name(memtier.snap_name(12, 3)) == memtier.FileName(12, 3, "snap")
    assert memtier.parse_name(memtier.commit_name(12, 3)) == memtier.FileName(12, 3, "commit")
    assert memtier.parse_name(memtier.peer_name(12, 3, 7)) == memtier.FileName(12, 3, "peer", 7)
    assert memtier.snap_name(12, 3) == "step_00000012.rank_00003.snap"
    for name in (".tmp-step_00000012.rank_00003.snap-99", "step_12.rank_3.snap", "step_00000012.rank_00003.snapx"):
        assert memtier.parse_name(name) is None


def test_snapshot_format_checks_digest_and_length():
    data = memtier.encode(step=5, rank=1, world_size=2, alloc="7.0", epoch="e", payload=b"payload bytes")
    header, payload = memtier.decode(data)
    assert payload == b"payload bytes" and (header["step"], header["rank"], header["world_size"]) == (5, 1, 2)
    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    with pytest.raises(memtier.SnapshotError, match="digest mismatch"):
        memtier.decode(bytes(flipped))
    with pytest.raises(memtier.SnapshotError, match="torn"):
        memtier.decode(data[:-4])
    with pytest.raises(memtier.SnapshotError, match="no snapshot header"):
        memtier.decode(b"garbage")
    assert memtier.check_header(header, step=5, rank=1, world_size=3, alloc="7.0").startswith("world size changed")
    assert "allocation" in memtier.check_header(header, step=5, rank=1, world_size=2, alloc="7.1")
    assert memtier.check_header(header, step=5, rank=1, world_size=2, alloc="7.0") == ""


def _inv(*copies: tuple, markers: dict | None = None, epoch: str = "e") -> Inventory:
    """Copies as (step, rank, kind[, epoch]); markers as step -> peers (of ``epoch``) or (step, epoch) -> peers."""
    return Inventory(copies=[Copy(c[0], c[1], c[2], f"{c[2]}-{c[0]}-{c[1]}", c[3] if len(c) > 3 else epoch)
                             for c in copies],
                     markers={k if isinstance(k, tuple) else (k, epoch): v for k, v in (markers or {}).items()})


def test_choose_newest_step_every_rank_holds_with_a_marker():
    invs = [_inv((5, 0, "snap"), (6, 0, "snap"), markers={5: False, 6: False}),
            _inv((5, 1, "snap"), markers={5: False})]  # rank 1 was killed before writing step 6
    choice = memtier.choose(invs, 2, disk_step=3)
    assert (choice.source, choice.step, [h for h, _ in choice.plan]) == ("memory", 5, [0, 1])


def test_a_part_without_its_own_marker_counts_when_another_rank_has_the_marker():
    """A rank killed between the agreement and its own marker still has a good part: the marker elsewhere is the
    evidence that every part was complete."""
    invs = [_inv((6, 0, "snap"), markers={6: False}), _inv((6, 1, "snap"))]
    assert memtier.choose(invs, 2, disk_step=None).step == 6


def test_torn_step_without_any_marker_is_never_used():
    invs = [_inv((6, 0, "snap")), _inv((6, 1, "snap"))]
    choice = memtier.choose(invs, 2, disk_step=3)
    assert choice.source == "disk" and "no commit marker" in choice.why


def test_a_missing_part_or_older_memory_falls_back_to_disk_and_says_why():
    invs = [_inv((6, 0, "snap"), markers={6: False}), Inventory(problems=["step_6.rank_1.snap: digest mismatch"])]
    choice = memtier.choose(invs, 2, disk_step=3)
    assert choice.source == "disk" and "rank 1" in choice.why and "digest mismatch" in choice.why
    older = [_inv((2, 0, "snap"), markers={2: False}), _inv((2, 1, "snap"))]
    assert "disk step 3 is newer" in memtier.choose(older, 2, disk_step=3).why
    assert memtier.choose(older, 2, disk_step=2).source == "memory"  # as new as disk: memory is faster
    assert memtier.choose([Inventory(), Inventory()], 2, disk_step=None).why == memtier.NOTHING


def test_peer_copy_is_used_for_a_swapped_in_rank_only_when_a_marker_says_the_peers_were_complete():
    # rank 1 is on a fresh node: its part exists only as the peer copy rank 0 holds
    with_peers = [_inv((6, 0, "snap"), (6, 1, "peer"), markers={6: True}), Inventory()]
    choice = memtier.choose(with_peers, 2, disk_step=3)
    assert (choice.source, choice.step, choice.plan[1][0]) == ("peer", 6, 0)
    without = [_inv((6, 0, "snap"), (6, 1, "peer"), markers={6: False}), Inventory()]
    assert memtier.choose(without, 2, disk_step=3).source == "disk"


def test_a_missing_part_of_rank_0_is_missing_too():
    invs = [Inventory(problems=["torn"]), _inv((5, 1, "snap"), markers={5: False})]
    choice = memtier.choose(invs, 2, disk_step=3)
    assert choice.source == "disk" and "rank 0" in choice.why


def test_parts_of_two_attempts_are_never_mixed():
    """An attempt that resumed from an older step writes step 6 again: rank 0's new part (epoch "new", no marker
    yet) and rank 1's part and marker from the attempt before (epoch "old") are not one snapshot."""
    invs = [_inv((6, 0, "snap", "new"), (5, 0, "snap", "new"), markers={(5, "new"): False}),
            _inv((6, 1, "snap", "old"), (5, 1, "snap", "new"), markers={(6, "old"): False})]
    choice = memtier.choose(invs, 2, disk_step=None)
    assert (choice.source, choice.step) == ("memory", 5)
    assert "step 6: no verified part of rank 0" in memtier.choose(invs, 2, disk_step=6).why


def test_world_size_must_cover_every_rank():
    invs = [_inv((6, 0, "snap"), markers={6: False}), _inv((6, 1, "snap")), Inventory()]
    assert memtier.choose(invs, 3, disk_step=None).source == "disk"


def test_peer_ring_is_same_local_index_on_the_next_node():
    hosts = ["a", "a", "b", "b", "c", "c"]
    ring = memtier.peer_ring(hosts)
    assert ring[0] == (2, 4) and ring[1] == (3, 5) and ring[4] == (0, 2)
    assert memtier.peer_ring(["a", "a"]) == {0: (None, None), 1: (None, None)}
    assert memtier.peer_ring(["a", "a", "b"])[1] == (None, None)  # node b has no second rank
    assert memtier.local_ranks(hosts, 3) == [2, 3]


def test_checker_splits_a_node_s_files_by_the_rank_they_are_about():
    local = [2, 3]
    assert memtier.checker(memtier.FileName(5, 3, "snap"), local) == 3
    assert memtier.checker(memtier.FileName(5, 0, "peer", 2), local) == 2
    assert memtier.checker(memtier.FileName(5, 7, "commit"), local) == 3  # not on this node: by number


def test_auto_spacing_every_step_within_budget_else_spaced():
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.01, write_s=0.5, budget=0.05) == 1
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.2, write_s=0.5, budget=0.05) == 4
    assert memtier.auto_spacing(step_s=0.1, stall_s=0.001, write_s=0.35, budget=0.05) == 4  # one write at a time
    assert memtier.auto_spacing(step_s=0.0, stall_s=1.0, write_s=1.0, budget=0.05) == 1


def test_auto_spacing_follows_the_failure_rate():
    # Young: sqrt(2 * 0.5 s * 3 h) = 104 s of training between snapshots, within a 5% budget that allows 10 s
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.5, write_s=0.5, budget=0.05, mtbf_s=3 * 3600.0) == 104
    # a job that fails every minute snapshots every step; the budget and the write still bound it from below
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.001, write_s=0.5, budget=0.05, mtbf_s=60.0) == 1
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.2, write_s=0.5, budget=0.05, mtbf_s=60.0) == 5
    assert memtier.auto_spacing(step_s=1.0, stall_s=0.001, write_s=3.0, budget=0.05, mtbf_s=60.0) == 3


def test_files_are_private_and_retention_keeps_the_newest(tmp_path):
    for step in (4, 5):
        memtier.write_file(tmp_path, memtier.snap_name(step, 0), b"x")
        memtier.write_file(tmp_path, memtier.commit_name(step, 0), b"{}")
        memtier.write_file(tmp_path, memtier.peer_name(step, 1, 0), b"x")
    memtier.write_file(tmp_path, memtier.snap_name(4, 1), b"x")  # another rank's: not ours to remove
    assert (os.stat(tmp_path / memtier.snap_name(5, 0)).st_mode & 0o777) == 0o600
    gone = memtier.retain(tmp_path, 0, keep_from=5)
    assert sorted(gone) == sorted([memtier.snap_name(4, 0), memtier.commit_name(4, 0), memtier.peer_name(4, 1, 0)])
    assert sorted(memtier.names(tmp_path)) == sorted([memtier.snap_name(4, 1), memtier.snap_name(5, 0),
                                                      memtier.commit_name(5, 0), memtier.peer_name(5, 1, 0)])


def test_inventory_reports_torn_flipped_and_foreign_snapshots(tmp_path):
    good = memtier.encode(step=5, rank=0, world_size=1, alloc="a", epoch="e1", payload=b"p" * 100)
    memtier.write_file(tmp_path, memtier.snap_name(5, 0), good)
    memtier.write_file(tmp_path, memtier.commit_name(5, 0),
                       memtier.marker_bytes(step=5, world_size=1, alloc="a", epoch="e1", peers=False))
    memtier.write_file(tmp_path, memtier.snap_name(6, 0), good[:-10])  # torn
    inv = memtier.inventory(tmp_path, 0, [0], world_size=1, alloc="a")
    assert [(c.step, c.epoch) for c in inv.copies] == [(5, "e1")] and inv.markers == {(5, "e1"): False}
    assert any("torn" in p for p in inv.problems)
    assert memtier.inventory(tmp_path, 0, [0], world_size=2, alloc="a").copies == []
    os.symlink(tmp_path / memtier.snap_name(5, 0), tmp_path / memtier.snap_name(7, 0))
    inv = memtier.inventory(tmp_path, 0, [0], world_size=1, alloc="a")
    assert 7 not in [c.step for c in inv.copies]  # never through a symlink
    removed = memtier.clear_foreign(tmp_path, "b")
    assert memtier.snap_name(5, 0) in removed and memtier.commit_name(5, 0) in removed


def test_memory_pressure_rule():
    from slurm_ft.train.memory import pressure
    assert pressure(need=100, free=150) and not pressure(need=100, free=200)


@pytest.mark.parametrize("text", ["0", "-1", "AUTO", "1.5", "", "offf"])
def test_mem_every_bad_values_name_the_value(text):
    from slurm_ft.train.checkpoint import parse_mem_every
    with pytest.raises(ConfigError, match=f"got {text!r}"):
        parse_mem_every(text)


def test_mem_every_config_and_env():
    from slurm_ft.train.checkpoint import CheckpointConfig
    assert CheckpointConfig(dir="/x").mem_every == "auto"
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/x", "SLURM_SPANK_FT_MEM_EVERY": "4"}).mem_every == 4
    assert CheckpointConfig.from_env({"SLURM_FT_CKPT_DIR": "/x", "SLURM_FT_MEM_EVERY": "off"}).mem_every == "off"
    with pytest.raises(ConfigError, match="mem_every.*got 0"):
        CheckpointConfig(dir="/x", mem_every=0)
    with pytest.raises(ConfigError, match="mem_root.*got 'shm'"):
        CheckpointConfig(dir="/x", mem_root="shm")


def test_the_tier_tag_names_the_allocation_and_the_launch():
    from slurm_ft.train.checkpoint import memory_alloc

    job = {"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0", "SLURM_FT_LAUNCH_ID": "a1"}
    assert memory_alloc(job) == "1.0:a1"
    assert memory_alloc({**job, "SLURM_RESTART_COUNT": "1"}) != memory_alloc(job)  # requeued: a new allocation
    assert memory_alloc({**job, "SLURM_FT_LAUNCH_ID": "b2"}) != memory_alloc(job)  # job 1 of another cluster
    assert memory_alloc({}) == ".0:"
