"""The README's recipe is the tested trainer, and the restart budget is documented one way everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
