"""The monitor's final stop reason reaches the user (slurm_ft.cluster.stop_note): the run dir's events and the job's
output file, written as the job's user, never following a link, never blocking."""

from __future__ import annotations

import json
import os

from slurm_ft.cluster.stop_note import tell_user
from slurm_ft.core.taxonomy import Action, Category
from slurm_ft.launch.report import attempts, format_report
from slurm_ft.slurm.types import JobState
from tests.unit.cluster.test_monitor import FakeClient, failed, make, register_job, verdict

RECORD = {"event": "stopped", "by": "monitor", "time": 5.0, "category": "user_code", "reason": "not recoverable"}


def test_a_monitor_stop_lands_in_the_run_dir_and_the_output_file(tmp_path):
    state = tmp_path / "state"
    ckpt = register_job(state, tmp_path, max_restarts=0)
    run_dir = ckpt / ".slurm-ft"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "attempt_start", "time": 1.0, "attempt": 1}) + "\n")
    out = tmp_path / "slurm-100.out"
    out.write_text("training...\n")
    job = failed(state=JobState.FAILED, std_out=str(out))
    user_error = verdict(category=Category.USER_CODE, recoverable=False, action=Action.STOP, nodes=())
    mon = make(state, FakeClient([job]), fn=lambda ev: user_error)
    mon.poll_once()
    mon.close()
    assert out.read_text() == "training...\nslurm-ft: stopped by the monitor: cause=user_code: not recoverable\n"
    stopped = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])
    assert stopped["event"] == "stopped" and stopped["by"] == "monitor" and stopped["category"] == "user_code"
    assert "stopped by the monitor: user_code (not recoverable)" in format_report(
        attempts([json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]))


def test_links_and_fifos_are_not_followed_nor_waited_for(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    link = tmp_path / "out-link"
    link.symlink_to(victim)
    why = tell_user(uid=os.geteuid(), run_dir="", output=str(link), record=RECORD)
    assert "Too many levels of symbolic links" in why and victim.read_text() == "root's file\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    why = tell_user(uid=os.geteuid(), run_dir="", output=str(fifo), record=RECORD)
    assert "No such device or address" in why  # O_NONBLOCK: no reader, no wait
    assert tell_user(uid=os.geteuid(), run_dir="", output=str(tmp_path / "gone.out"), record=RECORD)  # not created
    assert not (tmp_path / "gone.out").exists()


def test_the_child_runs_as_the_jobs_user_with_nothing_of_roots(tmp_path):
    seen = {}

    def run(argv, **kwargs):
        seen.update(kwargs, argv=argv)
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    import pwd

    nobody = pwd.getpwnam("nobody")
    if os.geteuid() == 0:
        assert tell_user(uid=nobody.pw_uid, run_dir="/r", output="/o", record=RECORD, run=run) == ""
        assert (seen["user"], seen["group"], seen["extra_groups"]) == (nobody.pw_uid, nobody.pw_gid, [])
        assert seen["env"] == {"PATH": "/usr/bin:/bin"} and seen["cwd"] == "/" and "-I" in seen["argv"]
    else:
        assert tell_user(uid=nobody.pw_uid, run_dir="/r", output="/o", record=RECORD, run=run).startswith("not root")
    assert tell_user(uid=None, run_dir="/r", output="/o", record=RECORD, run=run) == "job uid unknown"
