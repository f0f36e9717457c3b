"""Choosing a SlurmClient backend: pyslurm when it imports and matches the running Slurm, else the CLI."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType

from slurm_ft.core import env as ft_env
from slurm_ft.core.errors import ConfigError, SlurmFtError
from slurm_ft.slurm.cli_backend import CliSlurmClient
from slurm_ft.slurm.formats import same_release
from slurm_ft.slurm.types import SlurmClient

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cli", "pyslurm")


def backend_for(slurm_version: str | None, *,
                import_module: Callable[[str], ModuleType] = importlib.import_module,
                installed_version: Callable[[str], str] = importlib.metadata.version) -> tuple[str, str]:
    """``("pyslurm" | "cli", why)``: pyslurm only when its major.minor equals Slurm's and it imports.

    The version is read from the installed package's metadata first: importing a pyslurm built for another
    release loads that release's libslurm, which may end the process ("Could not establish a configuration
    source") before Python sees an error."""
    if not slurm_version:
        return "cli", "Slurm version unknown"
    try:
        py_version = installed_version("pyslurm")
    except importlib.metadata.PackageNotFoundError:
        return "cli", "pyslurm not installed"
    if not same_release(py_version, slurm_version):
        return "cli", f"pyslurm {py_version or '?'} does not match Slurm {slurm_version}"
    try:
        import_module("pyslurm")
    except Exception as exc:  # noqa: BLE001 - a broken pyslurm build raises more than ImportError
        return "cli", f"pyslurm unavailable ({type(exc).__name__}: {exc})"
    return "pyslurm", f"pyslurm {py_version} matches Slurm {slurm_version}"


def make_client(*, env: Mapping[str, str] | None = None, backend: str | None = None) -> SlurmClient:
    """A SlurmClient. ``backend`` (or ``$SLURM_FT_SLURM_BACKEND``): ``auto`` (default), ``cli`` or ``pyslurm``.

    pyslurm reads the process's own SLURM_CONF, so ``auto`` stays on the CLI when ``env`` points elsewhere.
    """
    choice = (backend or os.environ.get(ft_env.SLURM_BACKEND) or "auto").strip().lower()
    if choice not in BACKENDS:
        raise ConfigError(f"{ft_env.SLURM_BACKEND}: must be one of {', '.join(BACKENDS)}, got {choice!r}")
    cli = CliSlurmClient(env=env)
    if choice == "cli":
        return cli
    if choice == "auto" and env and env.get("SLURM_CONF", os.environ.get("SLURM_CONF")) != os.environ.get(
            "SLURM_CONF"):
        return cli
    try:
        version = cli.version()
    except SlurmFtError as exc:
        version = None
        log.debug("no Slurm version from scontrol: %s", exc)
    picked, why = backend_for(version)
    if choice == "pyslurm" and picked != "pyslurm":
        raise ConfigError(f"{ft_env.SLURM_BACKEND}=pyslurm but {why}")
    log.debug("Slurm backend: %s (%s)", picked, why)
    if picked == "pyslurm":
        from slurm_ft.slurm.pyslurm_backend import PyslurmClient

        return PyslurmClient()
    return cli

