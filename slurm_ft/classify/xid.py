"""NVIDIA Xid: what each Xid means for the job that saw it (the table's row types).

The table lives in ``rules.toml`` (``[xid]``) so an admin can extend it; ``slurm_ft.classify.rules.load_xid_table``
returns it and ``xid_info`` one row. Xid lines are parsed where the kernel log is read: ``slurm_ft.health.kmsg``.
"""

from __future__ import annotations

import dataclasses
import enum
import re


class XidKind(str, enum.Enum):
    """What an Xid means for the job that saw it (see the table comment in rules.toml)."""

    DRAIN = "drain"  # the GPU needs a reset or service: exclude the node
    RESTART = "restart"  # the fault killed the application; the GPU keeps working
    APPLICATION = "application"  # caused by the application itself
    SECONDARY = "secondary"  # a consequence of another fault (Xid 45)
    WATCH = "watch"  # recorded, never a cause


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class XidInfo:
    """One row of the Xid table."""

    xid: int
    name: str
    kind: XidKind
    drain_pattern: re.Pattern[str] | None = None  # escalates to DRAIN when it matches the Xid line

    def kind_for(self, text: str) -> XidKind:
        """The kind for one occurrence (``drain_pattern`` reads the driver's recovery action, e.g. Xid 154)."""
        if self.drain_pattern is not None and self.drain_pattern.search(text):
            return XidKind.DRAIN
        return self.kind
