"""Everything that talks to Slurm: the SlurmClient protocol, its backends and pure parsers."""

from slurm_ft.slurm.types import JobInfo, JobState, NodeInfo, SlurmClient

__all__ = ["JobInfo", "JobState", "NodeInfo", "SlurmClient"]
