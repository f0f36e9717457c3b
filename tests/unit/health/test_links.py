"""The link counters: parsed from literal sysfs text, read from a sysfs tree built in tmp, compared."""

from __future__ import annotations

from pathlib import Path

from slurm_ft.health import links
from slurm_ft.health.links import LinkCounters, LinkLoss, LinkSnapshot


def _sysfs(root: Path, eth: dict[str, dict[str, str]], ib: dict[str, dict[str, str]] = {}) -> Path:
    for name, files in eth.items():
        (root / "class/net" / name).mkdir(parents=True)
        for file, text in files.items():
            (root / "class/net" / name / file).write_text(text)
    for port, files in ib.items():
        device, number = port.split("/")
        folder = root / "class/infiniband" / device / "ports" / number / "counters"
        folder.mkdir(parents=True)
        for file, text in files.items():
            (folder / file).write_text(text)
    return root


def test_parse_counter_reads_a_count_and_nothing_else():
    assert links.parse_counter("4\n") == 4
    assert links.parse_counter("0") == 0
    assert links.parse_counter("N/A\n") is None
    assert links.parse_counter("") is None
    assert links.parse_counter("-1") is None


def test_reads_ethernet_and_infiniband_counters_but_not_lo(tmp_path):
    root = _sysfs(tmp_path, {"eth0": {"carrier_changes": "2\n", "carrier_down_count": "1\n", "mtu": "1500\n"},
                             "lo": {"carrier_changes": "0\n"}, "ib0": {"carrier_changes": "bad\n"}},
                  {"mlx5_0/1": {"link_downed": "0\n", "link_error_recovery": "3\n", "port_xmit_data": "9\n"}})
    snap = links.SysfsLinks(root, clock=lambda: 5.0).read("n1")
    assert snap == LinkSnapshot(node="n1", time=5.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_changes": 2, "carrier_down_count": 1}),
        LinkCounters(interface="mlx5_0/1", counters={"link_downed": 0, "link_error_recovery": 3})))


def test_a_node_without_sysfs_has_no_links(tmp_path):
    assert links.read_links("n1", tmp_path / "absent").links == ()


def test_a_flap_is_a_loss_on_that_interface_only():
    before = LinkSnapshot(node="n2", time=1.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_changes": 2, "carrier_down_count": 1}),
        LinkCounters(interface="eth1", counters={"carrier_changes": 2})))
    after = LinkSnapshot(node="n2", time=9.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_changes": 4, "carrier_down_count": 2}),
        LinkCounters(interface="eth1", counters={"carrier_changes": 2})))
    assert links.link_losses(before, after) == (
        LinkLoss(node="n2", interface="eth0", counter="carrier_down_count", before=1, after=2),)
    assert links.link_losses(before, before) == ()
    assert links.losses_text(links.link_losses(before, after)) == \
        "n2: link eth0 went down: carrier_down_count 1 -> 2 (+1)"


def test_carrier_changes_alone_and_infiniband_link_downed_count():
    before = LinkSnapshot(node="n1", time=1.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_changes": 2}),
        LinkCounters(interface="mlx5_0/1", counters={"link_downed": 0, "link_error_recovery": 0})))
    after = LinkSnapshot(node="n1", time=2.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_changes": 3}),
        LinkCounters(interface="mlx5_0/1", counters={"link_downed": 1, "link_error_recovery": 4})))
    assert [(x.interface, x.counter, x.after - x.before) for x in links.link_losses(before, after)] == [
        ("eth0", "carrier_changes", 1), ("mlx5_0/1", "link_downed", 1)]


def test_a_reset_or_a_new_interface_says_nothing():
    before = LinkSnapshot(node="n1", time=1.0, links=(LinkCounters(interface="eth0", counters={"carrier_changes": 7}),))
    after = LinkSnapshot(node="n1", time=2.0, links=(LinkCounters(interface="eth0", counters={"carrier_changes": 1}),
                                                     LinkCounters(interface="veth9", counters={"carrier_changes": 5})))
    assert links.link_losses(before, after) == ()


def test_snapshot_round_trips_and_drops_what_is_not_a_counter():
    snap = LinkSnapshot(node="n1", time=3.5, links=(LinkCounters(interface="eth0", counters={"carrier_changes": 2}),))
    assert LinkSnapshot.from_dict(snap.to_dict()) == snap
    odd = {"node": "n1", "time": 1, "links": {"eth0": {"carrier_changes": True, "link_downed": -1, "x": 3,
                                                       "carrier_down_count": 2}, "../x": {"carrier_changes": 1},
                                              "eth1": "no"}}
    assert LinkSnapshot.from_dict(odd) == LinkSnapshot(node="n1", time=1.0, links=(
        LinkCounters(interface="eth0", counters={"carrier_down_count": 2}),))
    assert LinkSnapshot.from_dict({"node": "n1", "time": "soon", "links": {}}) is None
    assert LinkSnapshot.from_dict([1]) is None
    loss = LinkLoss(node="n1", interface="eth0", counter="carrier_changes", before=2, after=4)
    assert LinkLoss.from_dict(loss.to_dict()) == loss
