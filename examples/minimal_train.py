"""A complete fault-tolerant trainer; job script line: exec slurm-ft launch -- python minimal_train.py"""
import os

import torch
import torch.distributed as dist

from slurm_ft.train import CheckpointConfig, CheckpointManager, HeartbeatWriter, record_errors

STEPS = int(os.environ.get("STEPS", "100"))


def main() -> None:
    rank, run_dir = int(os.environ["RANK"]), os.environ["SLURM_FT_RUN_DIR"]  # both set by slurm-ft launch
    with record_errors(run_dir, rank) as tracker:  # a rank that dies leaves its error for the verdict
        dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ckpt = CheckpointManager(CheckpointConfig.from_env(), model=model, optimizer=opt)  # --ft-ckpt-dir/-every
        ckpt.install_signal_handlers()  # SIGUSR1/SIGTERM: save at once, then stop
        heart = HeartbeatWriter(run_dir, rank)  # no beat for --ft-hang-timeout seconds = a hang
        step = ckpt.resume()  # the newest committed step (0 on a fresh start); RNG state included
        while step < STEPS and not ckpt.exit_requested:
            tracker.step = step + 1
            x = torch.randn(64, 32)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            heart.beat(step)
            ckpt.maybe_save(step)  # every rank, every step: saves when due, asynchronously
        ckpt.close()  # waits for the save in flight; raises if the run's last save failed
        if rank == 0:
            print(f"done at step {step}, weights {sum(p.sum().item() for p in model.parameters()):.6f}", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
