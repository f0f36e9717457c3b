"""Loop: 8-node slurm-ft job on a 10-node lab, kill rank 7 at step 16; report attempt 2's time to first step,
and on a stall dump the warm ranks' stacks (faulthandler via STACK_SIGNAL)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm_ft import faults
from slurm_ft.lab import procs
from slurm_ft.lab.cluster import LabCluster, LabConfig
from slurm_ft.train import records

PY = sys.executable
NODES = int(sys.argv[2]) if len(sys.argv) > 2 else 8
TAG = sys.argv[3] if len(sys.argv) > 3 else "rep"
lab = LabCluster(LabConfig(dir=Path(f"/tmp/lab{TAG}"), nodes=10))
lab.up(fresh=True)
env = dict(os.environ, **lab.env())
os.environ.update(env)
print("lab up", flush=True)
for it in range(int(sys.argv[1])):
    d = Path(f"/tmp/{TAG}/{it}"); shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True); d.chmod(0o755)
    ck = d / "ckpt"
    script = d / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {PY} -m slurm_ft.cli launch --startup-grace 40 --probe-timeout 5 --node-fail-wait 40 -- {PY} -m slurm_ft.train.example --steps 40 --seed 3 --model-size medium --batch-per-rank 12 --step-time 0.2 --ckpt-dir {ck} --ckpt-every 10 --pg-timeout 60 --timeline {d}/timeline.jsonl\n")
    argv = ["sbatch", "--parsable", f"--nodes={NODES + 1}", "--ntasks-per-node=1", "--exclusive", "--job-name=rep", f"--output={d}/slurm-%j.out", f"--chdir={d}",
            "--ft", f"--ft-ckpt-dir={ck}", "--ft-ckpt-every=10", "--ft-max-restarts=5", "--ft-hang-timeout=5", "--ft-spare-nodes=1", "--no-kill", str(script)]
    job = int(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip().split(";")[0])
    t0 = time.time()
    def steps():
        try: return [json.loads(l) for l in open(d / "timeline.jsonl")]
        except OSError: return []
    while not any(e.get("ev") == "step" and e["step"] >= 16 for e in steps()):
        time.sleep(0.2)
        if time.time() - t0 > 180: break
    faults.signal_rank(lab, job, NODES - 1)
    killed = time.time()
    dumped = False
    run_dir = ck / ".slurm-ft"
    while True:
        evs = [json.loads(l) for l in open(run_dir / "events.jsonl")] if (run_dir / "events.jsonl").exists() else []
        a2 = next((e for e in evs if e["event"] == "attempt_start" and e["attempt"] == 2), None)
        f2 = next((e for e in evs if e["event"] == "first_step" and e["attempt"] == 2), None)
        done = any(e["event"] == "exit" for e in evs)
        if f2 or done: break
        if a2 and not dumped and time.time() - a2["time"] > 20:
            dumped = True
            sb = [p for p in procs.all_pids() if "slurm_ft.train.standby" in procs.cmdline(p)]
            kids = [p for p in procs.all_pids() if faults._parent(p) in sb]
            print(f"  STALL: dumping {len(kids)} warm ranks", flush=True)
            info = []
            for p in kids:
                try:
                    st = open(f"/proc/{p}/stat").read(); state = st[st.rfind(")") + 2]
                    wchan = open(f"/proc/{p}/wchan").read()
                    penv = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
                    rank = next((e.split(b"=")[1].decode() for e in penv if e.startswith(b"RANK=")), "?")
                    sigs = {l.split(":")[0]: l.split(":")[1].strip() for l in open(f"/proc/{p}/status") if l.startswith(("SigBlk", "SigCgt", "SigPnd", "ShdPnd", "SigIgn"))}
                    info.append((rank, p, state, wchan, sigs))
                    os.kill(p, records.STACK_SIGNAL)
                except OSError as exc:
                    info.append(("?", p, str(exc), "", {}))
            time.sleep(3)
            for rank, p, state, wchan, sigs in sorted(info, key=lambda x: str(x[0])):
                print(f"  rank {rank} pid {p} state {state} wchan {wchan}", flush=True)
                if state == "R":
                    tasks = {t: open(f"/proc/{p}/task/{t}/stat").read().split(")")[1].split()[0] for t in os.listdir(f"/proc/{p}/task")}
                    print(f"    threads: {tasks}", flush=True)
                    out = subprocess.run(["gdb", "-p", str(p), "-batch", "-ex", "thread apply all bt 15"], capture_output=True, text=True, timeout=90).stdout
                    (d / f"gdb-R-{p}.txt").write_text(out)
            for f in sorted(run_dir.glob("stack.rank*.txt")):
                txt = f.read_text()
                print(f"  {f.name}: {len(txt)} bytes; " + " | ".join(l.strip() for l in txt.splitlines()[:3]), flush=True)
                (d / f"dump-{f.name}").write_text(txt)
        time.sleep(0.5)
    while not any(e["event"] == "exit" for e in ([json.loads(l) for l in open(run_dir / "events.jsonl")])):
        time.sleep(1)
    evs = [json.loads(l) for l in open(run_dir / "events.jsonl")]
    fd = next(e["time"] for e in evs if e["event"] == "fault_detected")
    a2 = next(e["time"] for e in evs if e["event"] == "attempt_start" and e["attempt"] == 2)
    fs = [e for e in evs if e["event"] == "first_step" and e["attempt"] >= 2]
    hung = [e for e in evs if e["event"] == "fault_detected" and e["kind"] == "hung"]
    print(f"it {it}: job {job} killed->attempt2 {a2 - killed:.1f}s attempt2->first {fs[0]['time'] - a2:.1f}s (attempt {fs[0]['attempt']}) hung={len(hung)}", flush=True)
