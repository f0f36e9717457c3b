"""Training-side fault tolerance: checkpoint manager, resume, topology check, heartbeat, error files.

A plain PyTorch loop adopts it in a few lines (see ``slurm_ft.train.example`` for a complete trainer)::

    from slurm_ft.train import CheckpointConfig, CheckpointManager, HeartbeatWriter, record_errors, revalidate

    with record_errors(run_dir, rank) as tracker:          # error.rank<R>.json if the rank dies of an exception
        dist.init_process_group(...)
        revalidate(ckpt_dir=cfg.dir)                        # topology vs allocation, before the first step
        mgr = CheckpointManager(CheckpointConfig.from_env(), model=model, optimizer=opt,
                                lr_scheduler=sched, dataloader_state=sampler)
        mgr.install_signal_handlers()                       # SIGUSR1/SIGTERM: emergency save, then exit
        heart = HeartbeatWriter(run_dir, rank)
        step = mgr.resume()                                 # newest committed (or SLURM_FT_RESUME_STEP); 0 if none
        while step < total and not mgr.exit_requested:
            tracker.step = step + 1
            train_one_step(...)
            step += 1
            heart.beat(step)
            mgr.maybe_save(step)                            # every rank, every step
        mgr.close()                                         # waits for the in-flight save; raises if it failed

Torch-free at import: the names below load their modules (and torch) on first access, so the monitor and the
launcher can import ``slurm_ft.core.layout`` and ``slurm_ft.core.rundir`` without torch.
"""

_LAZY = {"CheckpointManager": "slurm_ft.train.checkpoint", "CheckpointConfig": "slurm_ft.train.checkpoint",
         "CheckpointError": "slurm_ft.train.checkpoint", "SaveResult": "slurm_ft.train.checkpoint",
         "HeartbeatWriter": "slurm_ft.train.heartbeat", "record_errors": "slurm_ft.train.errors",
         "revalidate": "slurm_ft.train.topology", "TopologyError": "slurm_ft.train.topology"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
