"""The attempt's rendezvous store, held open on the launcher's node: every rank connects, no rank hosts it.

Without it, rank 0 starts torch's TCPStore server inside ``init_process_group`` and the other ranks connect to it.
A rank that comes before rank 0's server listens is refused and retries with torch's backoff, so a rank 0 late by
0.1 s costs every rank about 0.6 s more (4 gloo ranks on this host: 0.63 s added with rank 0 hosting, 0.006 s with
a store already listening; ``bench/bench_rendezvous.py``, ``bench/reference/2026-12-05-launcher-store/``). Restarted ranks come up at different
times (standbys, srun on each node), so a restart paid it nearly every time.

The launcher starts ``python -m slurm_ft.launch.store`` once, when the first attempt trains (it imports torch:
seconds, off every critical path), and before each later attempt asks it for a store (``open``). The keeper opens
a fresh TCPStore server on a free port for every attempt (as torch elastic's agent does: a dead attempt's keys
never reach the next process group) and closes the one before. The ranks get its address and port as
``MASTER_ADDR``/``MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE=True``, torch's own switch for "the agent
holds the store": ``init_process_group`` (``env://`` and ``tcp://``) then connects as a client on every rank, and
the user's script is unchanged.

Protocol, one line each way: the keeper prints ``ready`` once torch is imported; for ``open`` it prints ``port
N``. It exits when its stdin closes (the launcher is gone). Anything else (no keeper yet, a dead one, a slow
answer) and the attempt falls back to rank 0 hosting the store: a keeper can make a restart faster, never make
one fail.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # torch.distributed.rendezvous: "True" -> every rank is a client
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torch < 2.4 read it (a key prefix per attempt) with the above
OPEN_TIMEOUT_S = 2.0  # how long the launcher waits for a ready keeper's port


class StoreKeeper:
    """The launcher's handle on its keeper process (``python -m slurm_ft.launch.store``) on this node."""

    def __init__(self, python: str, addr: str, *, environ: Mapping[str, str] | None = None,
                 open_timeout_s: float = OPEN_TIMEOUT_S) -> None:
        self.python, self.addr, self.open_timeout_s = python, addr, open_timeout_s
        self.environ = dict(os.environ if environ is None else environ)
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._ready = False
        self._broken = False

    def start(self) -> None:
        """Start the keeper (once; it imports torch in the background)."""
        if self._proc is not None or self._broken:
            return
        try:
            self._proc = subprocess.Popen([self.python, "-m", "slurm_ft.launch.store"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.environ,
                                          start_new_session=True)
        except OSError:
            self._broken = True

    def open(self) -> tuple[str, int] | None:
        """A fresh store's address and port for the next attempt, or None (no keeper ready: rank 0 hosts it)."""
        proc = self._proc
        if proc is None or self._broken or proc.poll() is not None:
            return None
        if not self._ready:
            self._ready = self._line(0.0) == "ready"
            if not self._ready:
                return None  # still importing torch
        try:
            proc.stdin.write(b"open\n")
            proc.stdin.flush()
        except OSError:
            return self._give_up()
        word, _, port = (self._line(self.open_timeout_s) or "").partition(" ")
        return (self.addr, int(port)) if word == "port" and port.isdigit() else self._give_up()

    def close(self) -> None:
        """Close the keeper's stdin (it exits) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _give_up(self) -> None:
        self._broken = True
        self.close()
        return None

    def _line(self, timeout_s: float) -> str | None:
        """The keeper's next line within ``timeout_s``, or None."""
        deadline = time.monotonic() + timeout_s
        out = self._proc.stdout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if not select.select([out], [], [], max(left, 0.0))[0]:
                return None
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()


def keep() -> int:
    """The keeper: one TCPStore server per ``open``, the newest kept, until stdin closes."""
    import datetime

    from torch.distributed import TCPStore

    print("ready", flush=True)
    store = None
    for line in sys.stdin:
        if line.strip() != "open":
            continue
        store = None  # the last attempt's store closes (its ranks are gone)
        store = TCPStore("0.0.0.0", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
        print(f"port {store.port}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(keep())
