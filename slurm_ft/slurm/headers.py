"""Which Slurm headers a SPANK plugin must be compiled against: those of the Slurm that will load it.

slurmd refuses a plugin built for another release ("Incompatible Slurm plugin ... version"), so the headers are
found from the Slurm first on PATH (``<prefix>/include`` beside the ``sbin/slurmd`` or ``bin/scontrol`` found
first), else from
``pkg-config slurm``, else ``/usr/include``; an explicit directory wins over all of them. Their
``SLURM_VERSION_NUMBER`` must name the same major.minor as the running ``scontrol --version``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from slurm_ft.core.errors import ConfigError
from slurm_ft.slurm.formats import same_release

VERSION_HEADER = Path("slurm") / "slurm_version.h"
SPANK_HEADER = Path("slurm") / "spank.h"
_VERSION_NUMBER = re.compile(r"^\s*#\s*define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+|\d+)", re.MULTILINE)


def parse_header_version(text: str) -> str:
    """``"25.11.7"`` from slurm_version.h's ``#define SLURM_VERSION_NUMBER 0x190b07``."""
    match = _VERSION_NUMBER.search(text)
    if not match:
        raise ConfigError("slurm_version.h: no SLURM_VERSION_NUMBER")
    number = int(match.group(1), 0)
    return f"{(number >> 16) & 0xFF:02d}.{(number >> 8) & 0xFF:02d}.{number & 0xFF}"


def find_include_dir(explicit: Path | None = None, *, which: Callable[[str], str | None] = shutil.which,
                     pkg_config: Callable[[], str | None] | None = None) -> Path:
    """The include directory holding ``slurm/spank.h`` for the Slurm first on PATH (or ``explicit``)."""
    if explicit is not None:
        if not (explicit / SPANK_HEADER).is_file():
            raise ConfigError(f"slurm include dir: no {explicit / SPANK_HEADER}")
        return explicit
    candidates: list[Path] = []
    for name in ("slurmd", "scontrol"):
        program = which(name)
        if program:
            candidates.append(Path(program).resolve().parent.parent / "include")
    from_pkg = (pkg_config or _pkg_config_includedir)()
    if from_pkg:
        candidates.append(Path(from_pkg))
    candidates.append(Path("/usr/include"))
    for candidate in candidates:
        if (candidate / SPANK_HEADER).is_file():
            return candidate
    raise ConfigError("building the SPANK plugin needs Slurm's headers (slurm/spank.h): none under "
                      f"{', '.join(str(c) for c in candidates)}; install libslurm-dev or give --slurm-include DIR")


def find_program(name: str, *, which: Callable[[str], str | None] = shutil.which) -> str | None:
    """``name`` on PATH, else in /usr/sbin (often not on PATH), else None."""
    found = which(name)
    if found:
        return found
    fallback = Path("/usr/sbin") / name
    return str(fallback) if fallback.is_file() else None


def header_version(include_dir: Path) -> str:
    """The Slurm version the headers in ``include_dir`` belong to."""
    path = include_dir / VERSION_HEADER
    try:
        return parse_header_version(path.read_text(errors="replace"))
    except OSError as exc:
        raise ConfigError(f"slurm include dir: cannot read {path}: {exc.strerror}") from exc


def check_matches(include_dir: Path, running: str) -> str:
    """The headers' version; refuses headers of another release than the running Slurm's."""
    built_for = header_version(include_dir)
    if not same_release(built_for, running):
        raise ConfigError(f"Slurm headers in {include_dir} are {built_for} but the running Slurm is {running}: "
                          "slurmd would refuse the plugin; give --slurm-include for the running release")
    return built_for


def _pkg_config_includedir() -> str | None:
    if shutil.which("pkg-config") is None:
        return None
    done = subprocess.run(["pkg-config", "--variable=includedir", "slurm"], capture_output=True, text=True,
                          timeout=10, check=False, stdin=subprocess.DEVNULL)
    return done.stdout.strip() or None if done.returncode == 0 else None
