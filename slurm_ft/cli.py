"""The ``slurm-ft`` entry point.

Each subcommand lives in its own module, which exposes ``register(subparsers)``; that adds a parser and sets
``func`` (``func(args) -> int``). Modules are imported lazily so that ``slurm-ft classify`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from slurm_ft import __version__
from slurm_ft.core.errors import SlurmFtError

# subcommand -> module providing register(subparsers)
COMMANDS: dict[str, str] = {
    "lab": "slurm_ft.lab.cli",
    "launch": "slurm_ft.launch.cli",
    "monitor": "slurm_ft.cluster.monitor",
    "classify": "slurm_ft.classify.cli",
    "quarantine": "slurm_ft.cluster.quarantine_cli",
    "status": "slurm_ft.cluster.status",
    "report": "slurm_ft.launch.report",
    "bench": "slurm_ft.bench.cli",
    "demo": "slurm_ft.bench.demo",
    "admin": "slurm_ft.cluster.admin",
    "prolog": "slurm_ft.cluster.hooks",
    "epilog": "slurm_ft.cluster.hooks",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurm-ft", description="Fault tolerance for PyTorch training on Slurm.")
    parser.add_argument("--version", action="version", version=f"slurm-ft {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = _wanted_command(argv)
    for name, module in COMMANDS.items():
        if wanted is not None and name != wanted:
            sub.add_parser(name)  # listed in help, imported only when used
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("slurm_ft"):
                sub.add_parser(name, help="(not available in this build)")
                continue
            raise
        mod.register(sub, name)
    return parser


def _wanted_command(argv: list[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at interpreter exit
        return code
    except BrokenPipeError:  # `slurm-ft report --json | head`: end quietly, as a tool killed by SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except SlurmFtError as exc:
        print(f"slurm-ft: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
