"""The launcher's signals answered from a thread under the GIL: stacks asked for while other threads run Python."""

import os
import subprocess
import sys
import textwrap

from slurm_ft.core import rundir as records
from slurm_ft.launch.hang import main_thread_in_collective
from slurm_ft.train import stacks

BUSY_RANK = textwrap.dedent("""
    import os, pathlib, subprocess, sys, threading
    from slurm_ft.train.heartbeat import HeartbeatWriter
    run_dir, asks = sys.argv[1], int(sys.argv[2])
    writer = HeartbeatWriter(run_dir, 0, liveness_s=0)
    writer.beat(1)

    def busy_checkpoint_thread():  # frames made and freed all the time, as a checkpoint thread's
        def nest(n):
            return pathlib.Path("/a/b") / str(n) if n == 0 else nest(n - 1)
        while True:
            for depth in range(30, 40):
                nest(depth)

    for _ in range(3):
        threading.Thread(target=busy_checkpoint_thread, daemon=True).start()
    sender = (f"import os, time\\nfor _ in range({asks}):\\n    os.kill({os.getpid()}, {writer._stack_signal})"
              "\\n    time.sleep(0.0005)")
    subprocess.run([sys.executable, "-c", sender], check=True)  # the main thread waits in C, as in a collective
    print("alive")
""")


def test_stacks_asked_for_many_times_while_threads_run_python_never_crash_the_rank(tmp_path):
    # faulthandler registered on the stack signal (the old way) died of SIGSEGV here within a second, every time
    done = subprocess.run([sys.executable, "-c", BUSY_RANK, str(tmp_path), "5000"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert done.returncode == 0 and "alive" in done.stdout, done.stderr[-2000:]
    text = records.stack_path(tmp_path, 0).read_text()
    assert "busy_checkpoint_thread" in text and '"MainThread"' in text


def test_a_stack_dump_puts_the_main_thread_first_with_its_name():
    text = stacks.format_all()
    first = text.split("\n\n")[0]
    assert first.startswith("Thread 0x") and '"MainThread"' in first
    assert "test_a_stack_dump_puts_the_main_thread_first_with_its_name" in first
    assert main_thread_in_collective(text) is False


def test_a_stack_dump_is_written_private_and_whole(tmp_path):
    path = stacks.dump(tmp_path, 3)
    assert path == records.stack_path(tmp_path, 3)
    assert oct(path.stat().st_mode & 0o777) == oct(records.PRIVATE_FILE)
    assert path.read_text().endswith("\n") and not list(tmp_path.glob(".*.tmp"))
