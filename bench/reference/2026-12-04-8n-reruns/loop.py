"""Loop: 8-node slurm-ft job on a 10-node lab, kill rank 7 at step 16; report attempt 2's time to first step,
and on a stall dump the warm ranks' stacks (faulthandler via STACK_SIGNAL)."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path
from slurm_ft.lab.cluster import LabCluster, LabConfig
from slurm_ft import faults
from slurm_ft.train import records
from slurm_ft.lab import procs
PY = sys.executable
lab = LabCluster(LabConfig(dir=Path("/tmp/labrep"), nodes=10))
lab.up(fresh=True)
env = dict(os.environ, **lab.env())
os.environ.update(env)
print("lab up", flush=True)
for it in range(int(sys.argv[1])):
    d = Path(f"/tmp/rep/{it}"); shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True); d.chmod(0o755)
    ck = d / "ckpt"
    script = d / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {PY} -m slurm_ft.cli launch --startup-grace 40 --probe-timeout 5 --node-fail-wait 40 -- {PY} -m slurm_ft.train.example --steps 40 --seed 3 --model-size medium --batch-per-rank 12 --step-time 0.2 --ckpt-dir {ck} --ckpt-every 10 --pg-timeout 60 --timeline {d}/timeline.jsonl\n")
    argv = ["sbatch", "--parsable", "--nodes=9", "--ntasks-per-node=1", "--exclusive", "--job-name=rep", f"--output={d}/slurm-%j.out", f"--chdir={d}",
            "--ft", f"--ft-ckpt-dir={ck}", "--ft-ckpt-every=10", "--ft-max-restarts=5", "--ft-hang-timeout=5", "--ft-spare-nodes=1", "--no-kill", str(script)]
    job = int(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip().split(";")[0])
    t0 = time.time()
    def steps():
        try: return [json.loads(l) for l in open(d / "timeline.jsonl")]
        except OSError: return []
    while not any(e.get("ev") == "step" and e["step"] >= 16 for e in steps()):
        time.sleep(0.2)
        if time.time() - t0 > 180: break
    faults.signal_rank(lab, job, 7)
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
            for p in kids:
                try: os.kill(p, records.STACK_SIGNAL)
                except OSError: pass
                out = subprocess.run(["gdb", "-p", str(p), "-batch", "-ex", "thread apply all bt 12"], capture_output=True, text=True, timeout=60).stdout
                (d / f"gdb.{p}.txt").write_text(out)
        time.sleep(0.5)
    while not any(e["event"] == "exit" for e in ([json.loads(l) for l in open(run_dir / "events.jsonl")])):
        time.sleep(1)
    evs = [json.loads(l) for l in open(run_dir / "events.jsonl")]
    fd = next(e["time"] for e in evs if e["event"] == "fault_detected")
    a2 = next(e["time"] for e in evs if e["event"] == "attempt_start" and e["attempt"] == 2)
    fs = [e for e in evs if e["event"] == "first_step" and e["attempt"] >= 2]
    hung = [e for e in evs if e["event"] == "fault_detected" and e["kind"] == "hung"]
    print(f"it {it}: job {job} killed->attempt2 {a2 - killed:.1f}s attempt2->first {fs[0]['time'] - a2:.1f}s (attempt {fs[0]['attempt']}) hung={len(hung)}", flush=True)
