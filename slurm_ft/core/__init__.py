"""Contracts every side shares, torch-free: environment names, errors, site config, the verdict taxonomy, the job
Comment, the run-dir files, the checkpoint directory layout, the job registry and the restart budget.

Nothing here imports torch or any other part of slurm-ft: the ranks (``train``), the job's supervisor (``launch``)
and root's daemons (``cluster``) all read and write these formats, so they live below all three.
"""
