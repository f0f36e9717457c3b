"""The kernel-log Xid parser on literal lines in each supported format."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from slurm_ft.health import kmsg

DATA = Path(__file__).parent.parent.parent / "data" / "kmsg"
BOOT = 1_700_000_000.0


def test_devkmsg_records_give_xids_with_wall_clock_times() -> None:
    lines = (DATA / "devkmsg_xid79.txt").read_text().splitlines()
    xids = kmsg.find_xids(lines, node="n1", since=None, boot_time=BOOT)
    assert [(x.xid, x.pci_bus, x.time) for x in xids] == [(13, "0000:3b:00", BOOT + 3600.0),
                                                         (79, "0000:86:00", BOOT + 7200.0)]
    assert all(x.node == "n1" and x.source == "kmsg" for x in xids)
    assert "fallen off the bus" in xids[1].text


def test_since_drops_older_lines() -> None:
    lines = (DATA / "devkmsg_xid79.txt").read_text().splitlines()
    xids = kmsg.find_xids(lines, node="n1", since=BOOT + 3600.5, boot_time=BOOT)
    assert [x.xid for x in xids] == [79]


def test_dmesg_iso_lines_use_their_own_timestamps() -> None:
    lines = (DATA / "dmesg_iso_xid48.txt").read_text().splitlines()
    since = dt.datetime(2024, 3, 1, 14, 0, 0, tzinfo=dt.timezone.utc).timestamp()
    xids = kmsg.find_xids(lines, node="n2", since=since, boot_time=0.0)
    assert [x.xid for x in xids] == [48, 63]
    assert xids[0].time == pytest.approx(since + 1.5)


def test_plain_dmesg_and_odd_pci_spellings() -> None:
    lines = (DATA / "dmesg_plain_xid74.txt").read_text().splitlines()
    xids = kmsg.find_xids(lines, node="n3", since=None, boot_time=BOOT)
    assert [(x.xid, x.pci_bus) for x in xids] == [(74, "0000:c1:00"), (74, "0000:c1:00")]
    assert xids[0].time == pytest.approx(BOOT + 1234.56789)


@pytest.mark.parametrize("line", [
    "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
    "NVRM: Xid (PCI:0000:3b:00): notanumber, pid=1",
    "kernel: Xid 79 mentioned in prose",
    "",
    " SUBSYSTEM=pci",
])
def test_non_xid_lines_are_ignored(line: str) -> None:
    assert kmsg.find_xids([line], node="n1", since=None, boot_time=BOOT) == []


def test_undated_lines_are_kept_even_with_since() -> None:
    line = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    assert [x.xid for x in kmsg.find_xids([line], node="n1", since=BOOT * 2, boot_time=BOOT)] == [79]


def test_overlong_lines_are_cut() -> None:
    line = "4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 100_000
    (event,) = kmsg.find_xids([line], node="n1", since=None, boot_time=BOOT)
    assert len(event.text) <= kmsg.MAX_LINE_CHARS


class _Broken:
    def lines(self):
        raise PermissionError(13, "Permission denied")


def test_unreadable_sources_become_notes_and_the_next_source_is_tried() -> None:
    text = kmsg.TextLines("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 94, Contained ECC error")
    xids, notes = kmsg.read_xids("n1", since=None, sources=[_Broken(), text], boot_time=BOOT)
    assert [x.xid for x in xids] == [94]
    assert notes == ["kmsg unavailable (_Broken): Permission denied"]
    xids, notes = kmsg.read_xids("n1", since=None, sources=[_Broken()], boot_time=BOOT)
    assert xids == [] and len(notes) == 1


def test_real_dev_kmsg_reads_without_blocking(tmp_path: Path) -> None:
    """This host's own /dev/kmsg (skipped where it cannot be opened): returns, no Xids on a GPU-less host."""
    try:
        lines = list(kmsg.DevKmsg(max_seconds=1.0).lines())
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not readable here: {exc}")
    assert lines and all(kmsg.parse_line(line, boot_time=BOOT) is not None or line.startswith(" ")
                         for line in lines)


def test_journal_host_is_the_one_host_the_lines_name() -> None:
    line = "Dec 04 03:12:45 gpu-a02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    iso = "2026-12-04T03:12:45+0000 gpu-a03 kernel: Out of memory: Killed process 1 (python)\n"
    assert kmsg.journal_host(line * 3) == "gpu-a02"
    assert kmsg.journal_host(iso) == "gpu-a03"
    assert kmsg.journal_host(line + iso) == ""  # two hosts: which one is unknown
    assert kmsg.journal_host("[12345.678] Out of memory: Killed process 1 (python)\n") == ""
