"""Moved to ``slurm_ft.cluster.hooks``. This shim keeps prolog, epilog and health-check scripts written by an earlier
``slurm-ft admin install`` (they run ``from slurm_ft.hooks import main``) working for one release; slurm-ft 0.2
removes it. ``slurm-ft admin install`` writes scripts that import the new path."""

from slurm_ft.cluster.hooks import main

__all__ = ["main"]
