"""``slurm-ft demo`` and ``slurm-ft bench lab`` ended by SIGTERM take their lab down (``slurm_ft.lab.interrupt``):
no munged, slurmctld, slurmd, slurmstepd or job process of their lab directory is left, nor (their nodes hosts,
the lab's default) any namespace or interface of it, and they exit 128 + 15 with one line saying why.

Each runs as a real subprocess with a lab directory of its own (not the session's lab): the demo is signalled
once its jobs run, the benchmark while its lab is still coming up (slurmctld running, the nodes not yet ready).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.lab import hosts
from slurm_ft.lab.cluster import LabCluster, LabError, check_prerequisites

pytestmark = pytest.mark.lab


@pytest.fixture
def prerequisites() -> None:
    try:
        check_prerequisites()
    except LabError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"lab cluster required in CI but unavailable: {exc}", pytrace=False)
        pytest.skip(f"lab cluster unavailable: {exc}")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or a kernel thread
        return b""


def _open_files(pid: str) -> list[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


def lab_processes(lab_dir: Path) -> dict[int, str]:
    """pid -> command line of every process of ``lab_dir``: the daemons name it on their command line, the job's
    processes (and 22.05's slurmstepd) carry its ``SLURM_CONF``, 25.11's slurmstepd (its environment overwritten
    by its title) holds its slurmd's log open."""
    marker = f"{lab_dir}/"
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        conf = [v for v in _read(f"/proc/{pid}/environ").split(b"\0") if v.startswith(b"SLURM_CONF=")]
        if (marker.encode() in cmdline or any(marker.encode() in v for v in conf)
                or any(path.startswith(marker) for path in _open_files(pid))):
            found[int(pid)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def lab_network(lab_dir: Path) -> list[str]:
    """The namespaces and interfaces of ``lab_dir``'s hosts that exist (found by its tag in their names)."""
    tag = hosts.lab_tag(lab_dir)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [name for name in hosts.link_names(links) + hosts.netns_names(spaces) if tag in name]


def wait_for(what: str, predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.1)


def running(lab_dir: Path, text: str) -> bool:
    return any(text in cmd for cmd in lab_processes(lab_dir).values())


CASES = {  # the arguments, and what runs in the lab when SIGTERM comes
    "demo, its jobs running": (["demo", "--scenarios", "kill-rank", "--steps", "16"], "slurm_ft.cli launch"),
    "bench lab, its lab coming up": (["bench", "lab", "--phases", "throughput", "--nodes", "1", "--models", "small",
                                      "--steps", "24", "--out", "{out}"], "slurmctld -D"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sigterm_ends_the_run_and_takes_its_lab_down(case, prerequisites, tmp_path):
    argv, ready = CASES[case]
    work = tmp_path / "run"
    lab_dir = work / "lab"  # where the demo and the benchmark put their lab
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    out, err = (tmp_path / "stdout").open("wb"), (tmp_path / "stderr").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_ft.cli", *argv, "--dir", str(work)], stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL)
    try:
        wait_for(f"{ready} of {lab_dir}", lambda: running(lab_dir, ready), proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        left = lab_processes(lab_dir)
        deadline = time.monotonic() + 5  # a process killed at the end may take a moment to leave /proc
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = lab_processes(lab_dir)
        said = (tmp_path / "stderr").read_text(errors="replace")
        assert code == 128 + signal.SIGTERM, said[-2000:]
        assert left == {}, f"left running: {left}"
        assert lab_network(lab_dir) == []
        assert f"slurm-ft: {argv[0]}{' lab' if argv[0] == 'bench' else ''} ended by SIGTERM" in said
        assert "Traceback" not in said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if lab_dir.exists():  # the old behaviour: take down what it left, for the tests after this one
            LabCluster.attach(lab_dir).down()
        out.close()
        err.close()


def test_down_stops_a_daemon_the_state_never_recorded(prerequisites, tmp_path):
    """A SIGTERM right after slurmctld was spawned, before the lab wrote it down, left it running (1 run in 4 of
    the bench case above): ``down`` also stops this lab's daemons by their arguments, and no other lab's."""
    from slurm_ft.lab.cluster import LabConfig

    def fake_ctld(lab_dir: Path) -> subprocess.Popen:
        argv = ["slurmctld", "-c", "import time; time.sleep(120)", "-D", "-f", f"{lab_dir}/slurm.conf"]
        return subprocess.Popen(argv, executable=sys.executable)

    mine, other = fake_ctld(tmp_path / "lab"), fake_ctld(tmp_path / "lab2")
    try:
        LabCluster(LabConfig(dir=tmp_path / "lab")).down()
        assert mine.wait(timeout=10) is not None
        assert other.poll() is None  # another lab's daemon, whose dir only starts like this one's
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
