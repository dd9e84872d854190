"""The metax detector with a fake command runner, a real bus and virtual time."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from kcover_metax import checking
from kcover_metax import config as config_
from kcover_metax import detector as detector_

from kcover import bus as bus_
from kcover import codec, errors, model
from kcover import metrics as metrics_
from kcover.agent import reporting
from kcover.aio import clock as clock_
from kcover.detectors import contract

FIXTURES = Path(__file__).parent / "fixtures"

GPU_LIST_8 = "mx-smi  version: 2.2.9\n" + "".join(
    f"GPU#{i}    MXC500      0000:{8 + i:02x}:00.0   Available (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)\n"
    for i in range(8))


class FakeRunner:
    """Answers commands from a dict of argv tuples; records what ran."""

    def __init__(self, answers: dict[tuple[str, ...], contract.CommandResult | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> contract.CommandResult:
        self.calls.append(tuple(argv))
        answer = self.answers[tuple(argv)]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> contract.CommandResult:
    return contract.CommandResult(0, stdout, "")


def healthy_answers() -> dict[tuple[str, ...], contract.CommandResult | Exception]:
    return {
        ("mx-smi", "-L"): ok(GPU_LIST_8),
        ("mx-smi", "--show-temperature"): ok((FIXTURES / "kcover-mx-smi-show-temperature-2gpu-mxc500.txt").read_text()),
        ("mx-smi", "--count-ecc"): ok((FIXTURES / "kcover-mx-smi-count-ecc-3gpu-mxc500-test.txt").read_text()),
        ("ibv_devinfo",): ok((FIXTURES / "kcover-ibv_devinfo-excerpt-2hca-active-down.txt").read_text()),
    }


def make(runner: FakeRunner, *, capacity: Any = None, clock: Any = None, **settings: Any) -> detector_.MetaxDetector:
    config = config_.MetaxConfig.model_validate(settings)
    context = contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics_.Metrics(), node_name="mx-node-3",
                                       command_runner=runner)
    if capacity is not None:
        context.node_capacity = capacity
    if clock is not None:
        context.clock = clock
    return detector_.MetaxDetector("metax", config, context)


METAX_NODE = {"cpu": "128", "memory": "2063625228Ki", "metax-tech.com/gpu": "8", "pods": "110"}


def test_entry_point_registers_the_detector() -> None:
    (entry,) = [e for e in metadata.entry_points(group="kcover.detectors") if e.name == "metax"]
    cls = entry.load()
    assert cls is detector_.MetaxDetector
    assert cls.roles == frozenset({contract.Role.AGENT})
    assert cls.config_model is config_.MetaxConfig


@pytest.mark.parametrize(("capacity", "force", "eligible"), [
    (METAX_NODE, False, True),
    ({"cpu": "128", "nvidia.com/gpu": "8"}, False, False),
    ({"metax-tech.com/gpu": "0"}, False, False),
    (None, False, False),
    (None, True, True),
    ({"cpu": "64"}, True, True),
])
async def test_runs_only_on_metax_nodes_unless_forced(capacity: Any, force: bool, eligible: bool) -> None:
    runner = FakeRunner(healthy_answers())
    detector = make(runner, capacity=capacity, force=force)
    stop = asyncio.Event()
    task = asyncio.create_task(detector.run(bus_.Bus(), stop))
    await asyncio.sleep(0.01)
    stop.set()
    if eligible:
        await task
        assert runner.calls[0] == ("mx-smi", "-L")
    else:
        with pytest.raises(errors.DetectorUnavailableError, match=r"metax-tech\.com/gpu"):
            await task
        assert runner.calls == []


async def test_healthy_node_emits_nothing_and_skips_ibv_without_hcas() -> None:
    runner = FakeRunner(healthy_answers())
    assert await make(runner, capacity=METAX_NODE).check_once(bus_.Bus()) == []
    assert runner.calls == [("mx-smi", "-L"), ("mx-smi", "--show-temperature"), ("mx-smi", "--count-ecc")]


async def test_each_failed_check_is_one_node_event_and_recovery_is_reported() -> None:
    answers = healthy_answers()
    answers[("mx-smi", "-L")] = ok((FIXTURES / "kcover-mx-smi-L-excerpt.txt").read_text())
    runner = FakeRunner(answers)
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    detector = make(runner, capacity=METAX_NODE, hca_ids=["mlx5_0", "mlx5_1"], double_bit_ecc_limit=3,
                    hotspot_limit_celsius=39.1)
    await detector.check_once(bus)
    events = {e.reason: e for e in sub.get_nowait()}
    assert set(events) == {"MetaxGpuUnavailable", "MetaxGpuOverheating", "MetaxDoubleBitEccExceeded",
                           "MetaxInfinibandPortDown"}
    target = model.Target(kind=model.TargetKind.NODE, name="mx-node-3", node="mx-node-3")
    assert all(e.target == target for e in events.values())
    assert events["MetaxGpuUnavailable"].severity is model.Severity.ERROR
    assert events["MetaxGpuUnavailable"].message == "2 of 8 expected GPUs available"
    assert events["MetaxGpuOverheating"].severity is model.Severity.WARNING
    assert events["MetaxGpuOverheating"].attributes["offenders"] == ["GPU#1=39.25C"]
    assert events["MetaxDoubleBitEccExceeded"].attributes["offenders"] == ["GPU#1=4"]
    assert events["MetaxInfinibandPortDown"].attributes["offenders"] == ["mlx5_1/1=PORT_DOWN"]
    assert {(e.fault.check, e.recommended, e.cleared) for e in events.values()} == {
        ("gpu-count", model.Action.CORDON_NODE, False), ("temperature", model.Action.CORDON_NODE, False),
        ("ecc", model.Action.CORDON_NODE, False), ("hca", model.Action.CORDON_NODE, False)}

    answers[("mx-smi", "-L")] = ok(GPU_LIST_8)
    await detector.check_once(bus)
    again = sub.get_nowait()
    recovered = [e for e in again if e.severity is model.Severity.INFO]
    assert [(e.reason, e.cleared, e.recommended, e.fault.check) for e in recovered] == \
        [("MetaxGpuUnavailable", True, None, "gpu-count")]
    assert {e.reason for e in again} - {"MetaxGpuUnavailable"} == {
        "MetaxGpuOverheating", "MetaxDoubleBitEccExceeded", "MetaxInfinibandPortDown"}


@pytest.mark.parametrize(("answer", "message"), [
    (contract.CommandResult(255, "", "mx-smi: driver not loaded\n"), "mx-smi --count-ecc exited 255: mx-smi: driver not loaded"),
    (contract.CommandTimeoutError("mx-smi --count-ecc ran past 60s"), "mx-smi --count-ecc ran past 60s"),
    (ok("GPU#0  MXC500\n    Double Bit ECC : many\n"), "cannot parse mx-smi --count-ecc: bad double-bit ECC count"),
])
async def test_a_check_that_cannot_run_is_a_warning(answer: contract.CommandResult | Exception, message: str) -> None:
    answers = healthy_answers()
    answers[("mx-smi", "--count-ecc")] = answer
    (event,) = await make(FakeRunner(answers), capacity=METAX_NODE).check_once(bus_.Bus())
    assert (event.reason, event.severity) == ("MetaxCheckFailed", model.Severity.WARNING)
    assert (event.fault.check, event.recommended, event.cleared) == ("ecc", None, False)
    assert event.message.startswith(message)


async def test_missing_mx_smi_makes_the_detector_unavailable() -> None:
    answers = healthy_answers()
    answers[("mx-smi", "-L")] = contract.CommandNotFoundError("mx-smi not found")
    detector = make(FakeRunner(answers), capacity=METAX_NODE)
    with pytest.raises(errors.DetectorUnavailableError, match="mx-smi not found"):
        await detector.run(bus_.Bus(), asyncio.Event())


@pytest.mark.looptime
async def test_runs_at_start_then_daily_at_the_configured_local_time() -> None:
    clock = clock_.FakeClock(dt.datetime(2026, 4, 23, 12, 0, tzinfo=dt.UTC), follow_loop=True)
    runner = FakeRunner(healthy_answers())
    detector = make(runner, capacity=METAX_NODE, clock=clock, run_at="03:00", timezone="Asia/Shanghai")
    stop = asyncio.Event()
    starts: list[dt.datetime] = []
    original = detector.check_once

    async def recording(bus: bus_.Bus) -> list[model.CollectorEvent]:
        starts.append(clock.now())
        return await original(bus)

    detector.check_once = recording  # type: ignore[method-assign]
    task = asyncio.create_task(detector.run(bus_.Bus(), stop))
    await asyncio.sleep(2.5 * 86400)
    stop.set()
    await task
    assert starts == [dt.datetime(2026, 4, 23, 12, 0, tzinfo=dt.UTC),
                      dt.datetime(2026, 4, 23, 19, 0, tzinfo=dt.UTC),
                      dt.datetime(2026, 4, 24, 19, 0, tzinfo=dt.UTC),
                      dt.datetime(2026, 4, 25, 19, 0, tzinfo=dt.UTC)]


@pytest.mark.looptime
async def test_without_run_at_start_it_waits_for_the_schedule() -> None:
    clock = clock_.FakeClock(dt.datetime(2026, 4, 23, 2, 59, tzinfo=dt.UTC), follow_loop=True)
    runner = FakeRunner(healthy_answers())
    stop = asyncio.Event()
    task = asyncio.create_task(make(runner, capacity=METAX_NODE, clock=clock, run_at_start=False).run(bus_.Bus(), stop))
    await asyncio.sleep(59)
    assert runner.calls == []
    await asyncio.sleep(2)
    assert runner.calls[0] == ("mx-smi", "-L")
    stop.set()
    await task


@pytest.mark.parametrize("settings", [{"run_at": "3am"}, {"timezone": "Mars/Olympus"}, {"expected_gpus": 0}])
def test_invalid_config_is_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        config_.MetaxConfig.model_validate(settings)


async def test_subprocess_runner_runs_and_times_out(tmp_path: Path) -> None:
    runner = contract.SubprocessRunner()
    result = await runner.run(["sh", "-c", "echo 'GPU#0 MXC500 0000:08:00.0 Available'; echo oops >&2; exit 3"],
                              timeout_seconds=10)
    assert result == contract.CommandResult(3, "GPU#0 MXC500 0000:08:00.0 Available\n", "oops\n")
    with pytest.raises(contract.CommandTimeoutError):
        await runner.run(["sh", "-c", "sleep 30"], timeout_seconds=0.2)
    with pytest.raises(contract.CommandNotFoundError):
        await runner.run([str(tmp_path / "mx-smi")], timeout_seconds=1)


async def test_day2_failure_becomes_a_need_recovery_event_and_a_bad_node_condition() -> None:
    answers = healthy_answers()
    answers[("mx-smi", "-L")] = ok((FIXTURES / "kcover-mx-smi-L-excerpt.txt").read_text())
    (event,) = await make(FakeRunner(answers), capacity=METAX_NODE).check_once(bus_.Bus())
    when = dt.datetime(2026, 4, 23, 3, 0, tzinfo=dt.UTC)
    body = reporting.event_body(event, node="mx-node-3", reporter="kcover.io/agent", when=when)
    annotations = body["metadata"]["annotations"]
    assert annotations[codec.NEED_RECOVERY] == "true"
    assert (annotations[codec.RECOMMENDED_ACTION], annotations[codec.CHECK]) == ("cordon-node", "gpu-count")
    decoded = codec.decode_annotations(annotations)
    assert isinstance(decoded, codec.Decoded)
    assert (decoded.recommended, decoded.fault.check) == (model.Action.CORDON_NODE, "gpu-count")
    faults: dict[str, reporting.Fault] = {}
    reporting.apply(faults, event, now=0.0)
    assert reporting.condition(faults, 1.0, hold_seconds=300).status == "False"


async def test_the_recommended_action_is_configurable_per_check() -> None:
    answers = healthy_answers()
    answers[("mx-smi", "-L")] = ok((FIXTURES / "kcover-mx-smi-L-excerpt.txt").read_text())
    detector = make(FakeRunner(answers), capacity=METAX_NODE, actions={"gpu-count": "report"})
    (event,) = await detector.check_once(bus_.Bus())
    assert event.recommended is model.Action.REPORT
    assert detector.config.actions[checking.Check.ECC] is model.Action.CORDON_NODE
    body = reporting.event_body(event, node="mx-node-3", reporter="kcover.io/agent", when=dt.datetime.now(dt.UTC))
    assert codec.NEED_RECOVERY not in body["metadata"]["annotations"]
