"""The launcher's node probe against real Slurm: inside a 2-node allocation whose second slurmd was just killed
(before Slurm has noticed), the probe names that node and passes the live one."""

from __future__ import annotations

import json
import sys

import pytest
from labutil import cancel, output_of, submit, wait_for, wait_job

pytestmark = pytest.mark.lab

PROBE = ("import json, os, time; from slurm_ft.launch.probe import ProbeConfig, probe_nodes; "
         "from slurm_ft.slurm.parsers import expand_hostlist; "
         "nodes = expand_hostlist(os.environ['SLURM_JOB_NODELIST']); t = time.monotonic(); "
         "healthy = probe_nodes(nodes, os.environ, ProbeConfig(timeout_s=5)); took = time.monotonic() - t; "
         "open('go', 'w').close(); time.sleep(4); t = time.monotonic(); "
         "bad = probe_nodes(nodes, os.environ, ProbeConfig(timeout_s=5)); "
         "print('PROBE ' + json.dumps({'healthy': healthy, 'took': took, 'bad': bad, "
         "'took_bad': time.monotonic() - t}))")


def test_probe_finds_a_dead_slurmd_before_slurm_does(lab, shared_path):
    job_id = submit(lab, f"cd {shared_path}\n{sys.executable} -c \"{PROBE}\"\n", "-N2", "-J", "probe")
    victim = None
    try:
        job = wait_job(lab, job_id, ["RUNNING"], timeout=60)
        wait_for((shared_path / "go").exists, 60, message="the first probe round")
        victim = job.nodes[1]
        lab.stop_node(victim)
        wait_job(lab, job_id, ["COMPLETED", "FAILED"], timeout=60)
        line = next(x for x in output_of(lab, job_id).splitlines() if x.startswith("PROBE "))
        found = json.loads(line[len("PROBE "):])
        assert found["healthy"] == {} and found["took"] < 5
        assert list(found["bad"]) == [victim]
        assert found["took_bad"] < 5 + 2  # bounded by the probe timeout
    finally:
        cancel(lab, job_id)
        if victim is not None:
            lab.start_node(victim)
            wait_for(lambda: next(n for n in lab.client().nodes() if n.name == victim).idle, 60,
                     message=f"{victim} back")
