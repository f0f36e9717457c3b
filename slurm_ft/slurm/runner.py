"""The subprocess boundary for Slurm commands: argument lists in, a CommandResult out, never a shell."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from slurm_ft.core.errors import SlurmCommandError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CommandResult:
    """What one command did."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> "CommandResult":
        """Return self, or raise SlurmCommandError carrying the command and its stderr."""
        if not self.ok:
            raise SlurmCommandError(
                f"{' '.join(self.argv)} failed (exit {self.returncode}): {_one_line(self.stderr or self.stdout)}"
            )
        return self


class Runner(Protocol):
    """Runs one command. Implementations never use a shell."""

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = 30.0) -> CommandResult: ...


def run_command(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float = 30.0) -> CommandResult:
    """The real Runner: ``subprocess.run`` on an argument list; a missing program or a timeout is a result, too."""
    args = tuple(str(a) for a in argv)
    try:
        done = subprocess.run(  # noqa: S603 - argument list, no shell
            list(args), capture_output=True, text=True, env=dict(env) if env is not None else None,
            timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return CommandResult(argv=args, returncode=127, stderr=f"{args[0]}: command not found")
    except subprocess.TimeoutExpired:
        return CommandResult(argv=args, returncode=124, stderr=f"timed out after {timeout:g}s")
    return CommandResult(argv=args, returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def merged_env(overrides: Mapping[str, str] | None) -> dict[str, str]:
    """``os.environ`` with ``overrides`` on top (what a Slurm command of a given cluster needs)."""
    merged = dict(os.environ)
    merged.update(overrides or {})
    return merged


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
