"""Errors that reach the user as one clear line and a non-zero exit."""


class SlurmFtError(Exception):
    """A user-facing error: the CLI prints ``slurm-ft: <message>`` and exits with ``exit_code``."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(SlurmFtError, ValueError):
    """A bad configuration value; the message names the field (and flag or file)."""


class SlurmCommandError(SlurmFtError):
    """A Slurm command failed; the message carries the command and its stderr."""

    exit_code = 3


class SlurmFormatError(SlurmFtError, ValueError):
    """Slurm's output is not in the shape slurm-ft reads; the message names the Slurm version, format and field."""

    exit_code = 3
