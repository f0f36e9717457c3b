"""``slurm-ft status`` over a monitor database the monitor itself wrote."""

from __future__ import annotations

import json

from slurm_ft.cli import main
from tests.unit.test_monitor import FakeClient, failed, make, register_job


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
    from slurm_ft.monitor import MonitorDb
    from slurm_ft.status import format_status, read_status

    db = MonitorDb(tmp_path / "monitor.db")
    db.record_strike(7, 0, "n3", "hardware_node", 1000.0)
    db.close()
    assert "job 7 restart 0: strike:n3 done hardware_node" in format_status(read_status(tmp_path))
