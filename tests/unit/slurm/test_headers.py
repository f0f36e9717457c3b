"""Finding the Slurm headers a SPANK plugin must be built with, and refusing another release's."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ft.core.errors import ConfigError
from slurm_ft.slurm import headers


def _slurm_prefix(root: Path, number: str) -> Path:
    include = root / "include" / "slurm"
    include.mkdir(parents=True)
    (include / "spank.h").write_text("/* spank */\n")
    (include / "slurm_version.h").write_text(f"#define SLURM_VERSION_NUMBER {number}\n")
    for sub, prog in (("sbin", "slurmd"), ("bin", "scontrol")):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / prog).write_text("#!/bin/sh\n")
    return root


@pytest.mark.parametrize("number, version", [("0x190b07", "25.11.7"), ("0x160508", "22.05.8")])
def test_parse_header_version(number, version):
    assert headers.parse_header_version(f"#ifndef X\n#define SLURM_VERSION_NUMBER {number}\n") == version


def test_headers_come_from_the_slurm_first_on_path(tmp_path):
    prefix = _slurm_prefix(tmp_path / "opt", "0x190b07")
    which = {"slurmd": str(prefix / "sbin" / "slurmd")}.get
    found = headers.find_include_dir(which=which, pkg_config=lambda: None)
    assert found == prefix / "include"
    assert headers.check_matches(found, "25.11.7") == "25.11.7"


def test_pkg_config_then_usr_include_when_no_slurm_on_path(tmp_path):
    prefix = _slurm_prefix(tmp_path / "pc", "0x190b07")
    assert headers.find_include_dir(which=lambda _n: None, pkg_config=lambda: str(prefix / "include")) == (
        prefix / "include")


def test_a_mismatch_is_refused_in_one_line_naming_both_versions(tmp_path):
    prefix = _slurm_prefix(tmp_path / "usr", "0x160508")
    with pytest.raises(ConfigError) as info:
        headers.check_matches(prefix / "include", "25.11.7")
    message = str(info.value)
    assert "22.05.8" in message and "25.11.7" in message and "\n" not in message


def test_an_explicit_dir_without_spank_h_is_named(tmp_path):
    with pytest.raises(ConfigError, match=str(tmp_path)):
        headers.find_include_dir(tmp_path)
