"""The package's shape: no import cycles, and no import from a lower layer to a higher one.

Every ``import`` is counted, those inside functions too (a lazy import hides a dependency, it does not remove it).
The layers, lowest first: ``core`` <- (``slurm``, ``health``, ``classify``, ``train``) <- (``launch``, ``cluster``)
<- (``lab``, ``bench``, ``cli``); ``ALLOWED`` says exactly which folders each may import. ``launch`` (the job's
supervisor, as the user) and ``cluster`` (root) never import each other: what they share is in ``core``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "slurm_ft"

# folder -> the folders it may import (besides itself and the package root's ``__version__``)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "slurm": {"core"},
    "health": {"core", "slurm"},
    "classify": {"core", "health", "slurm"},
    "train": {"core", "slurm"},
    "launch": {"core", "slurm", "health", "classify", "train"},
    "cluster": {"core", "slurm", "health", "classify", "train"},
    "lab": {"core", "slurm", "health", "classify", "train", "launch", "cluster"},
    "bench": {"core", "slurm", "health", "classify", "train", "launch", "cluster", "lab"},
    "cli": {"core"},  # cli.py names its subcommands' modules as strings, imported by importlib
    "hooks": {"cluster"},  # the one-release shim for installed prolog/epilog scripts
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The slurm_ft modules ``name`` imports anywhere in its file (``from pkg import mod`` counts as ``pkg.mod``)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def folder(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def forbidden(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in edges.items():
        here = folder(src)
        for dst in targets:
            there = folder(dst)
            if there in ("", here):
                continue  # the package root (its __version__) or the same folder
            if there not in ALLOWED.get(here, set()):
                bad.append(f"{src} -> {dst} ({here} may not import {there})")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle or a knot of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_folder_is_in_the_layer_table():
    folders = {folder(name) for name in modules()} - {""}
    assert folders <= set(ALLOWED), f"folders without a layer: {sorted(folders - set(ALLOWED))}"


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert forbidden(graph()) == []


def test_launch_and_cluster_never_import_each_other():
    assert "cluster" not in ALLOWED["launch"] and "launch" not in ALLOWED["cluster"]


def test_the_checker_sees_a_cycle_and_a_wrong_direction():
    edges = {"slurm_ft.core.a": {"slurm_ft.launch.b"}, "slurm_ft.launch.b": {"slurm_ft.core.a"}}
    assert cycles(edges) == [["slurm_ft.core.a", "slurm_ft.launch.b"]]
    assert forbidden(edges) == ["slurm_ft.core.a -> slurm_ft.launch.b (core may not import launch)"]


def test_the_checker_counts_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from slurm_ft.cluster import monitor\n")
    assert imports_of("slurm_ft.launch.m", source, {"slurm_ft.cluster.monitor", "slurm_ft.cluster"}) \
        == {"slurm_ft.cluster.monitor"}
