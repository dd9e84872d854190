"""The RDMA link detector over a port tree in the kernel's sysfs format, on a fake clock (no sockets, no sleeps).

The files are written as the kernel's `drivers/infiniband/core/sysfs.c` prints them: `state` "4: ACTIVE",
`phys_state` "5: LinkUp", `link_layer` "InfiniBand", `counters/link_downed` a decimal count. What the
detector must not do (act on one link-down, on an unused port, on an unreadable file, on a port it was
told to ignore) is tested beside what it must.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from kcover import bus as bus_
from kcover import codec, errors, metrics, model
from kcover.agent import reporting
from kcover.aio import clock as clock_
from kcover.detectors import contract, rdma_link
from kcover.recovery import judging

NODE = "gpu-node-7"
STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
PHYS = {2: "Polling", 3: "Disabled", 5: "LinkUp"}


def write_port(root: Path, device: str, port: int, *, state: int = 4, phys: int = 5, downed: int | None = 0,
               layer: str = "InfiniBand") -> None:
    d = root / device / "ports" / str(port)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "state").write_text(f"{state}: {STATES[state]}\n")
    (d / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")
    (d / "link_layer").write_text(layer + "\n")
    counter = d / "counters" / "link_downed"
    if downed is None:
        counter.unlink(missing_ok=True)
    else:
        counter.write_text(f"{downed}\n")


class Rig:
    def __init__(self, root: Path, **config: object) -> None:
        self.root = root
        self.clock = clock_.FakeClock()
        context = contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics.Metrics(), clock=self.clock,
                                           node_name=NODE)
        self.detector = rdma_link.RdmaLinkDetector(
            "rdma-link", rdma_link.RdmaLinkConfig.model_validate({"sysfs_path": str(root), **config}), context)
        self.bus = bus_.Bus(dedupe_window_seconds=0.0, clock=self.clock.monotonic)
        self.sub = self.bus.subscribe("test")

    async def poll(self, after: float = 5.0) -> list[model.CollectorEvent]:
        """Advance the clock by `after` seconds, read the ports once, and return what was published."""
        self.clock.advance(after)
        ports = await self.detector.reader.read()
        await self.detector.check(self.bus, ports)
        return self.sub.get_nowait()


def faults(events: list[model.CollectorEvent]) -> list[tuple[str, str, bool]]:
    return [(e.reason, e.fault.check, e.cleared) for e in events]


async def test_a_port_that_leaves_active_for_down_seconds_is_a_fault_of_the_node_and_clears_when_back(
        tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_0", 1)
    write_port(tmp_path, "mlx5_3", 1)
    rig = Rig(tmp_path, down_seconds=30)
    assert await rig.poll() == []
    write_port(tmp_path, "mlx5_3", 1, state=1, phys=3)  # administratively down: the counter does not move
    assert await rig.poll(5) == []
    assert await rig.poll(20) == []  # 20 s since a read saw it down: not yet
    events = await rig.poll(10)
    assert faults(events) == [("RdmaLinkDown", "rdma/mlx5_3/1/down", False)]
    event = events[0]
    assert event.target == model.Target(kind=model.TargetKind.NODE, node=NODE, name=NODE)
    assert event.recommended is model.Action.CORDON_NODE_AND_RESTART
    assert event.severity is model.Severity.ERROR
    assert "mlx5_3 port 1 (InfiniBand) is DOWN (physical state Disabled) for 30 s" in event.message
    assert judging.attribute(event) is model.Blame.NODE
    assert await rig.poll(60) == [], "a fault is published once, not on every poll"
    write_port(tmp_path, "mlx5_3", 1)
    assert faults(await rig.poll()) == [("RdmaLinkDownCleared", "rdma/mlx5_3/1/down", True)]


async def test_a_port_never_seen_active_is_not_watched_unless_the_devices_pattern_names_it(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_0", 1)
    write_port(tmp_path, "mlx5_9", 1, state=1, phys=2)  # an unused port: no cable, polling for ever
    rig = Rig(tmp_path, down_seconds=0)
    for _ in range(5):
        assert await rig.poll(60) == []
    expected = Rig(tmp_path, down_seconds=30, devices="mlx5_[0-9]")
    assert await expected.poll() == []
    assert faults(await expected.poll(30)) == [("RdmaLinkDown", "rdma/mlx5_9/1/down", False)]
    narrow = Rig(tmp_path, down_seconds=0, devices="mlx5_0/1")
    for _ in range(3):
        assert await narrow.poll(60) == []


async def test_one_link_down_is_reported_and_not_acted_on_and_a_second_within_the_window_is_a_fault(
        tmp_path: Path) -> None:
    """A leaf switch's reboot takes every port under it down once: that must cordon nothing."""
    write_port(tmp_path, "mlx5_2", 1, downed=7)
    rig = Rig(tmp_path, flaps=2, flap_window_seconds=3600, flap_clear_seconds=7200)
    assert await rig.poll() == []
    write_port(tmp_path, "mlx5_2", 1, downed=8)  # down and up again between two reads
    note = await rig.poll()
    assert faults(note) == [("RdmaLinkFlapped", "", False)]
    assert note[0].recommended is model.Action.REPORT
    assert note[0].severity is model.Severity.WARNING
    assert reporting.fault_key(note[0]) is None, "a note never touches the node condition"
    assert not codec.needs_recovery(note[0])
    assert await rig.poll(1200) == []
    write_port(tmp_path, "mlx5_2", 1, downed=9)
    events = await rig.poll(1200)
    assert faults(events) == [("RdmaLinkFlapping", "rdma/mlx5_2/1/flapping", False)]
    assert events[0].recommended is model.Action.CORDON_NODE_AND_RESTART
    assert codec.needs_recovery(events[0])
    assert reporting.fault_key(events[0]) is not None
    assert "link_downed 9" in events[0].message
    assert await rig.poll(3600) == [], "the fault holds past the window"
    cleared = await rig.poll(3600)
    assert faults(cleared) == [("RdmaLinkFlappingCleared", "rdma/mlx5_2/1/flapping", True)]


