"""slurm_ft.train.gloo_exit: the exit hook that lets gloo's workers finish before the interpreter finalizes."""

from __future__ import annotations

import subprocess
import sys

from slurm_ft.train import gloo_exit


def test_install_registers_the_drain_once_per_process(monkeypatch):
    monkeypatch.setattr(gloo_exit, "_installed", [])
    registered = []
    assert gloo_exit.install(register=registered.append) is True
    assert gloo_exit.install(register=registered.append) is False
    assert registered == [gloo_exit.drain]


def test_drain_releases_the_gil_for_its_time(monkeypatch):
    slept = []
    monkeypatch.setattr(gloo_exit.time, "sleep", slept.append)
    gloo_exit.drain()
    assert slept == [gloo_exit.DRAIN_S] and gloo_exit.DRAIN_S > 0


MANAGER_SCRIPT = """
import sys, tempfile, torch, torch.distributed as dist
from slurm_ft.train import gloo_exit
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager
if sys.argv[1] == "distributed":
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
mgr = CheckpointManager(CheckpointConfig(dir=tempfile.mkdtemp()), model=torch.nn.Linear(2, 2))
mgr.close()
print("installed" if gloo_exit._installed else "not installed")
"""


def test_a_distributed_manager_installs_the_exit_drain_and_a_single_process_one_does_not():
    def run(mode: str) -> str:
        proc = subprocess.run([sys.executable, "-c", MANAGER_SCRIPT, mode], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert run("distributed") == "installed"
    assert run("alone") == "not installed"
