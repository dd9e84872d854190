"""Parsers and rules on recorded mx-smi / ibv_devinfo output (tests/fixtures, see SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kcover_metax import checking, parsing

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_gpu_list_excerpt() -> None:
    statuses = parsing.parse_gpu_list(fixture("kcover-mx-smi-L-excerpt.txt"))
    assert statuses == {"GPU#0": "Available", "GPU#7": "Available"}
    # The excerpt holds 2 of the node's 8 GPUs: a full node's check would fail on it.
    assert not checking.gpu_count(statuses, expected=8).ok
    assert checking.gpu_count(statuses, expected=2).ok


def test_temperatures_two_gpus() -> None:
    hotspots = parsing.parse_hotspot_temperatures(fixture("kcover-mx-smi-show-temperature-2gpu-mxc500.txt"))
    assert hotspots == {"GPU#0": 39.0, "GPU#1": 39.25}
    assert checking.temperature(hotspots, limit_celsius=85).ok
    hot = checking.temperature(hotspots, limit_celsius=39.25)
    assert (hot.ok, hot.offenders) == (False, ("GPU#1=39.25C",))
    assert parsing.parse_attached_gpus(fixture("kcover-mx-smi-show-temperature-2gpu-mxc500.txt")) == 2


def test_double_bit_ecc_three_gpus_mixed_indentation() -> None:
    counts = parsing.parse_double_bit_ecc(fixture("kcover-mx-smi-count-ecc-3gpu-mxc500-test.txt"))
    assert counts == {"GPU#0": 0, "GPU#1": 4, "GPU#2": 1}
    assert checking.double_bit_ecc(counts, limit=64).ok
    over = checking.double_bit_ecc(counts, limit=0)
    assert over.offenders == ("GPU#1=4", "GPU#2=1")


def test_double_bit_ecc_header_excerpt() -> None:
    text = fixture("kcover-mx-smi-count-ecc-excerpt-8gpu-header-gpu0.txt")
    assert parsing.parse_double_bit_ecc(text) == {"GPU#0": 0}
    assert parsing.parse_attached_gpus(text) == 8


def test_ibv_devinfo_port_states() -> None:
    states = parsing.parse_port_states(fixture("kcover-ibv_devinfo-excerpt-2hca-active-down.txt"))
    assert states == {"mlx5_0": {1: "PORT_ACTIVE"}, "mlx5_1": {1: "PORT_DOWN"}}
    assert checking.hca_ports(states, hca_ids=["mlx5_0"]).ok
    down = checking.hca_ports(states, hca_ids=["mlx5_0", "mlx5_1", "mlx5_4"])
    assert (down.ok, down.offenders) == (False, ("mlx5_1/1=PORT_DOWN", "mlx5_4=missing"))


@pytest.mark.parametrize(("parse", "text"), [
    (parsing.parse_double_bit_ecc, "        Double Bit ECC       : 0\n"),
    (parsing.parse_double_bit_ecc, "GPU#0  MXC500  0000:08:00.0\n        Double Bit ECC       : N/A\n"),
    (parsing.parse_hotspot_temperatures, "GPU#0  MXC500\n    hotspot(sensor0)   :  hot C\n"),
    (parsing.parse_port_states, "\t\t\tstate:   PORT_ACTIVE (4)\n"),
    (parsing.parse_port_states, "hca_id: mlx5_0\n\t\tport:   one\n"),
])
def test_malformed_output_raises_parse_error(parse: object, text: str) -> None:
    assert callable(parse)
    with pytest.raises(parsing.ParseError):
        parse(text)


@pytest.mark.parametrize("text", ["", "mx-smi  version: 2.2.9\nNo MetaX GPU found\n"])
def test_empty_reports_fail_their_checks(text: str) -> None:
    assert not checking.gpu_count(parsing.parse_gpu_list(text), expected=1).ok
    assert not checking.temperature(parsing.parse_hotspot_temperatures(text), limit_celsius=85).ok
    assert not checking.double_bit_ecc(parsing.parse_double_bit_ecc(text), limit=64).ok


@pytest.mark.parametrize(("statuses", "expected", "ok", "offenders"), [
    ({f"GPU#{i}": "Available" for i in range(8)}, 8, True, ()),
    ({**{f"GPU#{i}": "Available" for i in range(7)}, "GPU#7": "Unavailable"}, 8, False, ("GPU#7=Unavailable",)),
    ({f"GPU#{i}": "Available" for i in range(9)}, 8, True, ()),
])
def test_gpu_count_rule(statuses: dict[str, str], expected: int, ok: bool, offenders: tuple[str, ...]) -> None:
    result = checking.gpu_count(statuses, expected=expected)
    assert (result.ok, result.offenders) == (ok, offenders)


@pytest.mark.parametrize(("value", "ok"), [(84.99, True), (85.0, False), (91.5, False)])
def test_temperature_limit_is_inclusive(value: float, ok: bool) -> None:
    assert checking.temperature({"GPU#3": value}, limit_celsius=85).ok is ok


@pytest.mark.parametrize(("value", "ok"), [(64, True), (65, False)])
def test_ecc_limit_is_exclusive(value: int, ok: bool) -> None:
    assert checking.double_bit_ecc({"GPU#3": value}, limit=64).ok is ok
