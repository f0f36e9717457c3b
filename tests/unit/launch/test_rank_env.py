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


# --- GPU binding and NCCL's fault settings --------------------------------------------------------------------
BIND_CASES = [  # (the step's CUDA_VISIBLE_DEVICES, local id, ranks on the node) -> the rank's
    (("0,1,2,3", 1, 4), "1"), (("0,1,2,3", 3, 4), "3"), (("0,1,2,3", 1, 2), "2,3"),
    (("GPU-a,GPU-b", 1, 2), "GPU-b"), (("4,5,6,7", 0, 4), "4"), (("0,1,2,3,4,5,6,7", 3, 4), "6,7"),
    (("3", 0, 1), None),            # Slurm bound the task already (--gpus-per-task)
    (("0,1", 1, 4), None),          # fewer GPUs than ranks: shared on purpose, left alone
    (("", 0, 2), None), (("NoDevFiles", 0, 2), None),
]


@pytest.mark.parametrize(("args", "want"), BIND_CASES)
def test_each_rank_gets_its_share_of_the_steps_gpus(args, want):
    from slurm_ft.launch.rank_env import bind_devices

    assert bind_devices(*args) == want


@pytest.mark.parametrize(("args", "want"), BIND_CASES)
def test_the_shell_line_binds_as_its_reference_does(args, want):
    visible, local_id, local_world = args
    wiring = wire(("python", "train.py"), nodes=1, ntasks_per_node=local_world, addr="n1", port=1)
    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", "SLURM_LOCALID": str(local_id), **wiring.env,
           **({"CUDA_VISIBLE_DEVICES": visible} if visible else {}), "_ft_o": "user's"}
    done = subprocess.run([*wiring.prefix, "sh", "-c", 'echo "${CUDA_VISIBLE_DEVICES-unset}|'
                                                      '${SLURM_FT_STEP_DEVICES-unset}|$LOCAL_RANK"'],
                          env=env, capture_output=True, text=True, check=True)
    got, step, local_rank = done.stdout.strip().split("|")
    assert got == (want if want is not None else visible or "unset") and local_rank == str(local_id)
    assert step == (visible if want is not None else "unset")  # the step's list, kept where it was narrowed


def test_the_binding_is_off_on_request_and_for_torchrun():
    plain = wire(("python", "train.py"), nodes=1, ntasks_per_node=2, addr="n1", port=1, gpu_bind=False)
    agent = wire(("torchrun", "--nproc-per-node=2", "train.py"), nodes=1, ntasks_per_node=1, addr="n1", port=1)
    for wiring in (plain, agent):
        assert "CUDA_VISIBLE_DEVICES" not in " ".join(wiring.prefix)


def test_nccl_fault_settings_fill_only_what_the_user_left_unset():
    from slurm_ft.launch.rank_env import FLIGHT_RECORDER_ENV, nccl_defaults

    assert nccl_defaults({}, hang_timeout_s=300) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                                                      "TORCH_NCCL_ENABLE_MONITORING": "1",
                                                      "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "150"}
    assert nccl_defaults({}, hang_timeout_s=4)["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "10"
    assert nccl_defaults({}, hang_timeout_s=3600)["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "480"
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" not in nccl_defaults({}, hang_timeout_s=0)  # no hang watch
    user = {"TORCH_NCCL_ENABLE_MONITORING": "0", "NCCL_ASYNC_ERROR_HANDLING": "0",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": ""}
    assert nccl_defaults(user, hang_timeout_s=300) == {}  # an older name, an empty value: still the user's
    assert not set(FLIGHT_RECORDER_ENV) & set(nccl_defaults({}, hang_timeout_s=300))
    assert "NCCL_SOCKET_IFNAME" not in nccl_defaults({}, hang_timeout_s=300)
