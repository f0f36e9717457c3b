"""The trainer's slurm-ft lines on stderr by default ("resumed from step N", "checkpoint step N committed").

A training script that configures no logging would see only slurm-ft's warnings (Python's last-resort handler).
``show_progress`` gives the ``slurm_ft.train`` loggers one stderr handler, ``[slurm-ft rank R] message``, at INFO on
rank 0 and WARNING elsewhere, unless the program configured logging itself (a handler on the root logger or on
``slurm_ft``): then its configuration decides, as before.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "slurm_ft.train"


def show_progress(rank: int) -> None:
    """Idempotent; does nothing where the program set up logging."""
    train = logging.getLogger(LOGGER)
    if logging.getLogger().handlers or logging.getLogger("slurm_ft").handlers or train.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[slurm-ft rank {rank}] %(message)s"))
    train.addHandler(handler)
    train.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    train.propagate = False  # a root handler added later must not print each line twice
