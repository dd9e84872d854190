"""The fleet replay's taxonomy and trace: the shipped counts, the generator's draws, the JSON-lines format."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kcover import errors
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace


def one_class(count: float, *, signals: tuple[tax.Signal, ...] | None = None, blame: tax.Blame = tax.Blame.DEVICE,
              physics: tax.Physics = tax.Physics.PERSISTENT) -> tax.Taxonomy:
    return tax.Taxonomy(observed=tax.Observed(gpus=100, days=1), classes=(tax.FaultClass(
        name="bad", count=count, blame=blame, physics=physics,
        signals=signals or (tax.Signal(signal=tax.SignalKind.XID, xid=79),)),))


def test_the_shipped_taxonomy_is_llama3_table5() -> None:
    shipped = tax.load()
    counts = {c.name: c.count for c in shipped.classes}
    assert sum(counts.values()) == 419
    assert counts["faulty-gpu"] == 148
    assert counts["gpu-hbm3"] == 72
    assert counts["software-bug"] == 54
    assert counts["network-switch"] + counts["network-cable"] == 35
    assert (shipped.observed.gpus, shipped.observed.days) == (16384, 54)
    assert shipped.rate_per_gpu_day(shipped.by_name()["faulty-gpu"]) == pytest.approx(148 / (16384 * 54))
    assert Path("config/fleet-taxonomy.yaml").resolve() == Path("kcover/data/fleet-taxonomy.yaml").resolve()


def test_a_seed_is_a_trace() -> None:
    shipped = tax.load()
    first = trace.generate(shipped, nodes=256, gpus_per_node=8, days=30, seed=7)
    again = trace.generate(shipped, nodes=256, gpus_per_node=8, days=30, seed=7)
    other = trace.generate(shipped, nodes=256, gpus_per_node=8, days=30, seed=8)
    assert first == again
    assert first != other
    assert first == sorted(first)


def test_onsets_come_at_the_class_rate() -> None:
    """1 onset per GPU-day on 20 GPUs for 20 days: 400 expected, drawn Poisson; each seed within 4 sigma."""
    taxonomy = one_class(100)
    for seed in range(5):
        onsets = trace.generate(taxonomy, nodes=10, gpus_per_node=2, days=20, seed=seed)
        assert abs(len(onsets) - 400) < 4 * math.sqrt(400), len(onsets)
        assert all(0 <= o.time < 20 * 86400 and 0 <= o.node < 10 and o.gpu in (0, 1) for o in onsets)
    scaled = trace.generate(taxonomy, nodes=10, gpus_per_node=2, days=20, seed=0, scale=0.1)
    assert abs(len(scaled) - 40) < 4 * math.sqrt(40)


def test_signals_are_drawn_by_weight_and_node_faults_name_no_gpu() -> None:
    signals = (tax.Signal(signal=tax.SignalKind.NOTREADY, weight=3.0), tax.Signal(signal=tax.SignalKind.NCCL, weight=1.0))
    onsets = trace.generate(one_class(200, signals=signals, blame=tax.Blame.NODE), nodes=50, gpus_per_node=8,
                            days=10, seed=3)
    kinds = [o.signal for o in onsets]
    share = kinds.count(tax.SignalKind.NOTREADY) / len(kinds)
    assert 0.65 < share < 0.85, share
    assert all(o.gpu is None and o.xid is None for o in onsets)


def test_the_json_lines_format_round_trips(tmp_path: Path) -> None:
    shipped = tax.load()
    onsets = trace.generate(shipped, nodes=128, gpus_per_node=8, days=20, seed=1)
    path = tmp_path / "trace.jsonl"
    trace.write(onsets, str(path))
    assert trace.read(str(path), shipped, nodes=128, gpus_per_node=8) == [
        trace.Onset(round(o.time, 3), o.node, o.gpu, o.fault_class, o.signal, o.xid) for o in onsets]
    first = path.read_text().splitlines()[0]
    assert first.startswith('{"time": ')
    assert '"class": ' in first
    assert '"signal": ' in first


def test_a_users_trace_is_read_and_its_bad_lines_named() -> None:
    shipped = tax.load()
    good = trace.parse(['# my incidents', '', '{"time": 60, "node": 3, "gpu": 2, "class": "gpu-hbm3", "signal": "xid", "xid": 48}',
                        '{"time": 5, "node": 1, "gpu": null, "class": "cpu", "signal": "notready"}',
                        '{"time": 9, "node": 2, "class": "faulty-gpu", "signal": "xid", "xid": 79}'],
                       shipped, nodes=4, gpus_per_node=8)
    assert [(o.time, o.node, o.gpu, o.fault_class) for o in good] == [(5.0, 1, None, "cpu"), (9.0, 2, 0, "faulty-gpu"),
                                                                     (60.0, 3, 2, "gpu-hbm3")]
    with pytest.raises(errors.ConfigError) as caught:
        trace.parse(['{"time": 1, "node": 9, "class": "cpu", "signal": "notready"}',
                     '{"time": 1, "node": 0, "class": "no-such", "signal": "exit"}',
                     '{"time": 1, "node": 0, "class": "cpu", "signal": "xid"}',
                     'not json',
                     '{"time": 1, "node": 0, "gpu": 8, "class": "cpu", "signal": "exit"}'],
                    shipped, nodes=4, gpus_per_node=8, source="mine.jsonl")
    text = "\n".join(caught.value.errors)
    assert "mine.jsonl:1: node 9 is past the fleet's 4 nodes" in text
    assert "mine.jsonl:2: class 'no-such' is not in the taxonomy" in text
    assert "mine.jsonl:3:" in text
    assert "xid" in text
    assert "mine.jsonl:4: not JSON" in text
    assert "mine.jsonl:5: gpu 8 is past the node's 8 GPUs" in text


def test_a_bad_taxonomy_is_refused_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "tax.yaml"
    path.write_text("observed: {gpus: 0, days: 1}\nclasses:\n  - {name: a, count: 1, blame: device, physics: "
                    "persistent, signals: [{signal: xid}]}\n  - {name: a, count: 1, blame: maybe, physics: transient, "
                    "signals: [{signal: exit}]}\n")
    with pytest.raises(errors.ConfigError) as caught:
        tax.load(str(path))
    text = "\n".join(caught.value.errors)
    assert "observed.gpus" in text
    assert "classes.0.signals.0" in text
    assert "classes.1.blame" in text
