"""The memory tier end to end: real example-trainer ranks over gloo, a rank SIGKILLed mid-run, restarts from the
job's memory directory (here under tmp, as SLURM_FT_MEM_ROOT allows) or, when anything is wrong with it, from disk.

One crashed run is shared: each test restarts from its own copy of the crashed run's checkpoint and memory dirs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ft.core import layout, shmdir
from slurm_ft.core.rundir import EVENTS_FILE, RUN_SUBDIR
from slurm_ft.train import example, memtier
from slurm_ft.train.checkpoint import memory_alloc

pytestmark = pytest.mark.gloo
STEPS = 8
RUN_ID = "memtier-test"
COMMON = ("--steps", str(STEPS), "--ckpt-every", "3", "--step-time", "0.1", "--mem-every", "1", "--hidden", "16")


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_FT_", "SLURM_JOB_ID", "SLURM_RESTART"))}
    env.update({"OMP_NUM_THREADS": "1", "SLURM_FT_RUN_ID": RUN_ID, "SLURM_FT_MEM_ROOT": str(root / "shm")})
    return env


def _run(root: Path, nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    trainer = ["-m", "slurm_ft.train.example", "--ckpt-dir", str(root / "ck"), *COMMON, *args]
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launch, *trainer]
    proc = subprocess.run(cmd, env=_env(root), capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} -> {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


def _run_in_process(root: Path, monkeypatch, capsys, *args: str, env: dict[str, str] | None = None) -> dict:
    """One rank, restarted in this process (no interpreter start-up): the tier works without torch.distributed."""
    for key in [k for k in os.environ if k.startswith(("SLURM_FT_", "SLURM_JOB_ID", "SLURM_RESTART"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_FT_RUN_ID", RUN_ID)
    monkeypatch.setenv("SLURM_FT_MEM_ROOT", str(root / "shm"))
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert example.main(["--ckpt-dir", str(root / "ck"), *COMMON, *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _result(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _resume_events(root: Path) -> list[dict]:
    lines = (root / "ck" / RUN_SUBDIR / EVENTS_FILE).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "resume"]


def _mem_dir(root: Path) -> Path:
    return root / "shm" / shmdir.dir_name(RUN_ID)


def _crashed(root: Path, nproc: int, rank: int) -> int:
    """Run until ``rank`` is SIGKILLed at step 7; the newest step with a commit marker."""
    (root / "shm").mkdir()
    crashed = _run(root, nproc, "--crash-at", f"{rank}:7", check=False)
    assert crashed.returncode != 0
    marked = [p.step for n in memtier.names(_mem_dir(root)) if (p := memtier.parse_name(n)) and p.kind == "commit"]
    assert marked, (memtier.names(_mem_dir(root)), crashed.stderr[-2000:])
    return max(marked)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two ranks: (the clean run's result, the crashed run's root, the newest step with a commit marker)."""
    clean = _result(_run(tmp_path_factory.mktemp("clean"), 2))
    root = tmp_path_factory.mktemp("crashed")
    return clean, root, _crashed(root, 2, 1)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One rank, as ``runs``; the clean run's parameters from a subprocess too (the same interpreter state)."""
    clean = _result(_run(tmp_path_factory.mktemp("clean1"), 1))
    root = tmp_path_factory.mktemp("crashed1")
    return clean, root, _crashed(root, 1, 0)


