"""Classification rules as data: the shipped ``rules.toml`` plus site overrides, validated into ``Rules``.

``load_rules(extra_paths, site_config)`` merges, in order: the shipped file, the site config's
``[classify] rules_files``, its inline ``[classify.*]`` tables, then ``extra_paths``. A malformed rule is a
``ConfigError`` naming the file and the key. See the header of ``rules.toml`` for the schema.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slurm_ft.classify.scan import Scanner
from slurm_ft.classify.xid import XidInfo, XidKind
from slurm_ft.core.config import SiteConfig
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.core.taxonomy import Action, Category
from slurm_ft.health.checks import FALLBACK_DRAIN_XIDS
from slurm_ft.health.records import XidEvent
from slurm_ft.slurm.types import JobState

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHIPPED_RULES = Path(__file__).with_name("rules.toml")
SOURCES = ("log", "kmsg", "error", "node_reason", "job_reason")
DEFAULT_SOURCES = ("log", "kmsg", "error")
SITE_SECTION = "classify"

_TOP_KEYS = ("limits", "category", "job_state", "node_state", "signal", "exit_code", "nvml", "unknown_xid", "xid",
             "exception", "signature")
_TABLES = ("category", "job_state", "node_state", "signal", "exit_code", "xid", "exception")
_FLAG_RE = re.compile(r"^[A-Z][A-Z_]*$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CategoryPolicy:
    """What a category means for the job (the recoverability table)."""

    recoverable: bool
    action: Action
    in_allocation_action: Action


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """What one matched fact means: a finding template shared by states, signals, exceptions and signatures."""

    id: str
    category: Category
    priority: int = 50
    confidence: float = 0.5
    secondary: bool = False
    generic: bool = False
    final: bool = False  # job states only: the state alone decides
    blame: bool = True  # False: the reporter is a bystander (a watchdog timeout names who waited, not who hung)
    action: Action | None = None
    recoverable: bool | None = None
    name: str = ""
    note: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    """A text signature: a regex plus the literals that every match contains (for the scanner)."""

    rule: Rule
    pattern: str
    regex: re.Pattern[str]
    keywords: tuple[str, ...]
    require: tuple[str, ...] = ()
    within: tuple[str, ...] = ()  # lower-case literals the whole text (an error file, a log tail) must contain
    sources: frozenset[str] = frozenset(DEFAULT_SOURCES)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NvmlLimits:
    """Per-GPU counter limits; ``None`` disables a check."""

    ecc_volatile_uncorrected_max: int | None = 0
    retired_pages_max: int | None = None
    remap_failure: bool = True
    remap_pending: bool = True
    retired_pages_pending: bool = True
    nvlink_down: bool = True
    lost_gpu_errors: tuple[str, ...] = ()
    ecc_aggregate_uncorrected_max: int | None = None
    remapped_rows_uncorrectable_max: int | None = None
    nvlink_errors_max: int | None = None
    temperature_max_c: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds that keep classification fast on any input."""

    max_tail_chars: int = 32768
    max_error_chars: int = 8192
    max_line_chars: int = 512
    max_evidence: int = 8
    max_findings_per_text: int = 64


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """The validated, merged rule set. ``sources`` lists the files it came from, in merge order."""

    categories: Mapping[Category, CategoryPolicy]
    job_states: Mapping[str, Rule]
    node_states: Mapping[str, Rule]
    signals: Mapping[int, Rule]
    exit_codes: Mapping[int, Rule]
    exceptions: Mapping[str, Rule]
    signatures: tuple[Signature, ...]
    xids: Mapping[int, XidInfo]
    unknown_xid: XidKind
    nvml: NvmlLimits
    limits: Limits
    sources: tuple[str, ...] = ()
    scanners: Mapping[str, Scanner] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        missing = [c.value for c in Category if c not in self.categories]
        if missing:
            raise ConfigError(f"{self._where()}: [category] lacks {', '.join(missing)}")
        scanners = {}
        for source in SOURCES:
            sigs = [s for s in self.signatures if source in s.sources]
            scanners[source] = Scanner(sigs, exception_names=self.exceptions if source in ("log", "error") else (),
                                       xids=source in ("kmsg", "log"), max_line_chars=self.limits.max_line_chars)
        object.__setattr__(self, "scanners", scanners)

    def _where(self) -> str:
        return self.sources[-1] if self.sources else "rules"

    def policy(self, category: Category) -> CategoryPolicy:
        return self.categories[category]

    def xid(self, xid: int) -> XidInfo:
        info = self.xids.get(xid)
        return info if info is not None else XidInfo(xid=xid, name="Xid not in the table", kind=self.unknown_xid)

    def exception(self, name: str) -> Rule | None:
        """The rule for exception type ``name`` (full dotted name, then last component, then ``*``)."""
        rule = self.exceptions.get(name)
        if rule is not None:
            return rule
        short = name.rpartition(".")[2]
        rule = self.exceptions.get(short)
        if rule is not None:
            return rule
        if short[:1].isupper() and short.endswith(("Error", "Exception")) and short not in ("Error", "Exception"):
            return self.exceptions.get("*")
        return None


