"""The admin's path: ``pip wheel .``, the wheel into a fresh venv, ``slurm-ft admin install`` from it (the SPANK
plugin built from the sources the wheel ships), and the lab's own sbatch loading that plugin."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from labutil import lab_env

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _run(argv, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, check=False, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, argv))}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def test_admin_install_from_a_wheel_in_a_fresh_venv(lab, tmp_path):
    _run([sys.executable, "-m", "pip", "wheel", REPO, "--no-deps", "-q", "-w", tmp_path / "dist"])
    wheel = next((tmp_path / "dist").glob("slurm_ft-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])  # fresh: no torch, no source tree anywhere on its path
    _run([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    where = _run([venv / "bin" / "python", "-I", "-c", "import slurm_ft; print(slurm_ft.__file__)"], cwd="/")
    assert where.stdout.startswith(str(venv))
    prefix = tmp_path / "prefix"
    env = lab_env(lab)  # the Slurm the lab runs: the plugin is built against its headers
    _run([venv / "bin" / "slurm-ft", "admin", "install", "--prefix", prefix, "--config-dir", prefix / "etc",
          "--state-dir", prefix / "state", "--no-systemd"], cwd="/", env=env)
    plugin = prefix / "lib" / "slurm-ft" / "slurm_ft_spank.so"
    assert plugin.is_file()
    assert (prefix / "libexec" / "slurm-ft" / "slurm-ft-prolog").read_text().startswith(f"#!{venv}/bin/python")
    # the lab's sbatch loads the plugin built from the wheel (a copy of its slurm.conf naming another plugstack)
    (tmp_path / "plugstack.conf").write_text(f"required {plugin}\n")
    conf = re.sub(r"(?m)^PlugStackConfig=.*$", f"PlugStackConfig={tmp_path / 'plugstack.conf'}",
                  lab.conf_path.read_text())
    (tmp_path / "slurm.conf").write_text(conf)
    shown = _run(["sbatch", "--help"], env={**env, "SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert "--ft-ckpt-dir=path" in shown.stdout
