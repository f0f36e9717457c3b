"""Node evidence of link loss: the kernel's link counters, read from sysfs, and what changed between two readings.

A link that goes down and comes back leaves no trace in Slurm (shorter than ``SlurmdTimeout``) nor in a probe run
after it; the kernel counts it on the node:

- Ethernet ``/sys/class/net/IF/carrier_changes`` (every carrier change: down and up count one each) and
  ``carrier_down_count`` (downs alone; kernels >= 4.16);
- InfiniBand ``/sys/class/infiniband/DEV/ports/P/counters/link_downed`` (the port's link went down) and
  ``link_error_recovery`` (link error recoveries).

``read_links`` reads every interface but ``lo`` behind the ``LinkReader`` interface (``SysfsLinks``: a sysfs root,
``/sys`` on a node, a tree in a temporary dir in tests); ``LinkSnapshot`` is one reading, as a dict for the files
that carry it between processes; ``link_losses`` (pure) compares two readings of one node: a counter that grew is a
``LinkLoss``. A counter that went back (a reset: the interface was made anew, the node rebooted) or an interface in
only one reading says nothing. Nothing here judges: the launcher (the job's own readings) and the epilog (root's)
decide what a loss means (``slurm_ft.classify``: ``network``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

ETH_COUNTERS = ("carrier_changes", "carrier_down_count")
IB_COUNTERS = ("link_downed", "link_error_recovery")
LOSS_COUNTERS = frozenset(ETH_COUNTERS + IB_COUNTERS)
SKIPPED = frozenset({"lo"})
MAX_INTERFACES = 256  # a node with more is read only this far (sorted by name)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,63}$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinkCounters:
    """One interface's link counters: ``eth0``, or ``mlx5_0/1`` (an InfiniBand device and port)."""

    interface: str
    counters: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "counters", dict(self.counters))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinkSnapshot:
    """Every interface's counters on ``node`` at ``time``."""

    node: str
    time: float
    links: tuple[LinkCounters, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "time": self.time,
                "links": {link.interface: dict(link.counters) for link in self.links}}

    @classmethod
    def from_dict(cls, data: Any) -> "LinkSnapshot | None":
        """The snapshot a dict holds, or None when it is not one; interfaces and counters of the wrong shape are
        dropped (the dict may come from a file the job wrote)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("links"), Mapping):
            return None
        node, when = data.get("node"), data.get("time")
        if not isinstance(node, str) or isinstance(when, bool) or not isinstance(when, (int, float)):
            return None
        links = []
        for name, counters in list(data["links"].items())[:MAX_INTERFACES]:
            if isinstance(name, str) and _NAME.match(name) and isinstance(counters, Mapping):
                kept = {k: v for k, v in counters.items() if k in LOSS_COUNTERS and _count(v)}
                links.append(LinkCounters(interface=name, counters=kept))
        return cls(node=node, time=float(when), links=tuple(links))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinkLoss:
    """A link counter of ``node`` that grew between two readings: the link went down in between."""

    node: str
    interface: str
    counter: str
    before: int
    after: int

    def describe(self) -> str:
        return (f"{self.node}: link {self.interface} went down: {self.counter} {self.before} -> {self.after} "
                f"(+{self.after - self.before})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LinkLoss":
        return cls(node=str(data["node"]), interface=str(data["interface"]), counter=str(data["counter"]),
                   before=int(data["before"]), after=int(data["after"]))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_counter(text: str) -> int | None:
    """A sysfs counter file's text (``"4\\n"``) -> 4; None when it holds no count (an interface that is down
    answers ``carrier_changes`` reads with an error, some drivers with ``N/A``)."""
    text = text.strip()
    return int(text) if text.isdigit() and len(text) <= 20 else None


def link_losses(before: LinkSnapshot, after: LinkSnapshot) -> tuple[LinkLoss, ...]:
    """Pure: every counter of an interface in both readings that grew, one loss per interface (its most telling
    counter: the first of ``carrier_down_count``, ``link_downed``, ``carrier_changes``, ``link_error_recovery``
    that grew)."""
    then = {link.interface: link.counters for link in before.links}
    found = []
    for link in after.links:
        old = then.get(link.interface)
        if old is None:
            continue
        grown = [name for name in _PREFERRED if name in old and name in link.counters
                 and link.counters[name] > old[name]]
        if grown:
            name = grown[0]
            found.append(LinkLoss(node=after.node or before.node, interface=link.interface, counter=name,
                                  before=old[name], after=link.counters[name]))
    return tuple(found)


_PREFERRED = ("carrier_down_count", "link_downed", "carrier_changes", "link_error_recovery")


def losses_text(losses: Iterable[LinkLoss]) -> str:
    return "; ".join(loss.describe() for loss in losses)


# --- reading (the side effect) ----------------------------------------------------------------------------------
class LinkReader(Protocol):
    def read(self, node: str) -> LinkSnapshot: ...


@dataclasses.dataclass(frozen=True, slots=True)
class SysfsLinks:
    """Reads the counters under ``root`` (``/sys`` on a node)."""

    root: Path = Path("/sys")
    clock: Callable[[], float] = time.time

    def read(self, node: str) -> LinkSnapshot:
        links = [*_ethernet(self.root / "class" / "net"), *_infiniband(self.root / "class" / "infiniband")]
        return LinkSnapshot(node=node, time=self.clock(), links=tuple(links[:MAX_INTERFACES]))


def read_links(node: str, root: Path = Path("/sys")) -> LinkSnapshot:
    """This node's link counters now (``SysfsLinks(root).read(node)``)."""
    return SysfsLinks(root).read(node)


def _ethernet(folder: Path) -> list[LinkCounters]:
    found = []
    for name in _names(folder):
        if name in SKIPPED:
            continue
        counters = _counters(folder / name, ETH_COUNTERS)
        if counters:
            found.append(LinkCounters(interface=name, counters=counters))
    return found


def _infiniband(folder: Path) -> list[LinkCounters]:
    found = []
    for device in _names(folder):
        for port in _names(folder / device / "ports"):
            counters = _counters(folder / device / "ports" / port / "counters", IB_COUNTERS)
            if counters:
                found.append(LinkCounters(interface=f"{device}/{port}", counters=counters))
    return found


def _names(folder: Path) -> list[str]:
    try:
        return sorted(n for n in (p.name for p in folder.iterdir()) if _NAME.match(n))[:MAX_INTERFACES]
    except OSError:
        return []


def _counters(folder: Path, names: Iterable[str]) -> dict[str, int]:
    found = {}
    for name in names:
        try:
            value = parse_counter((folder / name).read_text())
        except (OSError, UnicodeDecodeError):
            continue
        if value is not None:
            found[name] = value
    return found