# ---- loading ------------------------------------------------------------------------------------------------

def load_rules(extra_paths: Iterable[str | os.PathLike[str]] = (), site_config: SiteConfig | None = None) -> Rules:
    """The shipped rules merged with the site config's and ``extra_paths`` (later wins)."""
    layers = [(str(SHIPPED_RULES), _read_toml(SHIPPED_RULES))]
    if site_config is not None:
        layers += _site_layers(site_config)
    layers += [(str(p), _read_toml(Path(p))) for p in extra_paths]
    return build_rules(layers)


@functools.cache
def default_rules() -> Rules:
    """The shipped rules, loaded once."""
    return load_rules()


def _site_layers(site: SiteConfig) -> list[tuple[str, Mapping[str, Any]]]:
    section = dict(site.section(SITE_SECTION))
    where = f"{site.source} [{SITE_SECTION}]"
    files = section.pop("rules_files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ConfigError(f"{where}: rules_files must be a list of paths")
    layers = [(f, _read_toml(Path(f))) for f in files]
    if section:
        layers.append((where, section))
    return layers


def _read_toml(path: Path) -> Mapping[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"rules file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rules file {str(path)!r} is unreadable: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"rules file {str(path)!r} is not valid TOML: {exc}") from exc


def build_rules(layers: Iterable[tuple[str, Mapping[str, Any]]]) -> Rules:
    """Merge ``(source, data)`` layers and validate them into ``Rules``."""
    merged: dict[str, Any] = {t: {} for t in _TABLES}
    merged.update(limits={}, nvml={}, unknown_xid=("watch", "rules"))
    signatures: dict[str, tuple[str, dict[str, Any]]] = {}
    sources = []
    for source, data in layers:
        sources.append(source)
        _merge_layer(source, data, merged, signatures)
    return Rules(
        categories={Category(k): _policy(src, k, v) for k, (src, v) in _category_items(merged["category"])},
        job_states={k: _job_state(src, k, v) for k, (src, v) in merged["job_state"].items()},
        node_states={k: _node_state(src, k, v) for k, (src, v) in merged["node_state"].items()},
        signals={_int_key(src, "signal", k): _rule(src, f"signal.{k}", v, _SIGNAL_KEYS) for k, (src, v)
                 in merged["signal"].items()},
        exit_codes={_int_key(src, "exit_code", k): _rule(src, f"exit_code.{k}", v, _RULE_KEYS) for k, (src, v)
                    in merged["exit_code"].items()},
        exceptions={k: _rule(src, f"exception.{k}", v, _RULE_KEYS, generic=True) for k, (src, v)
                    in merged["exception"].items()},
        signatures=tuple(_signature(src, v) for src, v in signatures.values()),
        xids={_int_key(src, "xid", k): _xid(src, _int_key(src, "xid", k), v) for k, (src, v) in merged["xid"].items()},
        unknown_xid=_enum(merged["unknown_xid"][1], "rules", "unknown_xid", merged["unknown_xid"][0], XidKind),
        nvml=_dataclass(NvmlLimits, merged["nvml"], "nvml"),
        limits=_dataclass(Limits, merged["limits"], "limits"),
        sources=tuple(sources),
    )


def _merge_layer(source: str, data: Mapping[str, Any], merged: dict[str, Any],
                 signatures: dict[str, tuple[str, dict[str, Any]]]) -> None:
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(_TOP_KEYS)})")
    for table in _TABLES:
        entries = data.get(table, {})
        _require_table(source, table, entries)
        for key, entry in entries.items():
            _require_table(source, f"{table}.{key}", entry)
            old = merged[table].get(str(key), (source, {}))[1]
            merged[table][str(key)] = (source, {**old, **entry})
    for table in ("limits", "nvml"):
        entries = data.get(table, {})
        _require_table(source, table, entries)
        merged[table].update({k: (v, source) for k, v in entries.items()})
    if "unknown_xid" in data:
        merged["unknown_xid"] = (data["unknown_xid"], source)
    entries = data.get("signature", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: [[signature]] must be an array of tables")
    for i, entry in enumerate(entries):
        _require_table(source, f"signature[{i}]", entry)
        sig_id = entry.get("id")
        if not isinstance(sig_id, str) or not sig_id:
            raise ConfigError(f"{source}: signature[{i}]: missing key 'id'")
        if entry.get("enabled", True) is False:
            signatures.pop(sig_id, None)
            continue
        old = signatures.get(sig_id, (source, {}))[1]
        signatures[sig_id] = (source, {**old, **{k: v for k, v in entry.items() if k != "enabled"}})


def _require_table(source: str, where: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: [{where}] must be a table, got {type(value).__name__}")


def _category_items(entries: Mapping[str, tuple[str, Mapping[str, Any]]]):
    for key, (src, value) in entries.items():
        if key not in Category._value2member_map_:
            known = ', '.join(c.value for c in Category)
            raise ConfigError(f"{src}: [category.{key}]: unknown category (known: {known})")
        yield key, (src, value)


# ---- validation of one entry ----------------------------------------------------------------------------------

_RULE_KEYS = {"category": str, "priority": int, "confidence": (int, float), "secondary": bool, "generic": bool,
              "blame": bool, "action": str, "recoverable": bool, "note": str, "name": str}
_SIGNAL_KEYS = _RULE_KEYS
_STATE_KEYS = {**_RULE_KEYS, "final": bool}
_SIGNATURE_KEYS = {**_RULE_KEYS, "id": str, "pattern": str, "keyword": (str, list), "require": (str, list),
                   "within": (str, list), "sources": list, "ignore_case": bool}


def _check_keys(src: str, where: str, data: Mapping[str, Any], schema: Mapping[str, Any],
                required: Iterable[str] = ()) -> None:
    for key, value in data.items():
        if key not in schema:
            raise ConfigError(f"{src}: [{where}]: unknown key {key!r} (known: {', '.join(sorted(schema))})")
        types = schema[key]
        bool_for_number = isinstance(value, bool) and types is not bool and bool not in _as_tuple(types)
        if bool_for_number or not isinstance(value, types):
            raise ConfigError(f"{src}: [{where}] {key}: must be {_type_name(types)}, got {value!r}")
    for key in required:
        if key not in data:
            raise ConfigError(f"{src}: [{where}]: missing key {key!r}")


def _as_tuple(types: Any) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_name(types: Any) -> str:
    return " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                        list: "a list"}[t] for t in _as_tuple(types))


def _enum(src: str, where: str, key: str, value: Any, enum_cls: type) -> Any:
    try:
        return enum_cls(value)
    except ValueError:
        known = ", ".join(e.value for e in enum_cls)
        raise ConfigError(f"{src}: [{where}] {key}: {value!r} is not one of {known}") from None


def _rule(src: str, where: str, data: Mapping[str, Any], schema: Mapping[str, Any], *, rule_id: str | None = None,
          generic: bool = False, required: Iterable[str] = ("category",)) -> Rule:
    _check_keys(src, where, data, schema, required)
    priority = data.get("priority", 50)
    confidence = float(data.get("confidence", 0.5))
    if not 0 <= priority <= 100:
        raise ConfigError(f"{src}: [{where}] priority: must be within 0..100, got {priority}")
    if not 0.0 <= confidence <= 1.0:
        raise ConfigError(f"{src}: [{where}] confidence: must be within 0..1, got {confidence}")
    return Rule(
        id=rule_id or where,
        category=_enum(src, where, "category", data["category"], Category) if "category" in data else Category.UNKNOWN,
        priority=priority,
        confidence=confidence,
        secondary=data.get("secondary", False),
        generic=data.get("generic", generic),
        final=data.get("final", False),
        blame=data.get("blame", True),
        action=_enum(src, where, "action", data["action"], Action) if "action" in data else None,
        recoverable=data.get("recoverable"),
        name=data.get("name", ""),
        note=data.get("note", ""),
    )


def _policy(src: str, key: str, data: Mapping[str, Any]) -> CategoryPolicy:
    where = f"category.{key}"
    _check_keys(src, where, data, {"recoverable": bool, "action": str, "in_allocation_action": str},
                ("recoverable", "action"))
    action = _enum(src, where, "action", data["action"], Action)
    in_alloc = data.get("in_allocation_action")
    return CategoryPolicy(recoverable=data["recoverable"], action=action,
                          in_allocation_action=_enum(src, where, "in_allocation_action", in_alloc, Action)
                          if in_alloc is not None else action)


def _job_state(src: str, key: str, data: Mapping[str, Any]) -> Rule:
    if key not in JobState._value2member_map_:
        raise ConfigError(f"{src}: [job_state.{key}]: unknown Slurm job state")
    return _rule(src, f"job_state.{key}", data, _STATE_KEYS, rule_id=f"job_state:{key}")


def _node_state(src: str, key: str, data: Mapping[str, Any]) -> Rule:
    if not _FLAG_RE.match(key):
        raise ConfigError(f"{src}: [node_state.{key}]: a node state flag is upper case, like NOT_RESPONDING")
    return _rule(src, f"node_state.{key}", data, _RULE_KEYS, rule_id=f"node_state:{key}")


def _int_key(src: str, table: str, key: str) -> int:
    try:
        value = int(key)
    except ValueError:
        raise ConfigError(f"{src}: [{table}.{key}]: key must be a number") from None
    if value < 0:
        raise ConfigError(f"{src}: [{table}.{key}]: key must not be negative")
    return value


def _xid(src: str, xid: int, data: Mapping[str, Any]) -> XidInfo:
    where = f"xid.{xid}"
    _check_keys(src, where, data, {"name": str, "kind": str, "drain_pattern": str}, ("kind",))
    pattern = data.get("drain_pattern")
    return XidInfo(xid=xid, name=data.get("name", f"Xid {xid}"), kind=_enum(src, where, "kind", data["kind"], XidKind),
                   drain_pattern=_compile(src, f"{where}] drain_pattern", pattern, re.ASCII) if pattern else None)


def _compile(src: str, where: str, pattern: str, flags: int) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ConfigError(f"{src}: [{where}: bad regex {pattern!r}: {exc}") from None


def _signature(src: str, data: Mapping[str, Any]) -> Signature:
    sig_id = data["id"]
    where = f"signature.{sig_id}"
    _check_keys(src, where, data, _SIGNATURE_KEYS, ("id", "category", "pattern", "keyword"))
    keywords = _literals(src, where, "keyword", data["keyword"])
    if not keywords:
        raise ConfigError(f"{src}: [{where}] keyword: must name at least one literal")
    sources = data.get("sources", list(DEFAULT_SOURCES))
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise ConfigError(f"{src}: [{where}] sources: must be a non-empty list of {', '.join(SOURCES)}, "
                          f"got {sources!r}")
    # ASCII semantics: case-insensitive matching then agrees with the scanner's ASCII keyword check.
    flags = re.ASCII | (re.IGNORECASE if data.get("ignore_case", False) else 0)
    regex = _compile(src, f"{where}] pattern", data["pattern"], flags)
    if regex.search("") is not None:
        raise ConfigError(f"{src}: [{where}] pattern: matches the empty string (it would match every line)")
    for group in regex.groupindex:
        if group not in ("node", "rank"):
            raise ConfigError(f"{src}: [{where}] pattern: named group {group!r} (only 'node' and 'rank' are known)")
    rule = _rule(src, where, {k: v for k, v in data.items() if k in _RULE_KEYS}, _RULE_KEYS, rule_id=sig_id)
    return Signature(rule=rule, pattern=data["pattern"], regex=regex, keywords=keywords,
                     require=_literals(src, where, "require", data.get("require", [])),
                     within=_literals(src, where, "within", data.get("within", [])), sources=frozenset(sources))


def _literals(src: str, where: str, key: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not all(isinstance(v, str) and v for v in items):
        raise ConfigError(f"{src}: [{where}] {key}: must be a non-empty string or a list of them")
    return tuple(dict.fromkeys(v.lower() for v in items))


def _dataclass(cls: type, entries: Mapping[str, tuple[Any, str]], table: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, (value, src) in entries.items():
        if key not in fields:
            raise ConfigError(f"{src}: [{table}]: unknown key {key!r} (known: {', '.join(fields)})")
        default = fields[key].default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, tuple):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        else:
            floor = 1 if cls is Limits else 0
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= floor
        if not ok:
            raise ConfigError(f"{src}: [{table}] {key}: bad value {value!r}")
        values[key] = value
    return cls(**values)


def load_xid_table(rules: "Rules | None" = None) -> Mapping[int, XidInfo]:
    """The Xid table of ``rules`` (default: the shipped rules)."""
    if rules is None:
        rules = default_rules()
    return rules.xids


def xid_info(xid: int, rules: "Rules | None" = None) -> XidInfo:
    """The table row for ``xid``; an unlisted Xid gets the rules' ``unknown_xid`` kind."""
    if rules is None:
        rules = default_rules()
    return rules.xid(xid)


def is_drain_xid(xid: XidEvent, rules: Rules | None = None) -> bool:
    """Whether ``xid`` takes its node out of service by the Xid table (``drain_pattern`` read), else, when the rules
    cannot be loaded, by ``slurm_ft.health.checks.FALLBACK_DRAIN_XIDS`` (a broken rules file never opens the gate)."""
    try:
        return xid_info(xid.xid, rules).kind_for(xid.text) is XidKind.DRAIN
    except (SlurmFtError, ValueError, OSError):
        return xid.xid in FALLBACK_DRAIN_XIDS