async def test_link_downs_further_apart_than_the_window_stay_notes(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_1", 1, downed=0)
    rig = Rig(tmp_path, flaps=2, flap_window_seconds=600)
    await rig.poll()
    for count in range(1, 5):
        write_port(tmp_path, "mlx5_1", 1, downed=count)
        assert faults(await rig.poll(900)) == [("RdmaLinkFlapped", "", False)]


async def test_counters_cleared_after_a_repair_end_the_flapping_fault_at_once(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_1", 1, downed=3)
    rig = Rig(tmp_path, flaps=2)
    await rig.poll()
    write_port(tmp_path, "mlx5_1", 1, downed=6)  # three link-downs between two reads
    assert faults(await rig.poll()) == [("RdmaLinkFlapping", "rdma/mlx5_1/1/flapping", False)]
    write_port(tmp_path, "mlx5_1", 1, downed=0)  # perfquery -R
    assert faults(await rig.poll()) == [("RdmaLinkFlappingCleared", "rdma/mlx5_1/1/flapping", True)]
    write_port(tmp_path, "mlx5_1", 1, downed=1)
    assert faults(await rig.poll()) == [("RdmaLinkFlapped", "", False)], "counted afresh from the cleared counter"


async def test_without_a_counter_each_fall_from_active_is_one_link_down(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_4", 1, downed=None)
    rig = Rig(tmp_path, flaps=2, down_seconds=300)
    await rig.poll()
    write_port(tmp_path, "mlx5_4", 1, state=2, phys=2, downed=None)
    assert faults(await rig.poll()) == [("RdmaLinkFlapped", "", False)]
    write_port(tmp_path, "mlx5_4", 1, downed=None)
    assert await rig.poll() == []
    write_port(tmp_path, "mlx5_4", 1, state=1, phys=2, downed=None)
    events = await rig.poll()
    assert faults(events) == [("RdmaLinkFlapping", "rdma/mlx5_4/1/flapping", False)]
    assert "link_downed unreadable" in events[0].message


async def test_a_port_whose_device_vanishes_is_one_link_down_and_then_missing(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_0", 1)
    write_port(tmp_path, "mlx5_5", 1)
    rig = Rig(tmp_path, down_seconds=30, flaps=3)
    await rig.poll()
    shutil.rmtree(tmp_path / "mlx5_5")  # the NIC fell off the PCIe bus
    assert faults(await rig.poll()) == [("RdmaLinkFlapped", "", False)]
    events = await rig.poll(30)
    assert faults(events) == [("RdmaLinkDown", "rdma/mlx5_5/1/down", False)]
    assert "is missing (its device is gone)" in events[0].message
    write_port(tmp_path, "mlx5_5", 1, downed=0)  # re-probed: a new counter, a new baseline
    assert faults(await rig.poll()) == [("RdmaLinkDownCleared", "rdma/mlx5_5/1/down", True)]


async def test_an_unreadable_or_malformed_state_is_unknown_for_that_read_never_a_fault(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_0", 1)
    rig = Rig(tmp_path, down_seconds=0, flaps=1)
    await rig.poll()
    (tmp_path / "mlx5_0" / "ports" / "1" / "state").write_text("garbage\n")
    for _ in range(3):
        assert await rig.poll() == []
    (tmp_path / "mlx5_0" / "ports" / "1" / "phys_state").unlink()
    assert await rig.poll() == []
    assert rdma_link.read_port(tmp_path / "mlx5_0" / "ports" / "1", "mlx5_0", 1).problem.startswith("state:")
    write_port(tmp_path, "mlx5_0", 1)
    assert await rig.poll() == [], "back as it was: no link-down was counted"


async def test_link_layers_not_listed_are_ignored(tmp_path: Path) -> None:
    write_port(tmp_path, "mlx5_bond_0", 1, layer="Ethernet")
    rig = Rig(tmp_path, down_seconds=0, link_layers=["InfiniBand"])
    await rig.poll()
    write_port(tmp_path, "mlx5_bond_0", 1, state=1, phys=3, downed=4, layer="Ethernet")
    assert await rig.poll() == []


def test_the_kernels_coded_format_is_parsed_and_anything_else_refused() -> None:
    assert rdma_link.parse_coded("4: ACTIVE\n") == (4, "ACTIVE")
    assert rdma_link.parse_coded("7: Phy Test\n") == (7, "Phy Test")
    for bad in ("ACTIVE", ": ACTIVE", "x: ACTIVE", ""):
        with pytest.raises(ValueError, match="expected"):
            rdma_link.parse_coded(bad)
    with pytest.raises(ValueError, match="devices is not a valid regex"):
        rdma_link.RdmaLinkConfig.model_validate({"devices": "mlx5_["})


async def test_a_node_without_rdma_ports_makes_the_detector_unavailable(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "absent")
    with pytest.raises(errors.DetectorUnavailableError, match="no RDMA port under"):
        await rig.detector.run(rig.bus, asyncio.Event())
