"""``slurm-ft demo --hosts`` on its own lab of hosts: ``link-down`` (CI's representative network fault). Rank 1's
node loses its link for good mid-step: the verdict names that node, the job goes on without it, and its final
parameters equal the clean run's."""

from __future__ import annotations

import pytest

from slurm_ft.bench.demo import DemoConfig, run_demo

pytestmark = pytest.mark.lab


def test_demo_link_down_names_the_node_and_goes_on_without_it(hosts_possible, tmp_path):
    lines: list[str] = []
    table, failed = run_demo(DemoConfig(dir=tmp_path / "demo", scenarios=("link-down",), steps=16, hosts=True),
                             lines.append)
    assert failed == []
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in table.splitlines()
            if "|" in line}
    assert set(rows) == {"fault", "clean", "link-down"}
    [down] = [line for line in lines if "link (rank 1 of job" in line]
    victim = down.split("node ", 1)[1].split("'", 1)[0]
    assert rows["link-down"][1] in ("network", "hardware_node") and rows["link-down"][2] == victim
    assert rows["link-down"][4] != "-" and rows["link-down"][7] == "equal"  # recovered; parameters equal
