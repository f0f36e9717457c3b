"""Reading rank error files as root: ownership, symlinks, size and count limits, hostile content."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from slurm_ft.core.rundir import ErrorRecord, write_error
from slurm_ft.health.jobfiles import (
    FileLimits,
    UnsafePath,
    latest_committed_step,
    open_user_dir,
    read_error_files,
    read_user_file,
)

UID = os.getuid()


def make(run_dir: Path, rank: int, **fields) -> None:
    write_error(run_dir, ErrorRecord(rank=rank, time=fields.pop("time", float(rank)), exc_type="E",
                                     message=fields.pop("message", f"rank {rank}"), **fields))


def test_records_sorted_by_time_and_cleaned(tmp_path: Path) -> None:
    make(tmp_path, 2, time=5.0)
    make(tmp_path, 0, time=9.0, traceback="t" * 100_000)
    (tmp_path / "heartbeat.rank0.json").write_text("{}")
    records, notes = read_error_files(str(tmp_path), UID)
    assert [r["rank"] for r in records] == [2, 0] and notes == []
    assert len(records[1]["traceback"]) == 16_384 and records[1]["traceback"].endswith("...")


def test_oversized_and_too_many_files_are_skipped_with_notes(tmp_path: Path) -> None:
    for rank in (0, 1, 2, 3, 5):
        make(tmp_path, rank)
    make(tmp_path, 4, message="m" * 5000)
    records, notes = read_error_files(str(tmp_path), UID, FileLimits(max_bytes=1000, max_files=5))
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert any("6 error files, read the first 5" in n for n in notes)
    assert any("error.rank4.json: skipped" in n and "over the 1000 byte limit" in n for n in notes)


def test_garbage_and_lying_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "error.rank0.json").write_text("[1, 2]")
    (tmp_path / "error.rank1.json").write_text("{not json")
    (tmp_path / "error.rank2.json").write_text(json.dumps({"rank": 7, "time": 1, "exc_type": "E", "message": "x"}))
    (tmp_path / "error.rank3.json").write_text(json.dumps({"rank": 3, "exc_type": "E"}))
    os.mkfifo(tmp_path / "error.rank4.json")
    records, notes = read_error_files(str(tmp_path), UID)
    assert records == [] and len(notes) == 5
    assert any("not a regular file" in n for n in notes) and any("rank 7" in n for n in notes)


def test_symlinked_files_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"rank": 0, "time": 1, "exc_type": "E", "message": "secret"}))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(secret, run_dir / "error.rank0.json")
    records, notes = read_error_files(str(run_dir), UID)
    assert records == [] and "error.rank0.json: skipped" in notes[0]


def test_missing_run_dir_is_a_note(tmp_path: Path) -> None:
    assert read_error_files(str(tmp_path / "nope"), UID) == ([], [f"run dir {tmp_path / 'nope'} does not exist"])


def test_directory_of_another_uid_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafePath, match="not the job's uid"):
        with open_user_dir(str(tmp_path), UID + 1):
            pass


def test_file_of_another_uid_is_refused(tmp_path: Path) -> None:
    make(tmp_path, 0)
    with open_user_dir(str(tmp_path), UID) as fd:
        assert read_user_file(fd, "error.rank0.json", UID, 10_000)
        with pytest.raises(UnsafePath, match="owned by uid"):
            read_user_file(fd, "error.rank0.json", UID + 1, 10_000)


# --- the monitor's resume hint: the newest committed step, read as root without trusting the job's files ---------


def _committed(ckpt, step):
    d = ckpt / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "world_size": 1, "files": {}}))
    return d


def test_latest_committed_step_reads_the_newest_valid_manifest(tmp_path):
    ckpt = tmp_path / "ckpt"
    _committed(ckpt, 4)
    _committed(ckpt, 8)
    assert latest_committed_step(str(ckpt), os.getuid()) == 8


def test_a_committed_symlink_to_kmsg_is_skipped_not_read(tmp_path):
    """Issue 16: ckpt/step_*/COMMITTED -> /proc/kmsg blocked the root monitor forever."""
    ckpt = tmp_path / "ckpt"
    _committed(ckpt, 4)
    (ckpt / "step_00000009").mkdir()
    (ckpt / "step_00000009" / "COMMITTED").symlink_to("/proc/kmsg")
    assert latest_committed_step(str(ckpt), os.getuid()) == 4


def test_a_fifo_or_an_oversized_manifest_cannot_stall_or_bloat_the_reader(tmp_path):
    ckpt = tmp_path / "ckpt"
    _committed(ckpt, 2)
    (ckpt / "step_00000005").mkdir()
    os.mkfifo(ckpt / "step_00000005" / "COMMITTED")
    (ckpt / "step_00000007").mkdir()
    with open(ckpt / "step_00000007" / "COMMITTED", "wb") as fh:
        fh.truncate(2 * 2**30)  # sparse 2 GiB
    result = []
    reader = threading.Thread(target=lambda: result.append(latest_committed_step(str(ckpt), os.getuid())))
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and result == [2]


def test_a_step_dir_symlinked_to_another_users_checkpoint_is_not_followed(tmp_path):
    other = _committed(tmp_path / "other", 99)
    ckpt = tmp_path / "ckpt"
    _committed(ckpt, 3)
    (ckpt / "step_00000099").symlink_to(other)
    assert latest_committed_step(str(ckpt), os.getuid()) == 3


def test_a_deeply_nested_manifest_is_skipped(tmp_path):
    ckpt = tmp_path / "ckpt"
    _committed(ckpt, 1)
    (ckpt / "step_00000002").mkdir()
    (ckpt / "step_00000002" / "COMMITTED").write_text("[" * 100_000)
    assert latest_committed_step(str(ckpt), os.getuid()) == 1


def test_a_deeply_nested_error_file_is_skipped_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "error.rank0.json").write_text("[" * 100_000)
    records, notes = read_error_files(str(run), os.getuid())
    assert records == [] and any("nested too deeply" in n for n in notes)
