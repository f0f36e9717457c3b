"""Two real throwaway users for tests of the job-side surfaces against another uid: a victim and an attacker.

Created with ``useradd -M -r`` (no home, a system uid, no login shell) under names unique to this test session,
removed at its end (``users`` fixture in tests/conftest.py). Their processes run the system interpreter
(``SYSTEM_PYTHON``: root's own interpreter and torch may not be readable by them) on this checkout
(``PYTHONPATH=REPO``), so what they run needs no torch. Loopback only.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: int
    gid: int

    def env(self, **extra: str) -> dict[str, str]:
        """A plain environment for this user's processes, with this checkout importable."""
        return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/", "USER": self.name,
                "LANG": "C.UTF-8", **extra}

    def popen(self, argv: Sequence[str], env: Mapping[str, str], **kw) -> subprocess.Popen:
        """``argv`` as this user (its uid and primary gid, no supplementary groups)."""
        return subprocess.Popen(list(argv), env=dict(env), user=self.uid, group=self.gid, extra_groups=[], **kw)


def unavailable() -> str:
    """Why two throwaway users cannot be had here ("" when they can)."""
    if os.getuid() != 0:
        return "needs root to create throwaway users"
    if not (shutil.which("useradd") and shutil.which("userdel")):
        return "no useradd/userdel"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"no {SYSTEM_PYTHON} for the throwaway users"
    return ""


def created(roles: Sequence[str]) -> Iterator[dict[str, User]]:
    """The users (one per role), removed afterwards, whatever happened."""
    tag = uuid.uuid4().hex[:8]
    users: dict[str, User] = {}
    try:
        for role in roles:
            name = f"sft{role[0]}{tag}"
            subprocess.run(["useradd", "-M", "-r", "-U", "-s", "/usr/sbin/nologin", name], check=True,
                           capture_output=True, text=True)
            entry = pwd.getpwnam(name)
            users[role] = User(name, entry.pw_uid, entry.pw_gid)
        yield users
    finally:
        for user in users.values():
            subprocess.run(["userdel", user.name], capture_output=True, text=True)


def scratch(owner: User) -> Iterator[Path]:
    """A fresh folder every user may enter (0755), owned by ``owner``, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="slurm-ft-uids-"))
    try:
        os.chmod(path, 0o755)
        os.chown(path, owner.uid, owner.gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
