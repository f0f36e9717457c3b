import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_ft.lab.cluster import LabCluster, LabConfig

lab = LabCluster(LabConfig(dir=Path("/tmp/labsrx"), nodes=8)); lab.up(fresh=True)
env = dict(os.environ, **lab.env())
d = Path("/tmp/srx/job"); d.mkdir(parents=True, exist_ok=True); d.chmod(0o755)
(d / "task.py").write_text("import signal,time,os\nsignal.signal(signal.SIGTERM, lambda *a: None)\nif os.environ['SLURM_PROCID']=='7':\n    time.sleep(3); os.kill(os.getpid(), 9)\ntime.sleep(1000)\n")
(d / "drive.py").write_text(f"""import subprocess,time,signal,sys
for mode in ("no-kill-on-bad-exit", "again"):
    cmd = ["srun","--nodes=8","--ntasks=8","--kill-on-bad-exit=0"] + (["{sys.executable}","{d}/task.py"])
    p = subprocess.Popen(cmd); time.sleep(6)
    steps=subprocess.run(["squeue","-s","-h","-o","%i"],capture_output=True,text=True).stdout.split()
    import os
    mine=[x for x in steps if x.startswith(os.environ["SLURM_JOB_ID"]+".") and not x.endswith(("batch","extern"))]
    print("steps", steps, flush=True)
    t=time.time()
    p.terminate()
    try: p.wait(timeout=30)
    except subprocess.TimeoutExpired: p.kill(); p.wait()
    print(mode, "srun exit after SIGTERM:", round(time.time()-t,2), "s", flush=True)
    time.sleep(3)
""")
(d / "job.sh").write_text(f"#!/bin/bash\nexec {sys.executable} {d}/drive.py\n")
job = subprocess.run(["sbatch","--parsable","--nodes=8","--exclusive",f"--output={d}/out.txt",f"--chdir={d}",str(d/"job.sh")],env=env,capture_output=True,text=True,check=True).stdout.strip()
while True:
    q = subprocess.run(["squeue","-h","-j",job],env=env,capture_output=True,text=True).stdout.strip()
    if not q: break
    time.sleep(1)
print((d/"out.txt").read_text())
lab.down()