def _copy(root: Path, tmp_path: Path) -> Path:
    shutil.copytree(root, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


def test_a_killed_rank_restarts_from_memory_bitwise_equal(runs, tmp_path):
    clean, crashed, newest = runs
    root = _copy(crashed, tmp_path)
    disk = layout.committed_steps(root / "ck")[-1]
    resumed = _result(_run(root, 2))
    assert (resumed["resumed_from"], resumed["resume_source"]) == (newest, "memory")
    assert newest > disk  # memory holds a newer step than disk: fewer steps replayed
    assert resumed["param_sha256"] == clean["param_sha256"] and resumed["data_position"] == STEPS
    event = _resume_events(root)[-1]
    assert (event["source"], event["step"], event["disk_step"]) == ("memory", newest, disk)
    assert not _mem_dir(root).exists()  # a run that ends takes its memory files with it


def test_a_flipped_byte_falls_back_to_disk_and_says_so(single, tmp_path, monkeypatch, capsys):
    clean, crashed, newest = single
    root = _copy(crashed, tmp_path)
    snap = _mem_dir(root) / memtier.snap_name(newest, 0)
    data = bytearray(snap.read_bytes())
    data[-100] ^= 0x01
    snap.write_bytes(bytes(data))
    resumed = _run_in_process(root, monkeypatch, capsys)
    disk = layout.committed_steps(crashed / "ck")[-1]
    assert (resumed["resumed_from"], resumed["resume_source"]) == (disk, "disk")
    assert resumed["param_sha256"] == clean["param_sha256"]
    event = _resume_events(root)[-1]
    assert event["source"] == "disk" and "digest mismatch" in event["why"] and "rank_00000" in event["why"]


def test_a_torn_snapshot_is_never_used(single, tmp_path, monkeypatch, capsys):
    clean, crashed, newest = single
    root = _copy(crashed, tmp_path)
    snap = _mem_dir(root) / memtier.snap_name(newest, 0)
    snap.write_bytes(snap.read_bytes()[:-50])  # cut short by a crash mid-copy (the rename makes this unlikely)
    resumed = _run_in_process(root, monkeypatch, capsys)
    assert resumed["resume_source"] == "disk" and resumed["resumed_from"] < newest
    assert resumed["param_sha256"] == clean["param_sha256"]
    assert "torn" in _resume_events(root)[-1]["why"]


def test_a_snapshot_without_a_commit_marker_is_never_used(single, tmp_path, monkeypatch, capsys):
    _clean, crashed, newest = single
    root = _copy(crashed, tmp_path)
    (_mem_dir(root) / memtier.commit_name(newest, 0)).unlink()
    resumed = _run_in_process(root, monkeypatch, capsys)
    assert resumed["resume_source"] == "disk"
    assert f"step {newest}: no commit marker" in _resume_events(root)[-1]["why"]


def test_after_a_requeue_the_run_resumes_from_disk(single, tmp_path, monkeypatch, capsys):
    """A requeued job keeps its id but gets a new allocation (Slurm's SLURM_RESTART_COUNT): its memory is not
    this allocation's, even where the same node's /dev/shm still holds it."""
    clean, crashed, newest = single
    root = _copy(crashed, tmp_path)
    resumed = _run_in_process(root, monkeypatch, capsys, env={"SLURM_RESTART_COUNT": "1"})
    assert resumed["resume_source"] == "disk" and resumed["resumed_from"] < newest
    assert resumed["param_sha256"] == clean["param_sha256"]


def test_a_refused_snapshot_leaves_a_fresh_run_as_it_was(single, tmp_path, monkeypatch, capsys):
    """Seen in the lab: a snapshot of another job (another model) in the run's memory dir, no disk checkpoint.
    Checking it read the live state (get_state_dict), which gave the fresh optimizer its state with a zero-grad
    step; the run then trained from scratch with a step count one ahead and ended with other parameters."""
    _clean, crashed, _newest = single
    root = _copy(crashed, tmp_path)
    shutil.rmtree(root / "ck")  # nothing on disk: the run starts from scratch
    resumed = _run_in_process(root, monkeypatch, capsys, "--hidden", "24")
    assert (resumed["resumed_from"], resumed["resume_source"]) == (0, "disk")
    assert "(16, 16) torch.float32 in the snapshot" in _resume_events(root)[-1]["why"]
    fresh = _run_in_process(tmp_path / "fresh", monkeypatch, capsys, "--hidden", "24")
    assert resumed["param_sha256"] == fresh["param_sha256"]


def test_snapshots_of_another_launch_are_never_used(single, tmp_path, monkeypatch, capsys):
    """Two jobs with one id on one node's /dev/shm (two clusters, ids reused): the launch id in the tag parts
    them, whatever the shapes."""
    clean, crashed, newest = single
    root = _copy(crashed, tmp_path)
    resumed = _run_in_process(root, monkeypatch, capsys, env={"SLURM_FT_LAUNCH_ID": "another"})
    assert resumed["resume_source"] == "disk" and resumed["resumed_from"] < newest
    assert resumed["param_sha256"] == clean["param_sha256"]


@pytest.mark.slow
def test_a_changed_world_size_resumes_from_disk(runs, tmp_path):
    _clean, crashed, _newest = runs
    root = _copy(crashed, tmp_path)
    resumed = _result(_run(root, 3, "--steps", "6"))
    assert resumed["resume_source"] == "disk" and resumed["resharded_from"] == 2
    assert "world size changed" in _resume_events(root)[-1]["why"]


# ---- peer copies: two "nodes", each rank with its own node name and its own memory root (its node's /dev/shm) ----
def _spawn(root: Path, nodes: list[str], *args: str, kill_rest_when: int | None = None) -> list[tuple[int, str]]:
    """One process per rank, rank r on node ``nodes[r]`` (SLURMD_NODENAME, memory root ``root/shm-<node>``), by hand
    as srun would start them; ``kill_rest_when``: once this rank has died, SIGKILL the others (a node lost)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, node in enumerate(nodes):
        (root / f"shm-{node}").mkdir(exist_ok=True)
        env = {**_env(root), "SLURM_FT_MEM_ROOT": str(root / f"shm-{node}"), "SLURMD_NODENAME": node,
               "RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        cmd = [sys.executable, "-m", "slurm_ft.train.example", "--ckpt-dir", str(root / "ck"), *COMMON, *args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    if kill_rest_when is not None:
        procs[kill_rest_when].wait(timeout=120)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(proc.wait(timeout=120), proc.communicate()[0]) for proc in procs]


def _node_dir(root: Path, node: str) -> Path:
    return root / f"shm-{node}" / shmdir.dir_name(RUN_ID)


@pytest.fixture(scope="module")
def two_nodes(runs, tmp_path_factory):
    """Ranks 0 and 1 on nodes a and b, rank 1 SIGKILLed at step 7 and rank 0 with it: (clean result, root,
    newest step whose marker says the peer copies were complete)."""
    clean = runs[0]
    root = tmp_path_factory.mktemp("nodes")
    _spawn(root, ["a", "b"], "--crash-at", "1:7", kill_rest_when=1)
    peered = [p.step for n in memtier.names(_node_dir(root, "a")) if (p := memtier.parse_name(n)) and p.kind == "peer"]
    assert peered, memtier.names(_node_dir(root, "a"))
    return clean, root, max(peered)


def test_a_swapped_in_node_s_rank_restores_from_its_peer_copy(two_nodes, tmp_path):
    clean, crashed, _peered = two_nodes
    root = _copy(crashed, tmp_path)
    marked = [s for (s, _epoch), peers in memtier.inventory(_node_dir(root, "a"), 0, [0], world_size=2,
                                                                alloc=memory_alloc({}))
              .markers.items() if peers]
    (rc0, out), (rc1, _) = _spawn(root, ["a", "c"])  # node b is gone: rank 1 runs on a fresh node c
    assert rc0 == rc1 == 0
    resumed = json.loads(out.strip().splitlines()[-1])
    assert (resumed["resume_source"], resumed["resumed_from"]) == ("peer", max(marked))
    assert resumed["param_sha256"] == clean["param_sha256"]
    assert _resume_events(root)[-1]["source"] == "peer"


def test_a_flipped_byte_in_a_peer_copy_falls_back_to_disk(two_nodes, tmp_path):
    clean, crashed, peered = two_nodes
    root = _copy(crashed, tmp_path)
    for name in memtier.names(_node_dir(root, "a")):
        parsed = memtier.parse_name(name)
        if parsed and parsed.kind == "peer":
            path = _node_dir(root, "a") / name
            data = bytearray(path.read_bytes())
            data[-7] ^= 0x10
            path.write_bytes(bytes(data))
    (rc0, out), (rc1, _) = _spawn(root, ["a", "c"])
    assert rc0 == rc1 == 0
    resumed = json.loads(out.strip().splitlines()[-1])
    assert resumed["resume_source"] == "disk" and resumed["param_sha256"] == clean["param_sha256"]
    event = _resume_events(root)[-1]
    assert event["source"] == "disk" and "digest mismatch" in event["why"]


def test_memory_pressure_steps_the_tier_back_and_training_goes_on(tiny_tmpfs, tmp_path, monkeypatch, capsys):
    """A ~0.85 MB snapshot on a 2 MB tmpfs: the first fits, the second would leave less than its size free."""
    root = tmp_path / "run"
    root.mkdir()
    monkeypatch.setenv("SLURM_FT_MEM_ROOT", str(tiny_tmpfs))  # read after _run_in_process's own setting
    for key in [k for k in os.environ if k.startswith(("SLURM_JOB_ID", "SLURM_RESTART"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_FT_RUN_ID", RUN_ID)
    capsys.readouterr()
    assert example.main(["--ckpt-dir", str(root / "ck"), *COMMON, "--hidden", "256", "--steps", "4"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 4 and result["checkpoint"]["memory"]["enabled"] is False
    events = [json.loads(line) for line in (root / "ck" / RUN_SUBDIR / EVENTS_FILE).read_text().splitlines()]
    back = [e for e in events if e["event"] == "mem_step_back"]
    assert back and "memory pressure" in back[0]["why"] and back[0]["now"] == "memory tier off"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a dir of another uid")
def test_another_users_dir_of_the_same_name_turns_the_tier_off_and_training_goes_on(tmp_path, monkeypatch,
                                                                                    capsys):
    """/dev/shm is world-writable: another user may make the job's dir name first. It is never used."""
    root = tmp_path / "run"
    (root / "shm").mkdir(parents=True)
    os.chmod(root / "shm", 0o1777)
    planted = _mem_dir(root)
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)  # nobody's
    result = _run_in_process(root, monkeypatch, capsys, "--steps", "3")
    assert result["step"] == 3 and result["checkpoint"]["memory"] is None
    assert os.listdir(planted) == []  # nothing written into it
    events = [json.loads(line) for line in (root / "ck" / RUN_SUBDIR / EVENTS_FILE).read_text().splitlines()]
    [back] = [e for e in events if e["event"] == "mem_step_back"]
    assert "owned by uid 65534" in back["why"] and back["now"] == "memory tier off"
