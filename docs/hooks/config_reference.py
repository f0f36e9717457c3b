"""MkDocs hook: the configuration reference, generated from the Config dataclasses' field docstrings.

Each Config documents its fields where they are declared (a docstring under each field, as torchtitan's checkpointer
``Config`` does); this hook reads them from the source with ``ast`` (no import: the docs build needs no torch) and
puts a table per Config where ``configuration.md`` has the marker. A field without a docstring fails the build, so
the reference cannot drift from the code. ``SITE`` lists the site config's sections, ``JOB`` the job-side settings;
``tests/unit/test_docs.py`` checks that every section the code reads from the site config is listed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

MARKER = "<!-- config-reference -->"
ROOT = Path(__file__).resolve().parents[2]

# (title, source file, class): the site config's sections, `/etc/slurm-ft/config.toml`
SITE = (
    ("[health]", "slurm_ft/health/checks.py", "HealthConfig"),
    ("[hooks]", "slurm_ft/cluster/hooks.py", "HooksConfig"),
    ("[quarantine]", "slurm_ft/cluster/quarantine.py", "QuarantineConfig"),
    ("[monitor]", "slurm_ft/cluster/monitor.py", "MonitorConfig"),
)
# job-side and installation settings: flags and the job's environment, not the site config
JOB = (
    ("Checkpoints (`CheckpointConfig`, in each rank)", "slurm_ft/train/checkpoint.py", "CheckpointConfig"),
    ("Automatic interval (`AdaptiveIntervalConfig`)", "slurm_ft/train/interval.py", "AdaptiveIntervalConfig"),
    ("The launcher (`slurm-ft launch`)", "slurm_ft/launch/launcher.py", "LaunchConfig"),
    ("Preemption (`slurm-ft launch`)", "slurm_ft/launch/preempt.py", "PreemptConfig"),
    ("The probe step (`slurm-ft launch`)", "slurm_ft/launch/probe.py", "ProbeConfig"),
    ("Hang evidence (`slurm-ft launch`)", "slurm_ft/launch/hang.py", "HangEvidenceConfig"),
    ("Warm standby (`slurm-ft launch`)", "slurm_ft/launch/standby.py", "StandbyConfig"),
    ("Installation (`slurm-ft admin install`)", "slurm_ft/cluster/admin.py", "InstallConfig"),
)


class UndocumentedField(ValueError):
    """A Config field without a docstring under it."""


def fields_of(source: str, cls: str, where: str = "") -> tuple[str, list[tuple[str, str, str, str]]]:
    """The class docstring and ``(name, type, default, doc)`` of each field of ``cls`` in ``source``."""
    node = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        raise ValueError(f"{where}: no class {cls}")
    rows = []
    for stmt, after in zip(node.body, [*node.body[1:], None]):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        doc = _string(after)
        if doc is None:
            raise UndocumentedField(f"{where}: {cls}.{stmt.target.id} has no docstring under it")
        rows.append((stmt.target.id, ast.unparse(stmt.annotation), _default(stmt.value), " ".join(doc.split())))
    return " ".join((ast.get_docstring(node) or "").split()), rows


def _string(stmt: ast.stmt | None) -> str | None:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return stmt.value.value
    return None


def _default(value: ast.expr | None) -> str:
    if value is None:
        return "required"
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
        for kw in value.keywords:
            if kw.arg == "default_factory":
                return f"{ast.unparse(kw.value)}()"
            if kw.arg == "default":
                return ast.unparse(kw.value)
    return ast.unparse(value)


def table(title: str, path: str, cls: str, root: Path = ROOT) -> str:
    summary, rows = fields_of((root / path).read_text(), cls, path)
    lines = [f"### {title}", "", f"{summary} (`{cls}`, `{path}`)", "", "| key | type | default | meaning |",
             "|---|---|---|---|"]
    lines += [f"| `{name}` | {_cell(kind)} | {_cell(default)} | {doc.replace('|', '&#124;')} |"
              for name, kind, default, doc in rows]
    return "\n".join(lines)


def _cell(code: str) -> str:
    """Code in a table cell: a ``|`` (``int | None``) would end the cell, so the cell is HTML."""
    return f"<code>{code.replace('&', '&amp;').replace('<', '&lt;').replace('|', '&#124;')}</code>"


def reference(root: Path = ROOT) -> str:
    parts = ["## The site config", "",
             "`/etc/slurm-ft/config.toml` (or `$SLURM_FT_CONFIG`), one TOML table per section; an unknown key is an "
             "error naming it. The top-level key `state_dir` (a string, default `/var/lib/slurm-ft`, overridden by "
             "`$SLURM_FT_STATE_DIR`) is where the quarantine store, the job registry and node reports live.", ""]
    parts += [table(*entry, root=root) + "\n" for entry in SITE]
    parts += ["## Job-side and installation settings", "",
              "Set by flags (`sbatch --ft-*`, `slurm-ft launch --*`, `slurm-ft admin install --*`) and the job's "
              "environment, not by the site config.", ""]
    parts += [table(*entry, root=root) + "\n" for entry in JOB]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    if MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
