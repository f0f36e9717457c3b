"""Rules as data: the shipped table, overrides from files and the site config, and errors that name the culprit."""

from __future__ import annotations

import textwrap

import pytest

from slurm_ft.classify import Action, Category, Evidence, JobEnd, LogTail, classify, load_rules, xid_info
from slurm_ft.classify.rules import SHIPPED_RULES, build_rules, default_rules, load_xid_table
from slurm_ft.classify.xid import XidKind
from slurm_ft.core.config import SiteConfig
from slurm_ft.core.errors import ConfigError


def _write(tmp_path, text, name="site.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_shipped_rules_load_and_name_their_source():
    rules = default_rules()
    assert rules.sources == (str(SHIPPED_RULES),)
    assert set(rules.categories) == set(Category)
    assert len(rules.signatures) >= 60


def test_xid_table_is_complete_and_cautious():
    table = load_xid_table()
    assert set(range(1, 173)) <= set(table)
    assert {x for x, info in table.items() if info.kind is XidKind.DRAIN} >= {48, 64, 74, 79, 94, 95, 119, 120, 140}
    assert table[45].kind is XidKind.SECONDARY
    assert table[13].kind is XidKind.APPLICATION and table[31].kind is XidKind.APPLICATION
    assert table[63].kind is XidKind.WATCH and table[92].kind is XidKind.WATCH
    assert xid_info(10_000).kind is XidKind.WATCH  # unlisted: unknown_xid


def test_xid_154_escalates_only_on_the_new_action():
    info = xid_info(154)
    assert info.kind_for("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)") is XidKind.DRAIN
    assert info.kind_for("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)") is XidKind.WATCH


def test_recoverability_table():
    rules = default_rules()
    expected = {
        Category.HARDWARE_GPU: Action.REQUEUE_EXCLUDE, Category.HARDWARE_NODE: Action.REQUEUE_EXCLUDE,
        Category.NETWORK: Action.REQUEUE, Category.HANG: Action.REQUEUE, Category.PREEMPTION: Action.REQUEUE,
        Category.STORAGE: Action.REQUEUE, Category.USER_CODE: Action.STOP, Category.OOM_GPU: Action.STOP,
        Category.OOM_HOST: Action.STOP, Category.NUMERICAL: Action.STOP, Category.CONFIG: Action.STOP,
        Category.TIME_LIMIT: Action.REQUEUE, Category.CANCELLED: Action.NONE, Category.UNKNOWN: Action.REQUEUE,
    }
    assert {c: rules.policy(c).action for c in Category} == expected
    assert rules.policy(Category.NETWORK).in_allocation_action is Action.RESTART_IN_PLACE


def test_exception_lookup_order():
    rules = default_rules()
    assert rules.exception("torch.OutOfMemoryError").category is Category.OOM_GPU  # last component
    assert rules.exception("mypkg.BadShardError").id == "exception.*"  # CamelCase ...Error
    assert rules.exception("Traceback") is None and rules.exception("ERROR") is None
    assert rules.exception("Error") is None


def test_extra_file_overrides_xid_and_disables_and_adds_signatures(tmp_path):
    extra = _write(tmp_path, """
        [xid.92]
        kind = "drain"

        [[signature]]
        id = "nan_loss"
        enabled = false

        [[signature]]
        id = "site_lustre_evicted"
        category = "storage"
        keyword = "evicted by"
        pattern = 'LustreError: .* evicted by (?P<node>\\S+)'
        priority = 58
        sources = ["kmsg", "log"]

        [[signature]]
        id = "cuda_oom"
        priority = 66
    """)
    rules = load_rules(extra_paths=[extra])
    assert rules.sources[-1] == str(extra)
    assert rules.xid(92).kind is XidKind.DRAIN
    assert "nan_loss" not in {s.rule.id for s in rules.signatures}
    oom = next(s for s in rules.signatures if s.rule.id == "cuda_oom")
    assert oom.rule.priority == 66 and oom.rule.category is Category.OOM_GPU  # key-by-key update
    lustre = LogTail(source="n4", kind="kmsg", text="LustreError: 11-0: scratch-OST0003: evicted by mds01")
    assert classify(Evidence(logs=(lustre,)), rules).category is Category.STORAGE
    nan = LogTail(source=0, text="step 10 loss nan")
    assert classify(Evidence(logs=(nan,)), rules).category is Category.UNKNOWN  # rule disabled
    assert classify(Evidence(logs=(nan,))).category is Category.NUMERICAL  # shipped rules untouched


def test_site_config_rules_files_and_inline_tables(tmp_path):
    extra = _write(tmp_path, """
        [category.user_code]
        recoverable = true
        action = "requeue"
    """, "rules.d.toml")
    site = SiteConfig(sections={"classify": {"rules_files": [str(extra)], "job_state": {"TIMEOUT": {"action": "stop"}}}},
                      source="/etc/slurm-ft/config.toml")
    rules = load_rules(site_config=site)
    assert rules.sources == (str(SHIPPED_RULES), str(extra), "/etc/slurm-ft/config.toml [classify]")
    assert rules.policy(Category.USER_CODE).action is Action.REQUEUE
    verdict = classify(Evidence(job=JobEnd(state="TIMEOUT")), rules)
    assert verdict.category is Category.TIME_LIMIT and verdict.action is Action.STOP


@pytest.mark.parametrize("text, needle", [
    ("[xid.79]\nkind = \"explode\"\n", "[xid.79] kind: 'explode' is not one of"),
    ("[xid.abc]\nkind = \"drain\"\n", "[xid.abc]: key must be a number"),
    ("[category.hardware_gpu]\nrecoverable = true\naction = \"reboot\"\n", "[category.hardware_gpu] action: 'reboot'"),
    ("[category.bogus]\nrecoverable = true\naction = \"stop\"\n", "[category.bogus]: unknown category"),
    ("[job_state.FINISHED]\ncategory = \"unknown\"\n", "[job_state.FINISHED]: unknown Slurm job state"),
    ("[node_state.down]\ncategory = \"unknown\"\n", "[node_state.down]"),
    ("[signal.9]\ncategory = \"unknown\"\npriority = 101\n", "[signal.9] priority: must be within 0..100"),
    ("[signal.9]\ncategory = \"unknown\"\nconfidence = \"high\"\n", "[signal.9] confidence: must be"),
    ("[exception.KeyError]\ncategory = \"user_code\"\nsevere = true\n", "unknown key 'severe'"),
    ("[limits]\nmax_tail_chars = 0\n", "[limits] max_tail_chars: bad value 0"),
    ("[nvml]\nremap_pending = \"yes\"\n", "[nvml] remap_pending: bad value"),
    ("[rules]\nx = 1\n", "unknown key 'rules'"),
    ("[[signature]]\ncategory = \"network\"\n", "signature[0]: missing key 'id'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a('\nkeyword = \"a\"\n", "[signature.x] pattern: bad regex"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a*'\nkeyword = \"a\"\n", "matches the empty string"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'abc'\n", "[signature.x]: missing key 'keyword'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = '(?P<who>a)'\nkeyword = \"a\"\n", "named group 'who'"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a'\nkeyword = \"a\"\nsources = [\"stdout\"]\n", "sources"),
    ("[[signature]]\nid = \"x\"\ncategory = \"network\"\npattern = 'a'\nkeyword = [\"\"]\n", "keyword: must be a non-empty"),
    ("signature = 3\n", "[[signature]] must be an array of tables"),
])
def test_malformed_rules_name_file_and_key(tmp_path, text, needle):
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(ConfigError) as err:
        load_rules(extra_paths=[path])
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_unreadable_or_invalid_rules_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rules(extra_paths=[tmp_path / "missing.toml"])
    bad = _write(tmp_path, "[xid\n", "broken.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_rules(extra_paths=[bad])
    site = SiteConfig(sections={"classify": {"rules_files": "x.toml"}}, source="site.toml")
    with pytest.raises(ConfigError, match=r"site.toml \[classify\]: rules_files must be a list"):
        load_rules(site_config=site)


def test_category_table_must_stay_complete():
    with pytest.raises(ConfigError, match="lacks"):
        build_rules([("only.toml", {"category": {"network": {"recoverable": True, "action": "requeue"}}})])
