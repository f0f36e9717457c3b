"""Prolog gate latency: what slurmd waits for before every job, on a GPU-less host (target: well under 1 s).

Runs the installed-style wrapper (``#!<python> -I`` calling ``slurm_ft.cluster.hooks``) as a subprocess, as slurmd does,
next to a bare ``python -I -c pass`` so the ratio is measured in one run on the same machine:

- pass: healthy node (no NVML library here, no quarantine store yet)
- pass+store: healthy node with an existing quarantine store (one SQLite read)
- fail: TEST-ONLY recorded Xid 79 snapshot -> judged unfit, strike written to the store, drain issued. Slurm is
  stood in for by tiny fake ``sinfo`` (prints recorded 22.05 JSON) and ``scontrol`` (exits 0) on PATH, so the
  figure is slurm-ft's own cost; a real controller adds its RPC latency.

Usage: python bench/bench_prolog.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_ft.cluster.admin import render_wrapper  # noqa: E402
from slurm_ft.cluster.quarantine import Quarantine, QuarantineStore  # noqa: E402


def timed(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float, int]:
    samples, code = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        code = subprocess.run(argv, env=env, capture_output=True, check=False).returncode
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), max(samples), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-prolog-") as tmp:
        d = Path(tmp)
        (d / "nvml").mkdir()
        config = d / "config.toml"
        config.write_text(f'state_dir = "{d / "state"}"\n[health]\ntest_mode = true\n'
                          f'test_nvml_snapshot_dir = "{d / "nvml"}"\n[hooks]\nlog_file = "{d / "hooks.log"}"\n')
        wrapper = d / "slurm-ft-prolog"
        wrapper.write_text(render_wrapper((ROOT / "prolog" / "slurm-ft-prolog.in").read_text(),
                                          python=sys.executable, config=config))
        wrapper.chmod(0o755)
        fake_bin = d / "bin"
        fake_bin.mkdir()
        recorded = ROOT / "tests" / "data" / "slurm" / "sinfo-22.05-drain-down.json"
        (fake_bin / "sinfo").write_text(f"#!/bin/sh\nexec cat {recorded}\n")
        (fake_bin / "scontrol").write_text("#!/bin/sh\nexit 0\n")
        for tool in ("sinfo", "scontrol"):
            (fake_bin / tool).chmod(0o755)
        env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1",
               "SLURM_JOB_UID": str(os.getuid()),
               "SLURM_CONF": str(d / "no-slurm.conf")}
        rows = [("python -I -c pass", timed([sys.executable, "-I", "-c", "pass"], env, args.runs))]
        rows.append(("prolog pass", timed([str(wrapper)], env, args.runs)))
        Quarantine(QuarantineStore(d / "state" / "quarantine.db")).release("n0")  # the store now exists
        rows.append(("prolog pass+store", timed([str(wrapper)], env, args.runs)))
        (d / "nvml" / "n1.json").write_text((ROOT / "tests" / "data" / "nvml" / "xid79.snapshot.json").read_text())
        rows.append(("prolog fail (Xid 79)", timed([str(wrapper)], env, args.runs)))
    base = rows[0][1][0]
    print(f"{'case':<24} {'median s':>9} {'max s':>7} {'x python':>9} {'exit':>5}")
    for name, (median, worst, code) in rows:
        print(f"{name:<24} {median:>9.3f} {worst:>7.3f} {median / base:>9.1f} {code:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
