"""The per-rank wrapper: records how the rank ended and ends the same way (real subprocesses, no Slurm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from slurm_ft.core.rundir import read_ends
from slurm_ft.health.cgroup import oom_kills
from slurm_ft.launch.rank import end_record, is_agent


def _wrapped(tmp_path, code: str, rank: str = "1") -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_FT_RUN_DIR": str(tmp_path), "SLURM_PROCID": rank, "SLURMD_NODENAME": "n7"}
    env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "slurm_ft.launch.rank", "--", sys.executable, "-c", code],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_signal_death_is_recorded_and_repeated(tmp_path):
    done = _wrapped(tmp_path, "import os, sys; print('about to die', file=sys.stderr, flush=True); "
                              "print('out', flush=True); os.kill(os.getpid(), 9)")
    assert done.returncode == -signal.SIGKILL
    assert "about to die" in done.stderr and done.stdout == "out\n"  # passed through unchanged
    (end,) = read_ends(tmp_path)
    assert (end.rank, end.host, end.signal, end.exit_code) == (1, "n7", 9, None)
    assert "about to die" in end.tail and end.pid > 0 and end.failed


def test_an_exit_code_is_recorded_and_repeated(tmp_path):
    done = _wrapped(tmp_path, "import sys; sys.exit(3)", rank="4")
    assert done.returncode == 3
    (end,) = read_ends(tmp_path)
    assert (end.rank, end.exit_code, end.signal) == (4, 3, None)


def test_a_clean_exit_keeps_no_tail(tmp_path):
    done = _wrapped(tmp_path, "import sys; print('noise', file=sys.stderr)")
    assert done.returncode == 0 and "noise" in done.stderr
    (end,) = read_ends(tmp_path)
    assert end.exit_code == 0 and end.tail == "" and not end.failed


def test_a_missing_command_exits_127_like_a_shell(tmp_path):
    env = {**os.environ, "SLURM_FT_RUN_DIR": str(tmp_path), "SLURM_PROCID": "0"}
    done = subprocess.run([sys.executable, "-m", "slurm_ft.launch.rank", "--", "/nonexistent/train"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 127 and "/nonexistent/train" in done.stderr


def test_sigterm_to_the_step_reaches_the_child_and_the_wrapper_records_it(tmp_path):
    """Slurm signals every process of a step: the wrapper outlives SIGTERM, the child dies of it."""
    env = {**os.environ, "SLURM_FT_RUN_DIR": str(tmp_path), "SLURM_PROCID": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "slurm_ft.launch.rank", "--", sys.executable, "-c",
                             "import sys, time; print('up', flush=True); time.sleep(60)"],
                            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "up\n"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    (end,) = read_ends(tmp_path)
    assert end.signal == signal.SIGTERM


@pytest.mark.parametrize("layout, expected", [
    ({"proc/self/cgroup": "0::/slurm/uid_1/job_5/step_0\n",
      "cg/slurm/uid_1/job_5/step_0/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"}, 2),
    ({"proc/self/cgroup": "12:pids:/x\n4:memory:/slurm/job_5\n",
      "cg/memory/slurm/job_5/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}, 1),
    ({"proc/self/cgroup": "0::/\n"}, None),
])
def test_oom_kills_reads_the_memory_cgroup(tmp_path, layout, expected):
    for rel, text in layout.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert oom_kills(tmp_path / "proc", tmp_path / "cg") == expected


def test_end_record_counts_only_the_kills_while_the_rank_ran():
    end = end_record(3, -9, pid=10, when=5.0, oom_before=2, oom_after=3, tail="t", host="n1")
    assert (end.signal, end.oom_kills, end.tail) == (9, 1, "t")
    assert end_record(3, -9, pid=10, when=5.0, oom_before=None, oom_after=3, tail="", host="n1").oom_kills is None


def test_the_wrapper_steps_aside_for_torchruns_agent():
    assert is_agent(["torchrun", "--nproc-per-node=8", "train.py"])
    assert is_agent(["/opt/venv/bin/python", "-m", "torch.distributed.run", "train.py"])
    assert not is_agent(["python", "-m", "slurm_ft.train.example"]) and not is_agent([])


def test_the_child_inherits_the_tasks_descriptors(tmp_path):
    """slurmstepd may hand a task more than stdio (PMI_FD): the wrapper passes it on."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)
    env = {**os.environ, "SLURM_FT_RUN_DIR": str(tmp_path), "SLURM_PROCID": "0"}
    done = subprocess.run([sys.executable, "-m", "slurm_ft.launch.rank", "--", sys.executable, "-c",
                           f"import os; os.write({write_fd}, b'through')"], env=env, pass_fds=(write_fd,),
                          timeout=60, check=False)
    os.close(write_fd)
    assert done.returncode == 0 and os.read(read_fd, 100) == b"through"
    os.close(read_fd)


def test_a_bad_end_rings_the_launchers_bell_and_a_clean_one_does_not(tmp_path):
    from slurm_ft.launch.bell import ENV, Bell

    bell = Bell("127.0.0.1")
    try:
        env = {**os.environ, "SLURM_FT_RUN_DIR": str(tmp_path), "SLURM_PROCID": "5", ENV: bell.arm()}
        env.pop("RANK", None)
        for code, rings in (("import sys; sys.exit(0)", False), ("import sys; sys.exit(2)", True)):
            subprocess.run([sys.executable, "-m", "slurm_ft.launch.rank", "--", sys.executable, "-c", code],
                           env=env, capture_output=True, timeout=60, check=False)
            assert bell.wait(0.5) is rings, code
    finally:
        bell.close()


def test_the_wrapper_records_its_nodes_link_counters_at_the_start(tmp_path):
    from slurm_ft.launch import links

    assert _wrapped(tmp_path, "pass").returncode == 0
    reading = links.read(tmp_path, links.START, "n7")  # this machine's counters, as node n7's
    assert reading is not None and reading.node == "n7"
