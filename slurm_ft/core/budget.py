"""The restart budget: ``--ft-max-restarts=N`` allows N restarts of a job after faults, in place and through the
queue together (the launcher's ``--max-restarts`` and the monitor read the same N).

Counted: every in-place restart by the launcher, and every requeue after a failure (by the monitor, or by Slurm
after a node failure). Not counted: a requeue after preemption, the time limit or a cancellation (the job was
stopped, not broken), and swapping a spare node in (a membership change).

The counts travel with the job in its Comment (``slurm_ft.core.comment``), the one place that both the launcher
(inside the job) and the monitor (outside it) read and write: ``in_place=M`` (in-place restarts so far, over all
runs) and ``free=P`` (requeues that were not failures). Restarts used = Slurm's restart count - P + M.
"""

from __future__ import annotations

import dataclasses

from slurm_ft.core.taxonomy import Category

# Restart causes that are not faults: a requeue for them uses no restart (and says nothing about the failure rate).
NOT_FAULTS = frozenset(c.value for c in (Category.PREEMPTION, Category.TIME_LIMIT, Category.CANCELLED))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """``limit`` restarts; ``requeues`` (Slurm's restart count), ``in_place`` and ``free`` as above."""

    limit: int
    requeues: int = 0
    in_place: int = 0
    free: int = 0

    @property
    def used(self) -> int:
        return max(0, self.requeues - self.free) + self.in_place

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)
