"""slurm-ft: fault tolerance for distributed PyTorch training on Slurm GPU clusters."""

__version__ = "0.1.0"
