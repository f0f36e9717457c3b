"""Everything that talks to Slurm: the SlurmClient protocol, its backends and pure parsers.

``make_client()`` picks the backend (pyslurm when it matches the running Slurm, else the CLI tools).
"""

from slurm_ft.slurm.backend import backend_for, make_client
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo, SlurmClient

__all__ = ["CliSlurmClient", "JobInfo", "JobState", "NodeInfo", "SlurmClient", "backend_for", "make_client"]
