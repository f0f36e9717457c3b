"""A rank's Python stacks, every thread, written to ``stack.rank<R>.txt`` of the run dir when the launcher asks.

Written from the signal server's thread (``slurm_ft.train.wakeup``) under the GIL, from ``sys._current_frames()``:
never from a C-level signal handler, which would walk threads that are running Python (``faulthandler``'s
``all_threads``: a SIGSEGV when one of them is busy). The text follows faulthandler's layout, one block per thread,
blocks separated by an empty line, most recent call first, with the thread's name quoted in its header (the
launcher's ``main_thread_in_collective`` finds the main thread by ``"MainThread"`` or ``<module>``)::

    Thread 0x00007f3a2c1ff740 "MainThread" (most recent call first):
      File "/x/train.py", line 40 in step
      File "/x/train.py", line 90 in <module>
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import FrameType

from slurm_ft.core import rundir as records


def format_thread(ident: int, name: str, frame: FrameType | None) -> str:
    """One thread's block: its header, then its frames from the innermost out."""
    lines = [f'Thread 0x{ident:016x} "{name}" (most recent call first):']
    while frame is not None:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        frame = frame.f_back
    return "\n".join(lines)


def format_all() -> str:
    """Every thread's block; the main thread's first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()  # noqa: SLF001 - the documented way to see other threads' frames, GIL held
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: ident != main)
    return "\n\n".join(format_thread(i, names.get(i, "?"), frames[i]) for i in order) + "\n"


def dump(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Write the stacks of every thread to the rank's stack file (private, via a temp file and rename: the
    launcher never reads half a dump)."""
    path = records.stack_path(run_dir, rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = records.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as fh:
        fh.write(format_all())
    os.replace(tmp, path)
    return path
