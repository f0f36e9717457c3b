"""The monitor's final word where the user looks: the job's run dir and its output file.

A job the monitor stops after it ended (restart budget spent, crash loop, not recoverable) keeps whatever Comment
it had: Slurm 22.05 refuses to change the Comment of a finished job. So the monitor also appends its verdict as a
``stopped`` event to ``<run_dir>/events.jsonl`` (``slurm-ft report`` shows it) and as one line to the job's output
file (``slurm-<id>.out``), besides its own database (``slurm-ft status``).

Both are the user's files and the monitor is root: root writing there could be turned against it (a symlink to a
system file, a FIFO that blocks the daemon, a hard link). So the monitor never writes them itself. It runs one
short child *as the job's user* (its uid and primary gid, no supplementary groups, an empty environment, cwd /,
``python -I``), which appends with ``O_APPEND | O_NOFOLLOW | O_NONBLOCK`` to regular files only and never
creates the output file. What that child can do, the user could do already. The monitor waits at most
``TIMEOUT_S``; a failure is logged and changes nothing else. A monitor that is not root writes only for jobs of
its own uid.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from typing import Any

from slurm_ft.core.rundir import EVENTS_FILE

TIMEOUT_S = 10.0


def tell_user(*, uid: int | None, run_dir: str, output: str, record: dict[str, Any],
              run: Any = subprocess.run) -> str:
    """Append ``record`` to the run dir's events and a line to the output file, as ``uid``; "" or why not."""
    if uid is None:
        return "job uid unknown"
    if not run_dir and not output:
        return "no run dir and no output file"
    me = os.geteuid()
    if me != 0 and me != uid:
        return f"not root: cannot write as uid {uid}"
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        return f"uid {uid} has no passwd entry"
    as_user = {} if me == uid else {"user": uid, "group": gid, "extra_groups": []}
    try:
        done = run([sys.executable, "-I", "-m", "slurm_ft.cluster.stop_note", run_dir, output],
                   input=json.dumps(record), text=True, capture_output=True, timeout=TIMEOUT_S,
                   env={"PATH": "/usr/bin:/bin"}, cwd="/", check=False, **as_user)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")[-300:]


def line_for(record: dict[str, Any]) -> str:
    """The output file's line: ``slurm-ft: stopped by the monitor: cause=C: reason``."""
    return f"slurm-ft: stopped by the monitor: cause={record.get('category')}: {record.get('reason')}\n"


def _append(path: str, text: str, *, create: bool) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)  # events.jsonl, when it has to be created: private, as the launcher makes it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    """The child, as the job's user: ``python -I -m slurm_ft.cluster.stop_note RUN_DIR OUTPUT``, the record on
    stdin."""
    run_dir, output = argv
    record = json.loads(sys.stdin.read())
    failed = []
    for path, text, create in ((os.path.join(run_dir, EVENTS_FILE) if run_dir else "", json.dumps(record) + "\n",
                                True), (output, line_for(record), False)):
        if not path:
            continue
        try:
            _append(path, text, create=create)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
    if failed:
        print("; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
