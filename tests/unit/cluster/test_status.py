"""``slurm-ft status`` over a monitor database the monitor itself wrote."""

from __future__ import annotations

import json
import os

import pytest

from slurm_ft.cli import main
from slurm_ft.slurm.types import JobState
from tests.unit.cluster.test_monitor import FakeClient, failed, make, register_job


def test_status_shows_requeued_job_and_its_action(tmp_path, capsys):
    state = tmp_path / "state"
    register_job(state, tmp_path)
    make(state, FakeClient([failed()])).close()
    mon = make(state, FakeClient([failed()]))
    mon.poll_once()
    mon.close()
    assert main(["status", "--state-dir", str(state), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["jobs"][0]["job_id"] == 100 and status["jobs"][0]["status"] == "requeued"
    assert status["actions"][0]["state"] == "done"
    assert main(["status", "--state-dir", str(state)]) == 0
    assert "requeued" in capsys.readouterr().out


def test_status_without_state_is_one_line_error(tmp_path, capsys):
    assert main(["status", "--state-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurm-ft: status: no monitor state at") and err.count("\n") == 1


def test_status_names_the_category_of_a_strike(tmp_path):
    from slurm_ft.cluster.monitor import MonitorDb
    from slurm_ft.cluster.status import format_status, read_status

    db = MonitorDb(tmp_path / "monitor.db")
    db.record_strike(7, 0, "n3", "hardware_node", 1000.0)
    db.close()
    assert "job 7 restart 0: strike:n3 done hardware_node" in format_status(read_status(tmp_path))


def test_a_corrupt_quarantine_store_is_loud_in_status_and_in_the_metrics(tmp_path, capsys):
    """Issue 16: the gate keeps the node's own checks, but the broken store must be seen, with its repair."""
    from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore, default_db_path

    state = tmp_path / "state"
    register_job(state, tmp_path)
    default_db_path(state).write_bytes(os.urandom(4096))
    mon = make(state, FakeClient([failed(state=JobState.RUNNING)]),
               quarantine=Quarantine(QuarantineStore(default_db_path(state)), client=FakeClient([])))
    mon.poll_once()
    assert "slurm_ft_quarantine_store_ok 0" in mon.metrics.render()
    mon.close()
    assert main(["status", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ERROR: quarantine store") and f"Repair: mv {default_db_path(state)}" in out


def _as_nobody_possible() -> bool:
    import shutil

    return os.geteuid() == 0 and shutil.which("runuser") is not None and os.path.exists("/usr/bin/python3")


@pytest.mark.skipif(not _as_nobody_possible(), reason="needs root, runuser and /usr/bin/python3")
def test_status_as_a_non_root_user_reads_a_healthy_wal_database():
    """A user runs `slurm-ft status` on the root-owned state dir: while the monitor runs (-wal/-shm present) and
    after it stopped (none: the reader may not create them there)."""
    import shutil
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    from slurm_ft.cluster.monitor import JobStatus, MonitorDb

    state = Path(tempfile.mkdtemp(prefix="slurm-ft-status-", dir="/tmp"))  # pytest's tmp_path is root-only
    state.chmod(0o755)
    repo = Path(__file__).resolve().parents[3]
    code = ("import sys; from slurm_ft.cluster.status import read_status\n"
            "print(sorted(j['job_id'] for j in read_status(sys.argv[1])['jobs']))")

    def status_as_nobody() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={repo}", "/usr/bin/python3",
                               "-c", code, str(state)], capture_output=True, text=True, timeout=60, check=False)

    db = MonitorDb(state / "monitor.db")
    db.set_job(5, restart_count=0, status=JobStatus.WATCHING, now=time.time())
    running = status_as_nobody()
    db.close()  # the monitor stops: its -wal and -shm go
    stopped = status_as_nobody()
    shutil.rmtree(state)
    assert running.returncode == 0 and running.stdout.strip() == "[5]", running.stderr
    assert stopped.returncode == 0 and stopped.stdout.strip() == "[5]", stopped.stderr
