"""``slurm-ft demo --hosts`` on its own lab of hosts: ``link-down`` (CI's representative network fault). Rank 1's
node loses its link for good mid-step: the verdict names that node, the job goes on without it, and its final
parameters equal the clean run's."""

from __future__ import annotations

import os

import pytest

from slurm_ft.bench.demo import DemoConfig, run_demo
from slurm_ft.lab.cluster import LabError, check_host_tools, check_prerequisites

pytestmark = pytest.mark.lab


@pytest.fixture
def hosts_possible() -> None:
    try:
        check_prerequisites()
        check_host_tools()
    except LabError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"lab cluster required in CI but unavailable: {exc}", pytrace=False)
        pytest.skip(f"lab cluster unavailable: {exc}")


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
