"""``slurm-ft classify``: attribution syntax, JSON shape, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from slurm_ft.classify.cli import parse_log_spec
from slurm_ft.cli import main
from slurm_ft.core.rundir import ErrorRecord, write_error
from slurm_ft.health.records import NodeReport

KEYERROR = "Traceback (most recent call last):\n  File \"t.py\", line 1\nKeyError: 'labels'\n"
XID79 = "[12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"


@pytest.fixture(autouse=True)
def empty_site_config(tmp_path, monkeypatch):
    site = tmp_path / "site.toml"
    site.write_text("")
    monkeypatch.setenv("SLURM_FT_CONFIG", str(site))


def _run(capsys, *argv):
    code = main(["classify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("spec, expected", [
    ("/var/log/r3.log", (None, "", "/var/log/r3.log")),
    ("3:/x/r3.log", (3, "", "/x/r3.log")),
    ("rank=3:/x/r3.log", (3, "", "/x/r3.log")),
    ("node=n2:/x/n2.log", (None, "n2", "/x/n2.log")),
    ("rank=3,node=gpu-a.12:/x/a:b.log", (3, "gpu-a.12", "/x/a:b.log")),
    ("node=n2,rank=4:rel/log", (4, "n2", "rel/log")),
    ("./3:odd-name.log", (None, "", "./3:odd-name.log")),
    ("n2:/x.log", (None, "", "n2:/x.log")),  # a node needs node=
])
def test_log_spec_syntax(spec, expected):
    assert parse_log_spec(spec) == expected


def test_json_verdict_has_exactly_the_design_fields(tmp_path, capsys):
    log = tmp_path / "r3.log"
    log.write_text(KEYERROR)
    kmsg = tmp_path / "dmesg.txt"
    kmsg.write_text(XID79)
    code, out, err = _run(capsys, "--log", f"rank=3,node=n1:{log}", "--kmsg", f"node=n2:{kmsg}",
                          "--slurm-state", "FAILED", "--exit-code", "1", "--json")
    assert code == 0 and err == ""
    verdict = json.loads(out)
    assert set(verdict) == {"category", "recoverable", "action", "culprit", "evidence", "confidence"}
    assert set(verdict["culprit"]) == {"nodes", "ranks"}
    assert (verdict["category"], verdict["action"], verdict["culprit"]["nodes"]) == (
        "hardware_gpu", "requeue_exclude", ["n2"])


def test_readable_verdict(tmp_path, capsys):
    log = tmp_path / "r3.log"
    log.write_text(KEYERROR)
    code, out, _ = _run(capsys, "--log", f"3:{log}")
    assert code == 0
    assert out.splitlines()[:3] == ["category:   user_code", "action:     stop (not recoverable)", "culprit:    ranks 3"]
    assert "  - rank 3 log: KeyError: 'labels'" in out
    code, out, _ = _run(capsys, "--log", f"3:{log}", "--explain")
    assert code == 0 and "findings (strongest first):" in out
    assert "   40 user_code     generic   exception.KeyError [rank 3]: rank 3 log: KeyError: 'labels'" in out


def test_error_files_node_reports_nvml_and_flags(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_error(run_dir, ErrorRecord(rank=1, time=2.0, exc_type="torch.OutOfMemoryError", message="CUDA out of memory.",
                                     host="n1"))
    report = tmp_path / "n2.json"
    report.write_text(json.dumps(NodeReport(job_id=9, node="n2", time=3.0, log_tails={"rank:4": "KeyError: 'x'"}).to_dict()))
    snap = tmp_path / "nvml.json"
    snap.write_text(json.dumps([{"node": "n3", "time": 0, "available": True, "gpus": [{"index": 0}]}]))
    code, out, _ = _run(capsys, "--error-file", str(run_dir), "--node-report", str(report), "--nvml-snapshot", str(snap),
                        "--signal", "SIGKILL", "--json")
    assert code == 0 and json.loads(out)["category"] == "oom_gpu"
    code, out, _ = _run(capsys, "--xid", "79", "--node", "n4", "--node-event", "n5:DOWN+NOT_RESPONDING:Not responding",
                        "--job-nodes", "n4,n5", "--json")
    assert json.loads(out)["culprit"]["nodes"] == ["n4", "n5"]


def test_rules_flag_changes_the_verdict(tmp_path, capsys):
    rules = tmp_path / "r.toml"
    rules.write_text('[category.user_code]\nrecoverable = true\naction = "requeue"\n')
    log = tmp_path / "r.log"
    log.write_text(KEYERROR)
    code, out, _ = _run(capsys, "--log", str(log), "--rules", str(rules), "--json")
    assert json.loads(out)["action"] == "requeue"


def _bad_inputs(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{oops")
    not_record = tmp_path / "not_record.json"
    not_record.write_text('{"rank": 1}')
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    bad_rules = tmp_path / "bad_rules.toml"
    bad_rules.write_text("[xid.79]\nkind = 3\n")
    bad_report = tmp_path / "report.json"
    bad_report.write_text('{"node": "n1"}')
    bad_nvml = tmp_path / "nvml.json"
    bad_nvml.write_text('[{"gpus": [{"index": 0, "warp_drive": 1}]}]')
    return [
        (["--log", str(tmp_path / "nope.log")], "nope.log"),
        (["--log", "n2:/definitely/missing"], "node=n2:/definitely/missing"),
        (["--error-file", str(bad_json)], "not valid JSON"),
        (["--error-file", str(not_record)], "not an error record"),
        (["--error-file", str(empty_dir)], "no error.rank*.json"),
        (["--slurm-state", "EXPLODED"], "'EXPLODED': not a Slurm job state"),
        (["--signal", "SIGWHATEVER"], "--signal 'SIGWHATEVER'"),
        (["--xid", "79"], "--xid needs --node"),
        (["--kmsg", f"rank=3:{bad_json}"], "belongs to a node"),
        (["--node-event", "n1"], "--node-event 'n1'"),
        (["--rules", str(bad_rules)], "bad_rules.toml"),
        (["--node-report", str(bad_report)], "node report"),
        (["--nvml-snapshot", str(bad_nvml)], "NVML snapshot"),
    ]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for argv, needle in _bad_inputs(tmp_path):
        code, out, err = _run(capsys, *argv)
        assert code == 2, argv
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("slurm-ft: ") and needle in lines[0], (argv, err)


def test_unreadable_log_is_reported(tmp_path, capsys):
    directory = tmp_path / "adir"
    directory.mkdir()
    code, _, err = _run(capsys, "--log", str(directory))
    assert code == 2 and "cannot read" in err


def test_entry_point_subprocess(tmp_path):
    log = tmp_path / "r.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    env = {"SLURM_FT_CONFIG": str(tmp_path / "none.toml"), "PATH": "/usr/bin:/bin"}
    (tmp_path / "none.toml").write_text("")
    proc = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "classify", "--log", f"0:{log}", "--json"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["category"] == "oom_gpu"
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", "import sys, slurm_ft.classify.cli; print(' '.join(sys.modules))"],
        capture_output=True, text=True, env=env, timeout=60, check=False).stdout.split()


def test_reader_gone_ends_quietly_with_the_sigpipe_status(tmp_path):
    """``slurm-ft classify --json | head -c0``: no BrokenPipeError traceback, exit 128+SIGPIPE."""
    log = tmp_path / "r.log"
    log.write_text(KEYERROR)
    (tmp_path / "none.toml").write_text("")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "classify", "--log", f"0:{log}", "--json"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                              env={"SLURM_FT_CONFIG": str(tmp_path / "none.toml"), "PATH": "/usr/bin:/bin"})
    finally:
        os.close(write_end)
    assert proc.returncode == 128 + signal.SIGPIPE and proc.stderr == "", proc.stderr


def test_a_deeply_nested_error_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "error.rank0.json"
    bad.write_text("[" * 100_000)
    code, _, err = _run(capsys, "--error-file", str(bad))
    assert code == 2 and "nested too deeply" in err and "\n" not in err.strip()


JOURNAL = ("Dec 04 03:12:45 gpu-a02 kernel: python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), "
           "order=0, oom_score_adj=0\n"
           "Dec 04 03:12:45 gpu-a02 kernel: Out of memory: Killed process 40213 (python) total-vm:98765432kB\n")


def test_a_kernel_log_without_a_node_is_judged_anyway(tmp_path, capsys):
    journal, dmesg = tmp_path / "journal.txt", tmp_path / "dmesg.txt"
    journal.write_text(JOURNAL)  # journalctl -k lines carry the host
    dmesg.write_text("[12345.678] Out of memory: Killed process 40213 (python) total-vm:98765432kB\n")
    code, out, _ = _run(capsys, "--json", "--kmsg", str(journal))
    verdict = json.loads(out)
    assert code == 0 and verdict["category"] == "oom_host" and verdict["culprit"]["nodes"] == ["gpu-a02"]
    code, out, _ = _run(capsys, "--json", "--kmsg", str(dmesg))
    verdict = json.loads(out)
    assert code == 0 and verdict["category"] == "oom_host" and verdict["culprit"]["nodes"] == []
    assert "culprit node unknown" in verdict["evidence"][0]


def test_trace_reads_a_hung_attempts_dumps_and_node_reports(capsys):
    from pathlib import Path
    attempt = Path(__file__).resolve().parents[2] / "data" / "traces" / "lab_stuck_loader"
    code, out, _ = _run(capsys, "--trace", str(attempt), "--in-allocation", "--json")
    verdict = json.loads(out)
    assert code == 0 and verdict["category"] == "hang" and verdict["culprit"] == {"nodes": ["n2"], "ranks": [1]}
    assert verdict["evidence"][0].startswith("rank 1 (n2): never entered all_gather #83")


def test_trace_needs_a_folder_with_dumps(tmp_path, capsys):
    for path, needle in ((tmp_path / "nope", "not a directory"), (tmp_path, "no flight-recorder dump")):
        code, out, err = _run(capsys, "--trace", str(path))
        assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1
