"""The kernel-log Xid parser and the anchored scanner, on literal text."""

from __future__ import annotations

import pytest

from slurm_ft.classify import default_rules, parse_kmsg_xids, parse_xid_line
from slurm_ft.classify.scan import lower_same_length
from slurm_ft.health.kmsg import xid_pid
from slurm_ft.health.records import normalize_pci_bus


@pytest.mark.parametrize("line, expected", [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
     ("0000:3b:00", 79, "pid=1234, GPU has fallen off the bus.")),
    ("[12345.678912] NVRM: Xid (PCI:0000:3B:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     ("0000:3b:00", 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")),
    ("Oct 17 10:21:08 n2 kernel: NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x404600=0x80000002",
     ("0000:01:00", 13, "Graphics Exception: ESR 0x404600=0x80000002")),
    ("2024-10-17T10:21:08,123456+00:00 NVRM: Xid (PCI:0000:5e:00.0): 94, pid=9, Contained: SM (0x1).",
     ("0000:5e:00", 94, "pid=9, Contained: SM (0x1).")),
    ("NVRM: Xid (PCI:0000:3b:00): 45", ("0000:3b:00", 45, "")),
])
def test_parse_xid_line_formats(line, expected):
    assert parse_xid_line(line) == expected


@pytest.mark.parametrize("line", [
    "", "Xid", "NVRM: GPU at PCI:0000:3b:00: GPU-8a5c1d2e", "NVRM: Xid (PCI:zzzz:3b:00): 79, x",
    "NVRM: Xid (PCI:0000:3b:00): seventy-nine", "nvrm: xid (pci:0000:3b:00): 79, lower case is not the driver",
])
def test_parse_xid_line_rejects(line):
    assert parse_xid_line(line) is None


def test_parse_kmsg_xids_keeps_only_xid_lines():
    text = ("[1.0] NVRM: GPU at PCI:0000:3b:00: GPU-1\n"
            "[2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=77, GPU has fallen off the bus.\n"
            "[3.0] random line\n"
            "[4.0] NVRM: Xid (PCI:0000:86:00): 48, pid=78, An uncorrectable double bit error\n")
    events = parse_kmsg_xids(text, "n2")
    assert [(e.node, e.xid, e.pci_bus, e.source) for e in events] == [
        ("n2", 79, "0000:3b:00", "kmsg"), ("n2", 48, "0000:86:00", "kmsg")]
    assert events[0].text.startswith("[2.0] NVRM: Xid")


def test_normalize_pci_and_pid():
    assert normalize_pci_bus("00000000:3B:00.0") == normalize_pci_bus("0000:3b:00") == "0000:3b:00"
    assert normalize_pci_bus("garbage") == "garbage"
    assert xid_pid("79, pid=1234, GPU has fallen off the bus") == 1234
    assert xid_pid("pid='<unknown>', name=<unknown>") is None


def test_lower_same_length_keeps_offsets():
    text = "İstanbul KeyError"  # "İ".lower() is two characters long
    low = lower_same_length(text)
    assert len(low) == len(text) and low.endswith("keyerror")


def test_scanner_finds_lines_by_anchor_and_agrees_with_naive():
    scanner = default_rules().scanners["log"]
    text = "step 1 loss 2.0\n[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried\nstep 2 loss 1.9\nKeyError: 'x'"
    fast = [(h.pos, h.line, [s.rule.id for s, _ in h.signatures], h.exception["exc"] if h.exception else None)
            for h in scanner.scan(text)]
    assert fast == [
        (16, "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried", ["cuda_oom"], "torch.OutOfMemoryError"),
        (91, "KeyError: 'x'", [], "KeyError"),
    ]
    naive = [(h.pos, [s.rule.id for s, _ in h.signatures]) for h in scanner.scan_naive(text) if h.signatures]
    assert naive == [(16, ["cuda_oom"])]


def test_scanner_cuts_long_lines_the_same_way():
    scanner = default_rules().scanners["log"]
    text = "x" * 5000 + " CUDA out of memory\nCUDA out of memory"
    assert [h.pos for h in scanner.scan(text) if h.signatures] == [5020]
    assert [h.pos for h in scanner.scan_naive(text) if h.signatures] == [5020]


def test_require_skips_lines_without_the_required_literal():
    scanner = default_rules().scanners["log"]
    assert not any(h.signatures for h in scanner.scan("NCCL INFO nan bootstrap\ninfo: lr=inf"))
    assert [s.rule.id for h in scanner.scan("step 9 loss=nan") for s, _ in h.signatures] == ["nan_loss"]
