"""Training-side fault tolerance: checkpoint manager, resume, topology check, heartbeat, error files.

Torch-free at import: ``CheckpointManager``/``CheckpointConfig`` load torch lazily on first access.
"""

_LAZY = {"CheckpointManager": "slurm_ft.train.checkpoint", "CheckpointConfig": "slurm_ft.train.checkpoint",
         "CheckpointError": "slurm_ft.train.checkpoint"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
