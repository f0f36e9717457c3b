"""The docs: the README's recipe is the tested trainer, the restart budget is documented one way everywhere, and the
configuration reference is generated from every Config's field docstrings."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_carries_the_minimal_trainer_exactly():
    trainer = (REPO / "examples" / "minimal_train.py").read_text()
    assert len(trainer.splitlines()) <= 40
    assert f"```python\n{trainer}```" in (REPO / "README.md").read_text()


def test_one_restart_budget_in_the_readme_the_example_and_the_help():
    together = "in-place restarts and requeues together"
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"| `--ft-max-restarts=N` | the restart budget: {together} (default 3) |" in readme
    assert together in " ".join((REPO / "examples" / "train_ft.sbatch").read_text().replace("#", " ").split())
    shown = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "launch", "--help"], capture_output=True,
                           text=True, check=True).stdout
    assert together in " ".join(shown.split())
    assert "each" not in (REPO / "examples" / "train_ft.sbatch").read_text().split("--ft-max-restarts")[1][:120]


def test_the_ml_engineer_guide_carries_the_minimal_trainer_exactly():
    trainer = (REPO / "examples" / "minimal_train.py").read_text()
    assert f"```python\n{trainer}```" in (REPO / "docs" / "ml-engineer.md").read_text()


# --- the configuration reference, generated from the Config dataclasses (docs/hooks/config_reference.py) ------
def _reference_hook():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs" / "hooks" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_site_config_section_the_code_reads_is_in_the_reference():
    read = set()
    for path in (REPO / "slurm_ft").rglob("*.py"):
        read |= {(m[1], m[2]) for m in re.finditer(r'site\.build\("(\w+)", (\w+)', path.read_text())}
    listed = {(title.strip("[]"), cls) for title, _, cls in _reference_hook().SITE}
    assert read and read <= listed, f"sections read but not documented: {sorted(read - listed)}"


def test_the_reference_has_every_field_of_every_listed_config_with_its_docstring():
    hook = _reference_hook()
    text = hook.reference()
    for _, path, cls in (*hook.SITE, *hook.JOB):
        module = importlib.import_module(path[:-3].replace("/", "."))
        for field in dataclasses.fields(getattr(module, cls)):
            assert f"| `{field.name}` |" in text, f"{cls}.{field.name} missing from the reference"
    assert "| `strike_window_s` | <code>float</code> | <code>86400.0</code> | Soft strikes older than this" in text


def test_a_config_field_without_a_docstring_fails_the_reference():
    hook = _reference_hook()
    source = 'class C:\n    """C."""\n\n    a: int = 1\n    """A."""\n    b: int | None = None\n'
    with pytest.raises(hook.UndocumentedField, match="C.b has no docstring"):
        hook.fields_of(source, "C")
    assert hook.fields_of(source.replace("None\n", 'None\n    """B."""\n'), "C")[1][1] == ("b", "int | None", "None", "B.")


def test_prolog_scripts_installed_by_the_last_release_still_import_their_main():
    from slurm_ft.cluster.hooks import main
    from slurm_ft.hooks import main as shimmed  # the one-release shim (slurm_ft/hooks.py)

    assert shimmed is main
