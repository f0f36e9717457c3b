"""Warm standby ranks (slurm_ft.launch.standby) with the real per-rank wrapper: real processes, sockets and signals."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from slurm_ft.core.rundir import read_ends
from slurm_ft.launch import standby

RANK_SCRIPT = textwrap.dedent("""\
    import os, sys, time
    print("out", os.environ["RANK"], os.getcwd(), sys.argv, sys.path[0], os.getpid(), flush=True)
    print("err of rank", os.environ["RANK"], file=sys.stderr, flush=True)
    if sys.argv[1:] == ["sleep"]:
        time.sleep(60)
    if sys.argv[1:] == ["spawn"]:  # leaves a child behind, as a data loader worker would
        import subprocess
        print("child", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid, flush=True)
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
    """)


def slot_env(tmp_path, **extra: str) -> dict[str, str]:
    """A wrapper's environment for slot (a fresh job, n1, 0), rank 0, with ``rank.py`` in ``tmp_path``."""
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    return {**os.environ, "SLURM_JOB_ID": f"t{uuid.uuid4().hex[:12]}", "SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0",
            "RANK": "0", "SLURM_FT_RUN_DIR": str(tmp_path / "run"), **extra}


def start_standby(env: dict[str, str], preload: str, *args: str, **kw) -> subprocess.Popen:
    """The slot's standby, once it listens (it answers from then on; a request waits for its imports)."""
    proc = subprocess.Popen([sys.executable, "-m", "slurm_ft.launch.standby", "--python", sys.executable,
                             "--preload", preload, *args], env=env, **kw)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _bound(standby.slot_address(env)):
        time.sleep(0.05)
    return proc


def _bound(where: bytes) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(where)
        except OSError:
            return False
    return True


@pytest.fixture
def slot(tmp_path):
    """A standby for slot (job, n1, 0) preloading only `json`, and the environment its wrappers get."""
    env = slot_env(tmp_path)
    proc = start_standby(env, "json", stderr=subprocess.PIPE, text=True)
    env[standby.ENV] = sys.executable
    yield env, proc
    proc.kill()
    proc.wait()


