"""Failure classification: plain records in, a Verdict out (see taxonomy).

``classify(evidence, rules=None) -> Verdict`` is pure; ``load_rules(extra_paths, site_config)`` reads the
shipped ``rules.toml`` plus site overrides. Nothing here imports torch.
"""

from slurm_ft.classify.engine import classify, explain
from slurm_ft.classify.records import Evidence, JobEnd, LogTail, NodeEvent, error_record_from_dict
from slurm_ft.classify.rules import Rules, default_rules, load_rules, load_xid_table, xid_info
from slurm_ft.classify.xid import XidInfo, XidKind
from slurm_ft.core.taxonomy import Action, Category, Culprit, Verdict
from slurm_ft.health.kmsg import parse_kmsg_xids, parse_xid_line

__all__ = [
    "Action", "Category", "Culprit", "Evidence", "JobEnd", "LogTail", "NodeEvent", "Rules", "Verdict", "XidInfo",
    "XidKind", "classify", "default_rules", "error_record_from_dict", "explain", "load_rules", "load_xid_table",
    "parse_kmsg_xids", "parse_xid_line", "xid_info",
]
