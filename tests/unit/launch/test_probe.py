"""The launcher's node probe with fake processes and a fake clock."""

from __future__ import annotations

import subprocess

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.launch.probe import (
    REBOOTED,
    UPTIME_COMMAND,
    ProbeConfig,
    boot_times,
    fan_out_argv,
    probe_argv,
    probe_nodes,
    rebooted_since,
)


class FakeProc:
    def __init__(self, code, after):
        self.code, self.after, self.killed, self.polls = code, after, False, 0

    def poll(self):
        self.polls += 1
        return self.code if self.polls > self.after else None

    def kill(self):
        self.killed = True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def silent(argv, env, timeout_s):
    return ""


def test_nodes_the_fan_out_missed_each_get_one_step():
    spawned, fanned = [], []

    def spawn(argv, env):
        spawned.append(argv)
        return FakeProc(0, after=2)

    def run(argv, env, timeout_s):
        fanned.append((argv, timeout_s))
        return "n3\nnot-ours\n"

    clock = Clock()
    assert probe_nodes(["n1", "n2", "n3"], {}, ProbeConfig(timeout_s=5), spawn=spawn, run=run, clock=clock,
                       sleep=clock.sleep) == {}
    assert fanned == [(fan_out_argv(["n1", "n2", "n3"]), 2.5)]  # half the timeout
    assert spawned == [probe_argv("n1"), probe_argv("n2")]
    assert "--overlap" in spawned[0] and "--nodelist=n1" in spawned[0]


def test_one_step_across_all_nodes_is_the_whole_probe_when_every_node_answers():
    def spawn(argv, env):
        raise AssertionError(f"no per-node step expected: {argv}")

    argv = fan_out_argv(["n1", "n2"])
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n2"]
    assert "--overlap" in argv and "--kill-on-bad-exit=0" in argv and argv[-3:-1] == ["/bin/sh", "-c"]
    assert probe_nodes(["n1", "n2"], {}, spawn=spawn, run=lambda a, e, t: "n2 10.5\nn1 7.25\n") == {}
    assert probe_nodes(["n1", "n2"], {}, spawn=spawn, run=lambda a, e, t: "n2\nn1\n") == {}  # no uptime: answered


def test_the_fan_out_prints_each_nodes_name_and_uptime():
    done = subprocess.run(["/bin/sh", "-c", UPTIME_COMMAND], env={"SLURMD_NODENAME": "n7"}, capture_output=True,
                          text=True, check=True)
    name, uptime = done.stdout.split()
    assert name == "n7" and float(uptime) > 0
    assert boot_times(f"n7 {uptime}\nn9 1.0\nn8 x\n", ["n7", "n8"], now=1000.0) == {
        "n7": 1000.0 - float(uptime), "n8": None}


def test_a_node_that_booted_after_the_attempt_started_fails_the_probe_though_it_answers():
    def spawn(argv, env):
        raise AssertionError(f"every node answered: {argv}")

    answers = lambda a, e, t: "n1 5000.0\nn2 30.0\n"  # noqa: E731  n2 booted 30 s before now (1000)
    failed = probe_nodes(["n1", "n2"], {}, since=900.0, spawn=spawn, run=answers, now=lambda: 1000.0)
    assert failed == {"n2": "rebooted 70 s after the attempt started: nothing it held survived"}
    assert failed["n2"].startswith(REBOOTED)
    assert probe_nodes(["n1", "n2"], {}, since=967.0, spawn=spawn, run=answers, now=lambda: 1000.0) == {}  # slack
    assert probe_nodes(["n1", "n2"], {}, spawn=spawn, run=answers, now=lambda: 1000.0) == {}  # no attempt start
    assert rebooted_since({"n1": None, "n2": 980.0}, 900.0) == {"n2": "rebooted 80 s after the attempt started: "
                                                                      "nothing it held survived"}


def test_no_fan_out_for_one_node_and_a_failed_fan_out_probes_each_node():
    spawned = []

    def spawn(argv, env):
        spawned.append(argv)
        return FakeProc(0, after=0)

    def no_srun(argv, env, timeout_s):
        raise FileNotFoundError("srun")

    def unexpected(argv, env, timeout_s):
        raise AssertionError("no fan-out for one node")

    assert probe_nodes(["n1"], {}, spawn=spawn, run=unexpected, sleep=lambda s: None) == {}
    assert probe_nodes(["n1", "n2"], {}, spawn=spawn, run=no_srun, sleep=lambda s: None) == {}
    assert spawned == [probe_argv("n1"), probe_argv("n1"), probe_argv("n2")]


def test_failing_and_silent_nodes_are_named():
    procs = {"n1": FakeProc(0, 0), "n2": FakeProc(233, 1), "n3": FakeProc(0, after=10**9)}

    def spawn(argv, env):
        return procs[next(a for a in argv if a.startswith("--nodelist=")).split("=")[1]]

    clock = Clock()
    bad = probe_nodes(["n1", "n2", "n3"], {}, ProbeConfig(timeout_s=1, poll_s=0.1), spawn=spawn, run=silent,
                      clock=clock, sleep=clock.sleep)
    assert set(bad) == {"n2", "n3"}
    assert "exit 233" in bad["n2"] and "within 1s" in bad["n3"]
    assert procs["n3"].killed and not procs["n1"].killed
    assert clock.now == pytest.approx(1.0, abs=0.11)


def test_no_srun_blames_nobody_and_zero_timeout_is_off():
    def spawn(argv, env):
        raise FileNotFoundError("srun")

    assert probe_nodes(["n1"], {}, ProbeConfig(), spawn=spawn) == {}
    assert probe_nodes(["n1"], {}, ProbeConfig(timeout_s=0), spawn=spawn) == {}


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="timeout_s"):
        ProbeConfig(timeout_s=-1)


def test_the_step_across_the_nodes_runs_the_configured_command():
    seen = []

    def run(argv, env, timeout_s):
        seen.append(argv)
        return "n1\nn2\n"

    command = ("python3", "-m", "slurm_ft.launch.links", "--run-dir", "/r")
    assert probe_nodes(["n1", "n2"], {}, ProbeConfig(timeout_s=4, node_command=command), run=run,
                       spawn=lambda a, e: (_ for _ in ()).throw(AssertionError(a))) == {}
    assert seen == [fan_out_argv(["n1", "n2"], command)] and seen[0][-5:] == list(command)
    with pytest.raises(ValueError, match="node_command"):
        ProbeConfig(node_command=())