def wrapped(env, tmp_path, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "slurm_ft.launch.rank", "--", *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def test_a_standby_runs_the_rank_as_python_would_and_the_wrapper_records_its_end(slot, tmp_path):
    env, proc = slot
    done = wrapped(env, tmp_path, sys.executable, "rank.py", "3")
    out, err = done.communicate(timeout=30)
    assert done.returncode == 3, err
    # rank, cwd, sys.argv, sys.path[0] (the script's directory), as `python rank.py 3` would have them
    assert out.startswith(f"out 0 {tmp_path} ['rank.py', '3'] {tmp_path} ")
    pid = int(out.split()[-1])
    assert pid != done.pid and "rank starts cold" not in err  # the standby's fork, not a child of the wrapper
    (end,) = read_ends(tmp_path / "run")
    assert (end.pid, end.exit_code, end.signal, end.tail, end.started) == (pid, 3, None, "err of rank 0\n", "standby")
    again = wrapped(env, tmp_path, sys.executable, "-m", "rank", "0")  # the standby stays for the next restart
    out, err = again.communicate(timeout=30)
    assert again.returncode == 0 and "out 0" in out and "rank starts cold" not in err
    assert proc.poll() is None


def test_the_steps_signals_reach_the_rank_through_the_wrapper(slot, tmp_path):
    env, _ = slot
    rank = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
    assert rank.stdout.readline().startswith("out 0")
    rank.send_signal(signal.SIGTERM)
    assert rank.wait(timeout=30) == -signal.SIGTERM  # the wrapper dies of the rank's signal, as srun expects
    (end,) = read_ends(tmp_path / "run")
    assert end.signal == signal.SIGTERM


def test_a_killed_wrapper_takes_its_rank_down_and_the_standby_serves_again(slot, tmp_path):
    env, proc = slot
    rank = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
    pid = int(rank.stdout.readline().split()[-1])
    assert pid in children(proc.pid)
    rank.kill()  # Slurm killing the step kills the wrappers with SIGKILL
    rank.wait()
    deadline = time.monotonic() + 10
    while pid in children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid not in children(proc.pid)
    again = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
    assert again.wait(timeout=30) == 0 and proc.poll() is None


def test_the_stop_signal_waits_for_a_running_rank_then_ends_the_standby_quietly(slot, tmp_path):
    env, proc = slot
    rank = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
    assert rank.stdout.readline().startswith("out 0")
    proc.send_signal(standby.STOP_SIGNAL)  # a step-wide SIGUSR2 while a rank runs: the rank is not touched
    time.sleep(0.5)
    assert proc.poll() is None and rank.poll() is None
    rank.send_signal(signal.SIGTERM)
    assert rank.wait(timeout=30) == -signal.SIGTERM
    assert proc.wait(timeout=10) == 0
    idle = start_standby(env, "json")
    idle.send_signal(standby.STOP_SIGNAL)
    assert idle.wait(timeout=10) == 0


def test_what_a_killed_rank_started_goes_with_it(slot, tmp_path):
    env, proc = slot
    rank = wrapped(env, tmp_path, sys.executable, "rank.py", "spawn")
    assert rank.stdout.readline().startswith("out 0")
    child = int(rank.stdout.readline().split()[1])
    rank.kill()  # the step is killed: Slurm would kill the whole cgroup, the standby kills the rank's group
    rank.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child) and proc.poll() is None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_request_while_the_standby_still_imports_waits_for_the_imports(tmp_path):
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(4)\n")
    env = slot_env(tmp_path, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    proc = start_standby(env, "slowmod")
    try:
        env[standby.ENV] = sys.executable
        asked = time.monotonic()
        early = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
        _, err = early.communicate(timeout=30)
        assert early.returncode == 0 and "rank starts cold" not in err
        assert time.monotonic() - asked >= 2  # it waited for slowmod (4 s from the standby's start)
        assert read_ends(tmp_path / "run")[0].started == "standby"
    finally:
        proc.kill()
        proc.wait()


def marked_slot(tmp_path, *args: str) -> tuple[dict[str, str], subprocess.Popen, Path]:
    """A standby preloading ``marker``, a module that writes down the pid of each process that imports it."""
    (tmp_path / "marker.py").write_text("import os\nwith open(os.environ['MARKS'], 'a') as fh: fh.write(f'{os.getpid()}\\n')\n")
    marks = tmp_path / "marks"
    env = slot_env(tmp_path, MARKS=str(marks), PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    proc = start_standby(env, "marker", *args)
    env[standby.ENV] = sys.executable
    return env, proc, marks


def marked(marks: Path, count: int) -> list[int]:
    """The pids that imported the marker, once there are ``count`` of them (10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in marks.read_text().split()] if marks.exists() else []
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    return pids


def test_each_rank_is_a_fresh_interpreter_that_did_the_imports_itself_never_a_fork_of_one(tmp_path):
    env, proc, marks = marked_slot(tmp_path)
    try:
        ranks = []
        for _ in range(2):
            done = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
            out, err = done.communicate(timeout=30)
            assert done.returncode == 0 and "rank starts cold" not in err
            ranks.append(int(out.split()[-1]))
        # each rank imported the preload in its own process; the keeper imported nothing (a fork of a process that
        # imported torch is not safe: MKL's allocator spun in such a fork)
        assert marked(marks, 3)[:2] == ranks and proc.pid not in marked(marks, 3)
    finally:
        proc.kill()
        proc.wait()


def test_the_next_spare_starts_while_the_rank_runs_and_serves_the_next_restart(tmp_path):
    env, proc, marks = marked_slot(tmp_path, "--refill-after", "0.5")
    try:
        rank = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
        first = int(rank.stdout.readline().split()[-1])
        pids = marked(marks, 2)  # the next spare imported while the rank still ran
        assert pids[0] == first and rank.poll() is None and pids[1] in children(proc.pid)
        rank.kill()
        rank.wait()
        again = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
        out, _ = again.communicate(timeout=30)
        assert again.returncode == 0 and int(out.split()[-1]) == pids[1]
    finally:
        proc.kill()
        proc.wait()


def test_a_spare_that_died_waiting_is_replaced_and_the_rank_still_starts_warm(slot, tmp_path):
    env, proc = slot
    deadline = time.monotonic() + 10
    while not children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    (spare,) = children(proc.pid)
    os.kill(spare, signal.SIGKILL)
    done = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
    out, err = done.communicate(timeout=30)
    assert done.returncode == 0 and "rank starts cold" not in err and int(out.split()[-1]) != spare
    assert read_ends(tmp_path / "run")[0].started == "standby" and proc.poll() is None


def test_a_bad_refill_delay_is_refused_with_its_value(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "slurm_ft.launch.standby", "--python", sys.executable,
                          "--refill-after", "-1"], env=slot_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "refill_after_s must be >= 0, got -1.0" in bad.stderr


def test_a_rank_dies_with_its_standby_and_the_wrapper_records_the_kill(slot, tmp_path):
    env, proc = slot
    rank = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
    pid = int(rank.stdout.readline().split()[-1])
    proc.kill()  # the standby (the rank's relay to its wrapper) is gone
    assert rank.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    (end,) = read_ends(tmp_path / "run")
    assert (end.signal, end.started) == (signal.SIGKILL, "standby")


def test_other_commands_start_cold(slot, tmp_path):
    env, _ = slot
    done = wrapped(env, tmp_path, sys.executable, "-u", "rank.py", "4")
    out, err = done.communicate(timeout=30)
    assert done.returncode == 4 and "rank starts cold" in err and out.startswith("out 0")
    assert read_ends(tmp_path / "run")[0].started == "cold"


def test_without_a_standby_the_rank_starts_cold(tmp_path):
    env = slot_env(tmp_path, **{standby.ENV: sys.executable})
    done = wrapped(env, tmp_path, sys.executable, "rank.py", "5")
    out, err = done.communicate(timeout=30)
    assert done.returncode == 5 and "standby not reachable" in err and out.startswith("out 0")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to ask as another user")
def test_another_user_is_refused(slot):
    env, _ = slot
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process of another uid asks the job's standby to run code as the job's user
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(standby.slot_address(env))
                standby.send_message(conn, {"argv": [sys.executable, "x.py"], "env": {}, "cwd": "/"}, fds=(0, 1, 2))
                os.write(write, json.dumps(standby.recv_message(conn)[0]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        assert json.loads(fh.read()) == {"refused": "another user"}


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_the_wrapper_tells_nothing_to_a_standby_of_another_user(tmp_path):
    env = slot_env(tmp_path, SECRET_TOKEN="s3cret", **{standby.ENV: sys.executable})
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # another user squats the slot's address before the job's standby
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squat:
                squat.bind(standby.slot_address(env))
                squat.listen(1)
                os.write(ready_w, b"1")
                conn, _ = squat.accept()
                conn.settimeout(5)
                os.write(write, conn.recv(65536) or b"nothing")
        finally:
            os._exit(0)
    os.close(write)
    os.read(ready_r, 1)
    done = wrapped(env, tmp_path, sys.executable, "rank.py", "6")
    out, err = done.communicate(timeout=30)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as fh:
        assert fh.read() == b"nothing"
    assert done.returncode == 6 and "held by another user" in err and out.startswith("out 0")


@pytest.mark.parametrize("argv, expected", [
    (["/py", "train.py", "--lr", "1"], ("path", "train.py")),
    (["/py", "-m", "pkg.train", "-x"], ("module", "pkg.train")),
    (["/py", "-u", "train.py"], None),
    (["/py", "-m"], None),
    (["/other/py", "train.py"], None),
    (["/py"], None),
])
def test_which_commands_a_standby_runs(argv, expected):
    assert standby.script_of(argv, "/py") == expected


@pytest.mark.parametrize("message, why", [
    (None, "malformed request"),
    ({"argv": "py x", "env": {}, "cwd": "/"}, "argv must be"),
    ({"argv": ["/py", "x"], "env": {"A": 1}, "cwd": "/"}, "env must"),
    ({"argv": ["/py", "x"], "env": {}, "cwd": ""}, "cwd must"),
    ({"argv": ["bash", "x"], "env": {}, "cwd": "/"}, "not `/py SCRIPT`"),
])
def test_bad_requests_are_refused_with_the_reason(message, why):
    assert standby.parse_request(message, "/py").startswith(why)


FULLY_SHARD = textwrap.dedent("""\
    import sys, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    before = "torch._dynamo" in sys.modules
    fully_shard(nn.Linear(4, 4))
    print("dynamo", before, "torch._dynamo" in sys.modules, flush=True)
    """)


def test_a_warm_rank_finds_what_fsdp2_imports_on_first_use_already_imported(tmp_path):
    """FSDP2's first fully_shard imports torch._dynamo (3.7 s for 8 ranks starting on 2 cores): cold, the rank
    pays it; from a spare with the default preload it is already done."""
    (tmp_path / "shard.py").write_text(FULLY_SHARD)
    cold = subprocess.run([sys.executable, "shard.py", str(tmp_path / "pg-cold")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert "dynamo False True" in cold.stdout, cold.stderr
    env = slot_env(tmp_path)
    proc = start_standby(env, ",".join(standby.PRELOAD), stderr=subprocess.DEVNULL)
    env[standby.ENV] = sys.executable
    try:
        warm = wrapped(env, tmp_path, sys.executable, "shard.py", str(tmp_path / "pg-warm"))
        out, err = warm.communicate(timeout=120)
        assert warm.returncode == 0 and "rank starts cold" not in err, err
        assert "dynamo True True" in out
    finally:
        proc.kill()
        proc.wait()
