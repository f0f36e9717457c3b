"""Lab pieces that need no running cluster: config validation, slurm.conf rendering, ports, pid handling."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.lab import cli as lab_cli
from slurm_ft.lab import ports, procs
from slurm_ft.lab.cluster import LabCluster, LabConfig, LabError, check_prerequisites, default_lab_dir, node_ready
from slurm_ft.lab.slurmconf import LabLayout, render_slurm_conf
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"nodes": 0}, "nodes"),
    ({"nodes": 65}, "nodes"),
    ({"cpus_per_node": 0}, "cpus_per_node"),
    ({"base_port": 80}, "base_port"),
    ({"slurmd_timeout": 1}, "slurmd_timeout"),
    ({"min_job_age": 0}, "min_job_age"),
    ({"dir": "/tmp/" + "x" * 80}, "dir"),
    ({"extra_conf": ("A=1\nB=2",)}, "extra_conf"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LabConfig(**{"dir": Path("/tmp/lab-x"), **kwargs})


def test_config_is_keyword_only_and_absolute(tmp_path, monkeypatch):
    with pytest.raises(TypeError):
        LabConfig(tmp_path)  # type: ignore[misc]
    monkeypatch.chdir("/tmp")
    assert LabConfig(dir=Path("rel")).dir == Path("/tmp/rel")


def test_default_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_FT_LAB_DIR", str(tmp_path / "a"))
    assert default_lab_dir() == tmp_path / "a"
    monkeypatch.delenv("SLURM_FT_LAB_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_lab_dir() == tmp_path / "state" / "slurm-ft" / "lab"


def _layout(tmp_path, nodes=3, slurm_version="22.05.8"):
    return LabLayout(dir=tmp_path, cluster_name="lababc", hostname="host1", ctld_port=21000,
                     node_ports=tuple(21001 + i for i in range(nodes)), cpus_per_node=2, memory_mb=1000,
                     slurm_user="root", slurmd_timeout=10, min_job_age=300, slurm_version=slurm_version)


def test_rendered_conf_has_what_fault_tests_rely_on(tmp_path):
    conf = render_slurm_conf(_layout(tmp_path), ["Prolog=/x/prolog", "PrologFlags=Alloc"])
    lines = conf.splitlines()
    for expected in ("JobRequeue=1", "SlurmdTimeout=10", "MinJobAge=300", "ReturnToService=2",
                     "SlurmctldPort=21000", "SlurmctldHost=host1(127.0.0.1)", "ProctrackType=proctrack/linuxproc",
                     f"AuthInfo=socket={tmp_path}/munge/munge.socket,cred_expire=30", f"SlurmdSpoolDir={tmp_path}/spool/%n",
                     "SelectType=select/cons_tres", "SlurmdParameters=config_overrides"):
        assert expected in lines
    node_lines = [line for line in lines if line.startswith("NodeName=")]
    assert node_lines == [
        f"NodeName=n{i} NodeHostname=host1 NodeAddr=127.0.0.1 Port={21000 + i} CPUs=2 RealMemory=1000 "
        "State=UNKNOWN" for i in (1, 2, 3)]
    assert lines[-2:] == ["Prolog=/x/prolog", "PrologFlags=Alloc"]  # hooks last, so they win
    assert "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines


def test_extra_lines_replace_generated_parameters_and_merge_comma_lists(tmp_path):
    conf = render_slurm_conf(_layout(tmp_path), ["schedulerparameters=nohold_on_prolog_fail,bf_interval=5",
                                                 "MinJobAge=30", "NodeName=extra CPUs=1"])
    lines = conf.splitlines()
    assert [line for line in lines if line.lower().startswith("schedulerparameters")] == [
        "SchedulerParameters=bf_interval=5,nohold_on_prolog_fail"]
    assert [line for line in lines if line.startswith("MinJobAge")] == ["MinJobAge=30"]
    assert sum(line.startswith("NodeName=") for line in lines) == 4  # node lines are never replaced


def test_requeue_delay_is_the_credential_lifetime_before_25_11_and_its_own_setting_since(tmp_path):
    old = render_slurm_conf(_layout(tmp_path, slurm_version="22.05.8"), ["SchedulerParameters=x"]).splitlines()
    assert f"AuthInfo=socket={tmp_path}/munge/munge.socket,cred_expire=30" in old
    assert "SchedulerParameters=bf_interval=5,x" in old
    new = render_slurm_conf(_layout(tmp_path, slurm_version="25.11.7"), ["SchedulerParameters=x"]).splitlines()
    assert f"AuthInfo=socket={tmp_path}/munge/munge.socket" in new  # Slurm's default credential lifetime
    assert "SchedulerParameters=bf_interval=5,requeue_delay=30,x" in new


def test_rendering_is_deterministic(tmp_path):
    assert render_slurm_conf(_layout(tmp_path)) == render_slurm_conf(_layout(tmp_path))


def test_prerequisites_need_root():
    with pytest.raises(LabError, match="must run as root"):
        check_prerequisites(which=lambda prog: f"/usr/bin/{prog}", euid=lambda: 1000)


def test_missing_programs_name_the_apt_command():
    with pytest.raises(LabError) as info:
        check_prerequisites(which=lambda prog: None if prog in ("munged", "sinfo") else "/x", euid=lambda: 0,
                            exists=lambda path: False)
    assert str(info.value) == ("missing munged, sinfo: install with `apt-get install -y munge slurm-wlm` "
                               "(Debian/Ubuntu)")


def test_pick_block_skips_ports_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not ports.port_is_free(taken)
        base = ports.pick_block(3, port_range=(taken - 2, taken + 8))
        assert taken not in range(base, base + 3)
        assert ports.can_connect(taken) and not ports.can_connect(base)


def test_pick_block_gives_up_clearly():
    with pytest.raises(ValueError, match="count"):
        ports.pick_block(10, port_range=(30000, 30005))


def test_spawn_is_running_and_stop(tmp_path):
    daemon = procs.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                         env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "log")
    assert procs.is_running(daemon)
    record = procs.Daemon.from_dict(daemon.to_dict())
    assert record == daemon
    stopped = procs.stop([daemon], timeout=5)
    assert stopped == [daemon] and not procs.is_running(daemon)
    assert procs.stop([daemon]) == []  # already gone: nothing signalled


def test_pid_reuse_is_not_ours(tmp_path):
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    proc = subprocess.Popen(argv)
    try:
        while procs.cmdline(proc.pid) != argv:  # exec may not have set the new argv yet
            time.sleep(0.01)
        real = procs.Daemon(name="x", pid=proc.pid, argv=procs.cmdline(proc.pid), start_ticks=procs._stat(proc.pid)[1])
        assert procs.is_running(real)
        other_argv = procs.Daemon(name="x", pid=proc.pid, argv=("slurmd", "-N", "n1"), start_ticks=real.start_ticks)
        other_start = procs.Daemon(name="x", pid=proc.pid, argv=real.argv, start_ticks=real.start_ticks + 1)
        assert not procs.is_running(other_argv) and not procs.is_running(other_start)
        assert procs.stop([other_argv, other_start], timeout=0.1) == []
        assert proc.poll() is None  # never signalled: it is not the process we recorded
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_ignored_gets_sigkill(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    daemon = procs.spawn("stubborn", [sys.executable, "-c", code], env={}, log_path=tmp_path / "log")
    for _ in range(100):
        if "ready" in (tmp_path / "log").read_text():
            break
        time.sleep(0.05)
    procs.stop([daemon], timeout=0.3)
    assert not procs.is_running(daemon)


def test_node_ready():
    assert node_ready(NodeInfo(name="n1", state=frozenset({"IDLE"})))
    assert node_ready(NodeInfo(name="n1", state=frozenset({"IDLE", "DRAIN"})))
    assert node_ready(NodeInfo(name="n1", state=frozenset({"MIXED"})))
    assert not node_ready(NodeInfo(name="n1", state=frozenset({"UNKNOWN"})))
    assert not node_ready(NodeInfo(name="n1", state=frozenset({"IDLE", "NOT_RESPONDING"})))
    assert not node_ready(NodeInfo(name="n1", state=frozenset({"DOWN"})))
    assert not node_ready(NodeInfo(name="n1"))


def test_env_and_names(tmp_path):
    lab = LabCluster(LabConfig(dir=Path("/tmp/slurm-ft-unit-never-started"), nodes=3))
    # everything slurm-ft needs points inside the lab dir: Slurm's config, slurm-ft's site config and state
    assert lab.env() == {"SLURM_CONF": "/tmp/slurm-ft-unit-never-started/slurm.conf",
                         "SLURM_FT_CONFIG": "/tmp/slurm-ft-unit-never-started/etc/slurm-ft/config.toml",
                         "SLURM_FT_STATE_DIR": "/tmp/slurm-ft-unit-never-started/state"}
    assert lab.node_names == ("n1", "n2", "n3")
    assert lab.cluster_name.startswith("lab") and lab.cluster_name == LabCluster(lab.config).cluster_name
    assert not lab.is_up()
    with pytest.raises(LabError, match="no lab running"):
        lab.status()
    lab.down()  # nothing recorded: a no-op


def test_status_tables():
    nodes = lab_cli.format_nodes([NodeInfo(name="n1", state=frozenset({"IDLE"})),
                                  NodeInfo(name="n2", state=frozenset({"IDLE", "DRAIN"}), reason="slurm-ft: xid 79")])
    assert nodes.splitlines() == ["NODE  STATE       REASON", "n1    IDLE", "n2    DRAIN+IDLE  slurm-ft: xid 79"]
    jobs = lab_cli.format_jobs([JobInfo(job_id=3, name="t", state=JobState.FAILED, nodes=("n1", "n2"),
                                        exit_code=0, exit_signal=9, restart_count=1)])
    assert jobs.splitlines()[1].split() == ["3", "t", "FAILED", "n1,n2", "1", "0:9"]
    assert lab_cli.format_jobs([]) == "no jobs"


def test_cli_bad_input_is_one_line_and_nonzero(capsys):
    from slurm_ft.cli import main

    assert main(["lab", "up", "--nodes", "0", "--dir", "/tmp/slurm-ft-unit-never-started"]) == 2
    assert capsys.readouterr().err.strip() == "slurm-ft: nodes: must be within 1..64 (--nodes), got 0"
    assert main(["lab", "env", "--dir", "/tmp/slurm-ft-unit-never-started"]) == 2
    assert "no lab in /tmp/slurm-ft-unit-never-started" in capsys.readouterr().err
    assert main(["lab", "status", "--dir", "/tmp/slurm-ft-unit-never-started"]) == 2
    assert not Path("/tmp/slurm-ft-unit-never-started").exists()  # nothing created by failing commands


def test_ancestors_and_identify():
    import os

    chain = procs.ancestors(os.getpid())
    assert {os.getpid(), os.getppid()} <= chain
    me = procs.identify(os.getpid(), name="me")
    assert me is not None and procs.is_running(me) and me.argv == procs.cmdline(os.getpid())
    assert procs.identify(2**22 + 12345, name="gone") is None


def test_nspids_from_proc_status():
    status = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t4240\n" \
             "NSpid:\t4242\t2\nNSpgid:\t4240\t1\n"
    assert procs.nspids(status) == (4242, 2)
    assert procs.nspids("Name:\tx\nNSpid:\t17\n") == (17,)
    assert procs.nspids("Name:\tx\n") == ()
