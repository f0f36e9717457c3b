"""admin install: pure config editing, and a real install into temp dirs (plugin built with make)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_ft import cli
from slurm_ft.cluster.admin import (
    AdminError,
    InstallConfig,
    edit_plugstack,
    edit_slurm_conf,
    install,
    install_in_dir,
    render_wrapper,
    slurm_conf_settings,
)
from slurm_ft.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
needs_cc = pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None
                              or not Path("/usr/include/slurm/spank.h").exists(),
                              reason="needs make, a C compiler and libslurm-dev headers")

WANTED = {"Prolog": "/opt/ft/prolog", "Epilog": "/opt/ft/epilog", "PrologFlags": "Alloc",
          "SchedulerParameters": "nohold_on_prolog_fail", "PrologEpilogTimeout": "90"}


def test_edit_adds_and_merges_without_touching_the_rest() -> None:
    text = ("# site\nClusterName=c1\nprologflags=Contain  # keep\nSchedulerParameters=bf_interval=30\n"
            "NodeName=g[1-4] CPUs=64 Gres=gpu:8\nPrologEpilogTimeout=300\n")
    new, changes = edit_slurm_conf(text, WANTED)
    assert "prologflags=Contain" not in new and "PrologFlags=Contain,Alloc" in new
    assert "SchedulerParameters=bf_interval=30,nohold_on_prolog_fail" in new
    assert "NodeName=g[1-4] CPUs=64 Gres=gpu:8" in new and "# site\nClusterName=c1" in new
    assert "PrologEpilogTimeout=300" in new and "PrologEpilogTimeout=90" not in new  # the site's wins
    assert new.endswith("# slurm-ft (slurm-ft admin install)\nProlog=/opt/ft/prolog\nEpilog=/opt/ft/epilog\n")
    assert changes == ["added Prolog=/opt/ft/prolog", "added Epilog=/opt/ft/epilog",
                       "merged PrologFlags: Contain -> Contain,Alloc",
                       "merged SchedulerParameters: bf_interval=30 -> bf_interval=30,nohold_on_prolog_fail"]
    again, changes = edit_slurm_conf(new, WANTED)
    assert again == new and changes == []


def test_another_prolog_is_a_conflict_naming_it() -> None:
    with pytest.raises(AdminError, match="slurm.conf already sets Prolog=/etc/slurm/nhc-prolog"):
        edit_slurm_conf("Prolog=/etc/slurm/nhc-prolog\n", WANTED)


def test_plugstack_edit() -> None:
    line = "required /opt/ft/lib/slurm_ft_spank.so"
    new, changed = edit_plugstack("optional /usr/lib/slurm/spank_pyxis.so\n", line)
    assert changed and new == f"optional /usr/lib/slurm/spank_pyxis.so\n{line}\n"
    assert edit_plugstack(new, line) == (new, False)
    moved, changed = edit_plugstack("required /old/slurm_ft_spank.so\n", line)
    assert changed and moved == f"{line}\n"


def test_wrapper_quotes_the_config_path() -> None:
    text = render_wrapper((ROOT / "prolog" / "slurm-ft-prolog.in").read_text(), python="/usr/bin/python3",
                          config=Path('/etc/odd"name/config.toml'), slurm_bin=Path("/usr/bin"))
    assert text.startswith("#!/usr/bin/python3 -I\n")
    compile(text, "wrapper", "exec")
    assert '"/etc/odd\\"name/config.toml"' in text


@pytest.mark.parametrize("kind", ["prolog/slurm-ft-prolog.in", "prolog/slurm-ft-healthcheck.in",
                                  "epilog/slurm-ft-epilog.in"])
def test_wrappers_put_the_installed_slurms_commands_first_on_path(kind, tmp_path) -> None:
    """slurmd runs hooks with its own PATH, where a 22.05 scontrol could answer for a 25.11 cluster (and fail)."""
    text = render_wrapper((ROOT / kind).read_text(), python="/usr/bin/python3", config=tmp_path / "c.toml",
                          slurm_bin=Path("/opt/slurm-25.11/bin"))
    head = text.split("from slurm_ft.cluster.hooks import main")[0]
    scope = {"__name__": "wrapper"}
    env = {"PATH": "/usr/bin"}
    exec(compile(head.replace("os.environ", "ENV"), kind, "exec"), {**scope, "ENV": env})  # noqa: S102
    assert env["PATH"].split(":")[0] == "/opt/slurm-25.11/bin"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"prefix": Path("relative")}, "prefix"), ({"state_dir": Path("/var/lib/my state")}, "state_dir"),
    ({"edit": True}, "edit"), ({"slurm_user": "Robert'); DROP"}, "slurm_user"),
])
def test_bad_install_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        InstallConfig(**kwargs)


def config_in(tmp: Path, **kwargs) -> InstallConfig:
    return InstallConfig(prefix=tmp / "usr", config_dir=tmp / "etc" / "slurm-ft", state_dir=tmp / "var" / "ft",
                         systemd_dir=tmp / "systemd", **kwargs)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    result = install(config_in(tmp_path), dry_run=True)
    assert list(tmp_path.iterdir()) == [] and result.notes == ["dry run: nothing written"]
    assert f"Prolog={tmp_path}/usr/libexec/slurm-ft/slurm-ft-prolog" in result.slurm_conf_lines
    assert result.plugstack_line == f"required {tmp_path}/usr/lib/slurm-ft/slurm_ft_spank.so"


@needs_cc
def test_install_edits_slurm_conf_with_backup_and_is_idempotent(tmp_path: Path) -> None:
    conf = tmp_path / "slurm" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("ClusterName=c1\nPrologFlags=Contain\n")
    conf.chmod(0o640)
    cfg = config_in(tmp_path, slurm_conf=conf, edit=True)
    result = install(cfg)
    plugin = tmp_path / "usr" / "lib" / "slurm-ft" / "slurm_ft_spank.so"
    dynamic = subprocess.run(["readelf", "-d", str(plugin)], capture_output=True, text=True, check=True).stdout
    assert "BIND_NOW" in dynamic  # -z now (full RELRO)
    text = conf.read_text()
    assert f"Prolog={cfg.wrapper('prolog')}" in text and "PrologFlags=Contain,Alloc" in text
    assert oct(conf.stat().st_mode & 0o777) == "0o640"
    (backup,) = result.backups
    assert Path(backup).read_text() == "ClusterName=c1\nPrologFlags=Contain\n"
    assert (tmp_path / "slurm" / "plugstack.conf").read_text() == f"required {plugin}\n"
    assert (tmp_path / "systemd" / "slurm-ft-monitor.service").read_text().count("ExecStart=") == 1
    site = (tmp_path / "etc" / "slurm-ft" / "config.toml").read_text()
    assert f'state_dir = "{tmp_path}/var/ft"' in site and "test_mode" not in site
    # the installed prolog runs and passes on this GPU-less host
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "3"}
    done = subprocess.run([str(cfg.wrapper("prolog"))], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "slurm-ft prolog job=3 node=n1: ok" in done.stderr
    # a second install changes nothing and keeps the site's config
    (tmp_path / "etc" / "slurm-ft" / "config.toml").write_text(site + "# mine\n")
    again = install(cfg)
    assert again.backups == [] and str(tmp_path / "etc" / "slurm-ft" / "config.toml") in again.kept
    assert (tmp_path / "etc" / "slurm-ft" / "config.toml").read_text().endswith("# mine\n")


@needs_cc
def test_a_conflict_stops_before_slurm_conf_changes(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("Prolog=/etc/slurm/other\n")
    with pytest.raises(AdminError, match="Prolog=/etc/slurm/other"):
        install(config_in(tmp_path, slurm_conf=conf, edit=True))
    assert conf.read_text() == "Prolog=/etc/slurm/other\n" and not list(tmp_path.glob("slurm.conf.*"))


@needs_cc
def test_an_invalid_existing_site_config_stops_the_install(tmp_path: Path) -> None:
    (tmp_path / "etc" / "slurm-ft").mkdir(parents=True)
    (tmp_path / "etc" / "slurm-ft" / "config.toml").write_text("[health]\nexpected_gpus = -1\n")
    with pytest.raises(AdminError, match="expected_gpus: must be a non-negative integer"):
        install(config_in(tmp_path))


@needs_cc
def test_install_in_dir(tmp_path: Path) -> None:
    lines = install_in_dir(tmp_path, config_dir=tmp_path / "etc" / "slurm-ft", state_dir=tmp_path / "state",
                           slurm_user="root")
    keys = [line.split("=", 1)[0] for line in lines]
    assert keys == ["Prolog", "Epilog", "PlugStackConfig", "PrologFlags", "SchedulerParameters",
                    "PrologEpilogTimeout"]
    assert "SchedulerParameters=nohold_on_prolog_fail" in lines  # merged into the lab's own line by the lab
    site = (tmp_path / "etc" / "slurm-ft" / "config.toml").read_text()
    assert "test_mode = true" in site and f'test_nvml_snapshot_dir = "{tmp_path}/test-nvml"' in site
    assert (tmp_path / "test-nvml").is_dir() and os.access(tmp_path / "slurm-ft/libexec/slurm-ft/slurm-ft-epilog",
                                                           os.X_OK)


@needs_cc
def test_spank_selftest(tmp_path: Path) -> None:
    done = subprocess.run(["make", "-s", "-C", str(ROOT / "spank"), f"OUT={tmp_path}", "test"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "spank selftest: ok (0 failures)" in done.stdout, done.stdout + done.stderr


def test_cli_dry_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["admin", "install", "--dry-run", "--json", "--prefix", str(tmp_path / "p"),
                     "--config-dir", str(tmp_path / "c"), "--no-systemd"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plugstack_line"].endswith("/p/lib/slurm-ft/slurm_ft_spank.so") and data["written"] == []


def test_cli_refuses_non_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                              tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["admin", "install", "--prefix", str(tmp_path)]) == 77
    assert "run it as root" in capsys.readouterr().err


def test_settings_cover_what_the_prolog_needs() -> None:
    settings = slurm_conf_settings(InstallConfig())
    assert settings["Prolog"] == "/usr/local/libexec/slurm-ft/slurm-ft-prolog"
    assert settings["PlugStackConfig"] == "/etc/slurm/plugstack.conf"


def test_the_site_default_checkpoint_dir_goes_on_the_plugstack_line(tmp_path):
    from slurm_ft.cluster.admin import InstallConfig, plugstack_line
    from slurm_ft.core.errors import ConfigError

    cfg = InstallConfig(prefix=tmp_path, default_ckpt_dir=Path("/scratch/ckpt"))
    assert plugstack_line(cfg) == f"required {tmp_path}/lib/slurm-ft/slurm_ft_spank.so default_ckpt_dir=/scratch/ckpt"
    with pytest.raises(ConfigError, match="default_ckpt_dir: must be an absolute path"):
        InstallConfig(prefix=tmp_path, default_ckpt_dir=Path("ckpt"))
