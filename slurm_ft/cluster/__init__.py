"""What runs as root: the prolog/epilog hooks, the monitor, the quarantine store and its CLI, ``slurm-ft status``,
the metrics endpoint and ``slurm-ft admin install``.

Everything a job wrote (its files, paths, logs, Comment) is the user's word here and is read only through the one
safe reader (``slurm_ft.health.jobfiles``). Never imports ``slurm_ft.launch``: what the monitor and the launcher
share lives in ``slurm_ft.core``.
"""
