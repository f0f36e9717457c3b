"""The job's supervisor, as the job's user: ``slurm-ft launch`` and what it runs inside the allocation.

The launcher (``launcher``), the per-rank wrapper (``rank``), warm standbys (``standby``), the rendezvous store
keeper (``store``), the fault bell (``bell``), the probe step (``probe``), the hang watch's evidence (``hang``),
preemption (``preempt``), the checks before the first attempt (``checks``), the verdict and its paragraph
(``verdict``, ``text``) and ``slurm-ft report`` (``report``). Never imports ``slurm_ft.cluster``: what the launcher
and root's monitor share lives in ``slurm_ft.core``.
"""
