"""Site configuration: one TOML file, one section per component.

Each component owns a keyword-only, slotted ``Config`` dataclass validated in ``__post_init__``;
this module only reads the file and turns a section into such a dataclass, naming unknown keys.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from slurm_ft.core import env
from slurm_ft.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class SiteConfig:
    """The parsed site config: raw sections, plus where they came from."""

    sections: Mapping[str, Mapping[str, Any]]
    source: str

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.sections.get(name, {})
        if not isinstance(value, Mapping):
            raise ConfigError(f"{self.source}: [{name}] must be a table, got {type(value).__name__}")
        return value

    def build(self, name: str, cls: type[T], **overrides: Any) -> T:
        """Build component config ``cls`` from section ``name``; ``overrides`` win over the file."""
        return from_mapping(cls, {**self.section(name), **overrides}, where=f"{self.source} [{name}]")


def from_mapping(cls: type[T], values: Mapping[str, Any], *, where: str) -> T:
    """Instantiate dataclass ``cls`` from ``values``; an unknown key is a ConfigError naming it."""
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(fields))})")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_site_config(path: str | os.PathLike[str] | None = None) -> SiteConfig:
    """Read the site config from ``path``, ``$SLURM_FT_CONFIG`` or the default; a missing default is empty."""
    explicit = path is not None or env.SITE_CONFIG in os.environ
    chosen = Path(path if path is not None else os.environ.get(env.SITE_CONFIG, env.DEFAULT_SITE_CONFIG))
    try:
        data = tomllib.loads(chosen.read_text())
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"site config {str(chosen)!r} does not exist") from None
        return SiteConfig(sections={}, source=str(chosen))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"site config {str(chosen)!r} is unreadable: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"site config {str(chosen)!r} is not valid TOML: {exc}") from exc
    return SiteConfig(sections=data, source=str(chosen))


def require(condition: bool, field: str, message: str) -> None:
    """Guard for ``__post_init__``: raise ConfigError ``"<field>: <message>"`` when ``condition`` is false."""
    if not condition:
        raise ConfigError(f"{field}: {message}")


def state_dir(site: SiteConfig | None = None) -> Path:
    """slurm-ft's state directory (quarantine store, node reports): ``$SLURM_FT_STATE_DIR``, else the
    top-level ``state_dir`` key of the site config, else ``/var/lib/slurm-ft``."""
    if os.environ.get(env.STATE_DIR):
        return Path(os.environ[env.STATE_DIR])
    value = site.sections.get("state_dir") if site is not None else None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{site.source}: state_dir must be a string, got {type(value).__name__}")
    return Path(value or env.DEFAULT_STATE_DIR)
