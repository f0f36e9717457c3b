"""Warm standby ranks (slurm_ft.launch.standby) with the real per-rank wrapper: real processes, sockets and signals."""

from __future__ import annotations

import json
import os
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
from tests import uids

RANK_SCRIPT = textwrap.dedent("""\
    import os, sys, time
    with open(f"ran.{os.getpid()}", "w") as fh:  # every process that ever ran this rank leaves its mark
        fh.write(f"{os.getuid()} {os.environ['RANK']} {os.environ.get('SECRET', '')}")
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
    """A wrapper's environment for slot (a fresh key, n1, 0), rank 0, with ``rank.py`` in ``tmp_path``."""
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    return {**os.environ, standby.KEY_ENV: uuid.uuid4().hex, "SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0",
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
    """The children of every thread of ``pid``."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            found += [int(p) for p in fh.read().split()]
    return found


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


def ran(folder: Path) -> list[str]:
    """The marks of every process that ran the rank script in ``folder``."""
    return sorted(p.name for p in folder.glob("ran.*"))


def zombies(pid: int) -> list[int]:
    """``pid``'s children that ended and were never reaped."""
    return [child for child in children(pid) if _state(child) == "Z"]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def raw_request(env, tmp_path, *, deadline_in: float = 5.0) -> socket.socket:
    """A request for ``rank.py 0`` as a wrapper sends it (our uid), with /dev/null as stdio; the open connection."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(standby.slot_address(env))
    fd = os.open(os.devnull, os.O_RDWR)
    try:
        standby.send_message(conn, {"argv": [sys.executable, "rank.py", "0"], "env": env, "cwd": str(tmp_path),
                                    "deadline": time.monotonic() + deadline_in}, fds=(fd, fd, fd))
    finally:
        os.close(fd)
    return conn


def reply_of(conn: socket.socket) -> dict | None:
    conn.settimeout(30)
    return standby.Channel(conn).recv()[0]


@pytest.mark.parametrize("gone", ["at once", "after the pid", "silent", "late"])
def test_a_request_whose_wrapper_has_gone_never_starts_a_rank(slot, tmp_path, gone):
    """A wrapper that left (or never says go, or asks past its deadline) gets no rank: the spare that took its
    request is killed and reaped, and the next wrapper is served warm."""
    env, proc = slot
    conn = raw_request(env, tmp_path, deadline_in=-1.0 if gone == "late" else 1.0)
    if gone == "at once":
        conn.close()
    elif gone == "after the pid":
        assert isinstance(reply_of(conn).get("pid"), int)
        conn.close()
    elif gone == "silent":  # connected, never says go: given up at the deadline and the grace after it
        assert isinstance(reply_of(conn).get("pid"), int)
        assert reply_of(conn) is None  # then the keeper hung up
    else:
        assert reply_of(conn) == {"refused": "too late: the request's deadline has passed"}
    time.sleep(standby.GO_GRACE_S + 1.5)  # past the request's deadline and the grace for its go
    assert ran(tmp_path) == [] and zombies(proc.pid) == []
    done = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
    _, err = done.communicate(timeout=30)
    assert done.returncode == 0 and "rank starts cold" not in err, err
    assert len(ran(tmp_path)) == 1 and read_ends(tmp_path / "run")[0].started == "standby"
    assert zombies(proc.pid) == [] and proc.poll() is None


def test_a_slow_request_holds_up_no_other(slot, tmp_path):
    """A peer of our own uid that trickles its request is read on a thread of its own, up to its deadline."""
    env, proc = slot
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.connect(standby.slot_address(env))
        slow.send(b"{")
        started = time.monotonic()
        done = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
        while done.poll() is None and time.monotonic() - started < 1.5:  # trickling while the wrapper is served
            time.sleep(0.25)
            slow.send(b" ")
        _, err = done.communicate(timeout=30)
        assert done.returncode == 0 and "rank starts cold" not in err, err  # served within its deadline
        slow.settimeout(30)
        assert slow.recv(100) == b""  # the keeper gave up on it at its deadline
    assert proc.poll() is None


def test_a_request_for_a_busy_slot_is_refused_at_once_and_the_rank_starts_cold(slot, tmp_path):
    env, proc = slot
    first = wrapped(env, tmp_path, sys.executable, "rank.py", "sleep")
    assert first.stdout.readline().startswith("out 0")
    second = wrapped(env, tmp_path, sys.executable, "rank.py", "7")
    _, err = second.communicate(timeout=30)
    assert second.returncode == 7 and "rank starts cold: standby refused: busy" in err
    assert first.poll() is None  # it did not wait for the rank the slot serves, nor touch it
    started = time.monotonic()
    with raw_request(env, tmp_path, deadline_in=30.0) as conn:  # a long deadline: the keeper still answers now
        assert reply_of(conn) == {"refused": "busy: the slot still serves a rank"}
    assert time.monotonic() - started < 10.0
    first.kill()
    first.wait()


def test_a_keeper_that_never_answers_costs_the_wrapper_seconds_not_minutes(tmp_path):
    """A keeper stuck elsewhere (a previous rank in D state, once the review's 120 s): the wrapper gives up at its
    deadline and starts the rank cold."""
    env = slot_env(tmp_path, **{standby.ENV: sys.executable})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stuck:
        stuck.bind(standby.slot_address(env))
        stuck.listen(8)  # accepts into the backlog, never answers
        started = time.monotonic()
        done = wrapped(env, tmp_path, sys.executable, "rank.py", "0")
        assert done.wait(timeout=60) == 0
        took = time.monotonic() - started
    _, err = done.communicate(timeout=30)  # its stdio went out with the request: closed with the listener
    assert "rank starts cold: standby not reachable (timed out" in err
    assert standby.READY_TIMEOUT_S <= 10 and took < standby.READY_TIMEOUT_S + 10


TRICKLE = textwrap.dedent("""\
    import json, socket, sys, time
    where, seconds, count = bytes.fromhex(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    conns, result = [], {"connected": 0, "sent": 0, "cut_after_s": []}
    start = time.monotonic()
    for _ in range(count):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(where)
        result["connected"] += 1
        conns.append(c)
    open_ = list(conns)
    while open_ and time.monotonic() - start < seconds:
        for c in list(open_):
            try:
                c.send(b" ")  # one byte, no newline: the request never ends
                result["sent"] += 1
            except OSError:
                result["cut_after_s"].append(round(time.monotonic() - start, 2))
                open_.remove(c)
        time.sleep(0.3)
    print(json.dumps(result), flush=True)
    """)


def victim_slot(users, scratch, **extra: str) -> tuple[dict[str, str], subprocess.Popen]:
    """A standby of the victim's (the system python, preloading json) and the environment its wrappers get."""
    victim = users["victim"]
    (scratch / "rank.py").write_text(RANK_SCRIPT)
    env = victim.env(**{standby.KEY_ENV: uuid.uuid4().hex, "SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0",
                        "RANK": "3", "SECRET": "hunter2", "SLURM_FT_RUN_DIR": str(scratch / "run")}, **extra)
    proc = victim.popen([uids.SYSTEM_PYTHON, "-m", "slurm_ft.launch.standby", "--python", uids.SYSTEM_PYTHON,
                         "--preload", "json"], env, cwd=scratch, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _bound(standby.slot_address(env)):
        time.sleep(0.05)
    return {**env, standby.ENV: uids.SYSTEM_PYTHON}, proc


def test_another_uid_trickling_into_the_standby_delays_nothing_and_exactly_one_rank_runs(users, scratch):
    """The review's finding 1: another uid holds connections to the slot's keeper, a byte every 0.3 s. Its
    connections are closed unread at accept; the victim's restarted rank starts warm within the request's deadline,
    and when the attacker lets go nothing else starts: one copy of the rank, ever."""
    env, keeper = victim_slot(users, scratch)
    attacker = users["attacker"]
    trickle = attacker.popen([uids.SYSTEM_PYTHON, "-c", TRICKLE, standby.slot_address(env).hex(), "8", "8"],
                             attacker.env(), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        started = time.monotonic()
        wrapper = users["victim"].popen([uids.SYSTEM_PYTHON, "-m", "slurm_ft.launch.rank", "--", uids.SYSTEM_PYTHON,
                                         "rank.py", "0"], env, cwd=scratch, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        first = wrapper.stdout.readline()
        took = time.monotonic() - started
        out, err = wrapper.communicate(timeout=30)
        assert first.startswith("out 3") and wrapper.returncode == 0, err
        assert took < 15.0  # the bound; warm, so the keeper answered within the request's deadline:
        assert "rank starts cold" not in err and read_ends(scratch / "run")[0].started == "standby"
        attack = json.loads(trickle.communicate(timeout=30)[0])
        assert attack["connected"] == 8 and len(attack["cut_after_s"]) == 8  # every connection closed on it
        assert max(attack["cut_after_s"]) < 2.0  # at once, not after reading a request
        time.sleep(2.0)  # the attacker let go: a stale request would be served now
        marks = ran(scratch)
        assert len(marks) == 1, marks
        assert (scratch / marks[0]).read_text() == f"{users['victim'].uid} 3 hunter2"
        assert keeper.poll() is None and zombies(keeper.pid) == []
    finally:
        for proc in (trickle, keeper):
            proc.kill()
            proc.wait()


FORGED_REQUEST = textwrap.dedent("""\
    import json, os, socket, sys, time
    where, script = bytes.fromhex(sys.argv[1]), sys.argv[2]
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(where)
    time.sleep(0.5)  # the keeper has decided by now
    data = json.dumps({"argv": [sys.executable, script], "env": dict(os.environ), "cwd": "/",
                       "deadline": time.monotonic() + 5}).encode() + b"\\n"
    try:
        socket.send_fds(c, [data[:1]], [0, 1, 2])
        c.sendall(data[1:])
        c.settimeout(10)
        print(repr(c.recv(4096)))
    except OSError as exc:
        print(type(exc).__name__)
    """)


def test_another_uids_request_is_closed_unread_and_runs_nothing(users, scratch):
    env, keeper = victim_slot(users, scratch)
    attacker = users["attacker"]
    try:
        forged = attacker.popen([uids.SYSTEM_PYTHON, "-c", FORGED_REQUEST, standby.slot_address(env).hex(),
                                 str(scratch / "rank.py")], attacker.env(), stdout=subprocess.PIPE, text=True)
        out, _ = forged.communicate(timeout=30)
        assert out.strip() in ("b''", "BrokenPipeError", "ConnectionResetError")  # no answer: it was never read
        time.sleep(1.0)
        assert ran(scratch) == [] and keeper.poll() is None
    finally:
        keeper.kill()
        keeper.wait()


SQUAT = textwrap.dedent("""\
    import socket, sys
    where = bytes.fromhex(sys.argv[1])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squat:
        squat.bind(where)
        squat.listen(1)
        print("bound", flush=True)
        conn, _ = squat.accept()
        conn.settimeout(5)
        try:
            got = conn.recv(65536)
        except OSError:
            got = b""
        print(len(got), flush=True)
    """)


def test_a_name_squatted_by_another_uid_is_never_used_and_costs_a_cold_start(users, tmp_path):
    """Another uid binds the slot's name first (here it was told the key; it cannot guess one): the wrapper sends
    it nothing and starts the rank cold, and the job's keeper says it cannot listen."""
    env = slot_env(tmp_path, SECRET="hunter2", **{standby.ENV: sys.executable})
    attacker = users["attacker"]
    squat = attacker.popen([uids.SYSTEM_PYTHON, "-c", SQUAT, standby.slot_address(env).hex()], attacker.env(),
                           stdout=subprocess.PIPE, text=True)
    try:
        assert squat.stdout.readline() == "bound\n"
        keeper = subprocess.run([sys.executable, "-m", "slurm_ft.launch.standby", "--python", sys.executable,
                                 "--preload", "json"], env=env, capture_output=True, text=True, timeout=30)
        assert keeper.returncode == 1 and "cannot listen" in keeper.stderr
        started = time.monotonic()
        done = wrapped(env, tmp_path, sys.executable, "rank.py", "6")
        out, err = done.communicate(timeout=30)
        assert done.returncode == 6 and "held by another user" in err and out.startswith("out 0")
        assert time.monotonic() - started < standby.ASK_TIMEOUT_S + 10  # a cold start, no more
        assert squat.communicate(timeout=30)[0].strip() == "0"  # it got not one byte
        assert read_ends(tmp_path / "run")[0].started == "cold"
    finally:
        squat.kill()
        squat.wait()


def test_a_slot_has_no_address_without_the_launchers_key_and_the_key_is_in_the_name():
    key = uuid.uuid4().hex
    slot = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_LOCALID": "0"}
    assert standby.slot_address(slot) is None  # job, node and slot alone are guessable: no standby
    assert standby.slot_address({**slot, standby.KEY_ENV: "short"}) is None
    assert standby.slot_address({**slot, standby.KEY_ENV: "../" + key}) is None
    where = standby.slot_address({**slot, standby.KEY_ENV: key})
    assert where == f"\0slurm-ft-standby/{key}/n1/0".encode() and b"4242" not in where


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
