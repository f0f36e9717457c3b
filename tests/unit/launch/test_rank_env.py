"""The torch.distributed variables every rank gets, and torchrun under the launcher (slurm_ft.launch.rank_env)."""

from __future__ import annotations

import subprocess

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.launch.rank_env import check_torchrun, is_torchrun, torchrun_options, wire


def test_every_rank_gets_rank_world_size_local_rank_and_the_rendezvous():
    wiring = wire(("python", "train.py"), nodes=2, ntasks_per_node=4, addr="10.0.0.1", port=29512)
    assert wiring.env == {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
                          "MASTER_PORT": "29512"}
    assert wiring.tasks_per_node == wiring.ranks_per_node == 4
    # the per-rank line, run for real as srun's task 5 (local task 1) would run it
    done = subprocess.run([*wiring.prefix, "sh", "-c", 'echo "$RANK $LOCAL_RANK $WORLD_SIZE"'],
                          env={"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "WORLD_SIZE": "8", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["5", "1", "8"]


def test_torchrun_as_users_write_it_is_wired_per_node():
    command = ("torchrun", "--nproc_per_node", "2", "train.py", "--lr", "0.1")
    wiring = wire(command, nodes=3, ntasks_per_node=1, addr="n1", port=29600)
    assert wiring.tasks_per_node == 1 and wiring.ranks_per_node == 2
    assert wiring.env["PET_NNODES"] == "3" and wiring.env["PET_MASTER_ADDR"] == "n1"
    assert wiring.env["PET_MASTER_PORT"] == "29600" and "SIGUSR1" in wiring.env["PET_SIGNALS_TO_HANDLE"]
    done = subprocess.run([*wiring.prefix, "sh", "-c", 'echo "$PET_NODE_RANK"'],
                          env={"SLURM_PROCID": "2", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "2"  # one torchrun per node: the task id is the node rank


def test_torchrun_is_recognised_in_its_forms():
    assert is_torchrun(("/opt/venv/bin/torchrun", "x.py"))
    assert is_torchrun(("python3", "-m", "torch.distributed.run", "x.py"))
    assert not is_torchrun(("python", "-m", "torch_stuff", "x.py")) and not is_torchrun(())
    assert torchrun_options(("torchrun", "--nnodes=2", "--standalone", "-m", "pkg.train", "--nnodes", "9")) == {
        "--nnodes": "2", "--standalone": "", "-m": ""}  # the module's own --nnodes is not torchrun's


@pytest.mark.parametrize(("command", "nodes", "message"), [
    (("torchrun", "--nnodes=2", "--nproc-per-node=1", "train.py"), 3,
     "launch: torchrun --nnodes=2, but the attempt runs on 3 node(s); "
     "use: slurm-ft launch -- torchrun --nnodes=3 --nproc-per-node=1 train.py"),
    (("torchrun", "--standalone", "--nproc_per_node=4", "train.py"), 2,
     "launch: torchrun --standalone runs each of the 2 nodes alone; "
     "use: slurm-ft launch -- torchrun --nnodes=2 --nproc-per-node=4 train.py"),
    (("torchrun", "--nnodes=2", "--rdzv-endpoint=localhost:29500", "train.py"), 2,
     "launch: torchrun --rdzv-endpoint=localhost:29500: slurm-ft launch sets the rendezvous endpoint of every node "
     "and attempt itself; use: slurm-ft launch -- torchrun --nnodes=2 --nproc-per-node=1 train.py"),
    (("torchrun", "--master_port", "29500", "train.py"), 2,
     "launch: torchrun --master-port=29500: slurm-ft launch sets the port of every node and attempt itself; "
     "use: slurm-ft launch -- torchrun --nnodes=2 --nproc-per-node=1 train.py"),
])
def test_torchrun_that_cannot_work_is_refused_with_the_command_that_works(command, nodes, message):
    with pytest.raises(ConfigError) as info:
        check_torchrun(command, nodes=nodes, ntasks_per_node=1)
    assert str(info.value) == message


def test_torchrun_with_several_tasks_per_node_is_refused_and_ranges_fit():
    with pytest.raises(ConfigError, match="--ntasks-per-node=4 with torchrun"):
        check_torchrun(("torchrun", "--nproc-per-node=4", "t.py"), nodes=2, ntasks_per_node=4)
    assert check_torchrun(("torchrun", "--nnodes=1:4", "--nproc-per-node=8", "t.py"), nodes=2, ntasks_per_node=1) == 8
    assert check_torchrun(("torchrun", "--nproc-per-node=gpu", "t.py"), nodes=2, ntasks_per_node=1) == 1
