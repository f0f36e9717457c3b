"""NVIDIA Xid: the kernel-log line parser and the Xid table (what each Xid means for a job).

The table lives in ``rules.toml`` (``[xid]``) so an admin can extend it; ``load_xid_table()`` returns it.
Parsing is pure: ``parse_xid_line`` and ``parse_kmsg_xids`` take literal text.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurm_ft.health.records import XidEvent

if TYPE_CHECKING:  # pragma: no cover
    from slurm_ft.classify.rules import Rules

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."   (current drivers)
# "NVRM: Xid (0000:3b:00): 13, Graphics Exception: ..."                       (older drivers, no "PCI:")
_XID_LINE_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\): "
    r"(?P<xid>\d{1,5})\b,?\s*(?P<text>[^\n]*)"
)
_PID_RE = re.compile(r"\bpid[=:]\s*'?(\d+)")
MAX_LINE_CHARS = 1024


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


def parse_xid_line(line: str) -> tuple[str, int, str] | None:
    """``(pci_bus, xid, text)`` of an ``NVRM: Xid`` kernel line, else ``None``.

    ``pci_bus`` is normalised to ``dddd:bb:dd`` (lower case); ``text`` is what follows the Xid number.
    """
    if "Xid" not in line:
        return None
    m = _XID_LINE_RE.search(line[:MAX_LINE_CHARS])
    if m is None:
        return None
    return normalize_pci(m["pci"]), int(m["xid"]), m["text"].strip()


def parse_kmsg_xids(text: str, node: str) -> list[XidEvent]:
    """Every Xid line in ``text`` (dmesg / journal / /dev/kmsg output) as ``XidEvent(source="kmsg")``."""
    events = []
    for line in text.splitlines():
        parsed = parse_xid_line(line)
        if parsed is not None:
            pci, xid, _ = parsed
            events.append(XidEvent(node=node, xid=xid, pci_bus=pci, text=line.strip()[:MAX_LINE_CHARS], source="kmsg"))
    return events


def xid_pid(text: str) -> int | None:
    """The ``pid=N`` an Xid line names (the process that hit it), if any."""
    m = _PID_RE.search(text)
    return int(m.group(1)) if m else None


def normalize_pci(text: str) -> str:
    """``00000000:3B:00.0`` (NVML) and ``0000:3b:00`` (kernel) -> ``0000:3b:00``; anything else lower-cased."""
    parts = text.strip().lower().split(":")
    if len(parts) != 3:
        return text.strip().lower()
    try:
        domain, bus, dev = int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return text.strip().lower()
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def load_xid_table(rules: "Rules | None" = None) -> Mapping[int, XidInfo]:
    """The Xid table of ``rules`` (default: the shipped rules)."""
    if rules is None:
        from slurm_ft.classify.rules import default_rules

        rules = default_rules()
    return rules.xids


def xid_info(xid: int, rules: "Rules | None" = None) -> XidInfo:
    """The table row for ``xid``; an unlisted Xid gets the rules' ``unknown_xid`` kind."""
    if rules is None:
        from slurm_ft.classify.rules import default_rules

        rules = default_rules()
    return rules.xid(xid)
