"""A real local Slurm cluster on this host (munged, slurmctld, N x slurmd -N) for tests and the demo."""
