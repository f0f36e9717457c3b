"""Everything is in pyproject.toml; this only ships the hook sources (spank/, prolog/, epilog/) inside the package,
as ``slurm_ft/hook_sources/``, so that ``slurm-ft admin install`` works from a wheel (see slurm_ft.cluster.admin)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK_SOURCES = {"spank": ("Makefile", "*.c"), "prolog": ("*.in",), "epilog": ("*.in",)}


class BuildPyWithHookSources(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "slurm_ft" / "hook_sources"
        for folder, patterns in HOOK_SOURCES.items():
            (target / folder).mkdir(parents=True, exist_ok=True)
            for pattern in patterns:
                for path in sorted(Path(folder).glob(pattern)):
                    shutil.copy2(path, target / folder / path.name)


setup(cmdclass={"build_py": BuildPyWithHookSources})
