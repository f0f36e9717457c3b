"""The run dir's files are the job's user's alone (security review 2026-12-05, finding 6): created 0700 / 0600,
whatever the umask, by every writer: the ranks' records, the wrapper's end records, the launcher's events."""

from __future__ import annotations

import os
import stat

import pytest

from slurm_ft.core import rundir
from slurm_ft.train.heartbeat import HeartbeatWriter


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    """The default umask of many sites (022): what the user did not ask to share would be world-readable."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_records_and_the_run_dir_they_create_are_private(tmp_path, open_umask):
    run = tmp_path / "ckpt" / ".slurm-ft"
    rundir.write_error(run, rundir.ErrorRecord(rank=0, time=1.0, exc_type="E", message="m"))
    rundir.write_end(run, rundir.RankEnd(rank=0, time=1.0, tail="stderr with a secret"))
    assert mode(run) == 0o700
    assert mode(run.parent) == 0o755  # the checkpoint dir is the user's to share
    assert {p.name: mode(p) for p in run.iterdir()} == {"error.rank0.json": 0o600, "end.rank0.json": 0o600}


def test_an_appended_line_creates_a_private_file_and_an_existing_run_dir_keeps_its_mode(tmp_path, open_umask):
    shared = tmp_path / "run"
    shared.mkdir(mode=0o750)
    os.chmod(shared, 0o750)  # the user chose to share it with the group
    rundir.append_line(rundir.make_run_dir(shared) / rundir.EVENTS_FILE, '{"event": "attempt_start"}')
    assert mode(shared) == 0o750 and mode(shared / rundir.EVENTS_FILE) == 0o600
    assert (shared / rundir.EVENTS_FILE).read_text() == '{"event": "attempt_start"}\n'


def test_an_appended_line_never_follows_a_symlink(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / rundir.EVENTS_FILE).symlink_to(target)
    with pytest.raises(OSError):
        rundir.append_line(tmp_path / rundir.EVENTS_FILE, "x")
    assert target.read_text() == ""


def test_heartbeats_and_the_stack_file_are_private(tmp_path, open_umask):
    writer = HeartbeatWriter(tmp_path / "run", 2, liveness_s=0)
    try:
        writer.beat(1, force=True)
        writer._dump_stacks()  # what the stack signal's answer writes
    finally:
        writer.close()
    assert {p.name: mode(p) for p in (tmp_path / "run").iterdir()} == {"heartbeat.rank2.json": 0o600,
                                                                        "stack.rank2.txt": 0o600}
    assert mode(tmp_path / "run") == 0o700
