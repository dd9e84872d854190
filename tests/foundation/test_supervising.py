from __future__ import annotations

import asyncio
import importlib.metadata as md
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import errors, metrics, settings
from kcover.detectors import contract, registry, supervising

from . import detectors_for_tests as d


def make_registry() -> registry.Registry:
    return registry.Registry([
        registry.DetectorInfo("ticker", "x:Ticker", "tests", "0", d.Ticker),  # type: ignore[arg-type]
        registry.DetectorInfo("crasher", "x:Crasher", "tests", "0", d.Crasher),  # type: ignore[arg-type]
        registry.DetectorInfo("missing", "x:Missing", "tests", "0", d.Missing),  # type: ignore[arg-type]
        registry.DetectorInfo("agent-only", "x:AgentOnly", "tests", "0", d.AgentOnly),  # type: ignore[arg-type]
        registry.DetectorInfo("appearing", "x:Appearing", "tests", "0", d.Appearing),  # type: ignore[arg-type]
        registry.DetectorInfo("broken", "x:Broken", "tests", "0", None, "ImportError: no module named x"),
    ])


def detector_settings(entries: Mapping[str, Any], **extra: Any) -> settings.DetectorsSettings:
    """Entries run inline unless they say otherwise: these tests are about supervision (isolation: test_isolating)."""
    data = {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}
    data.update({name: {"isolated": False, **entry} for name, entry in entries.items()})
    return settings.DetectorsSettings.model_validate({"entries": data, **extra})


class Running:
    def __init__(self, sup: supervising.Supervisor, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.sup, self.stop, self.task = sup, stop, task


@pytest.fixture
async def start() -> AsyncIterator[Any]:
    runs: list[Running] = []

    async def _start(entries: Mapping[str, Any], **extra: Any) -> tuple[supervising.Supervisor, bus_.Bus, metrics.Metrics]:
        m = metrics.Metrics()
        b = bus_.Bus(dedupe_window_seconds=0)
        ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m)
        sup = supervising.Supervisor(make_registry(), ctx, b, detector_settings(entries, **extra), m)
        stop = asyncio.Event()
        runs.append(Running(sup, stop, asyncio.create_task(sup.run(stop))))
        await asyncio.sleep(0)
        return sup, b, m

    yield _start
    for run in runs:
        run.stop.set()
        await asyncio.wait_for(run.task, 5)


@pytest.mark.looptime
async def test_runs_enabled_detectors_of_its_role_only(start: Any) -> None:
    sup, b, _ = await start({"ticker": {"config": {"label": "a"}}, "agent-only": {}})
    sub = b.subscribe("t")
    await asyncio.sleep(2.5)
    assert sup.health() == {"ticker": "running"}
    assert {e.message for e in sub.get_nowait()} >= {"a-2", "a-3"}


@pytest.mark.looptime
async def test_crashing_detector_is_restarted_with_backoff_and_reported(start: Any) -> None:
    d.Crasher.attempts.clear()
    sup, _, m = await start({"crasher": {"required": True}, "ticker": {}}, restart_initial_seconds=1,
                            restart_max_seconds=8)
    await asyncio.sleep(30)
    gaps = [b - a for a, b in zip(d.Crasher.attempts, d.Crasher.attempts[1:], strict=False)]
    assert len(d.Crasher.attempts) >= 4
    assert gaps[0] <= 1.0 + 1e-6
    assert max(gaps) <= 8.0 + 1e-6
    assert gaps[-1] > gaps[0]  # it backs off
    assert sup.health() == {"crasher": "failed", "ticker": "running"}
    ok, detail = sup.readiness()
    assert not ok
    assert "crasher: RuntimeError: sensor on fire" in detail
    assert m.registry.get_sample_value("kcover_detector_restarts_total", {"detector": "crasher"}) == len(d.Crasher.attempts)
    assert m.registry.get_sample_value("kcover_detector_up", {"detector": "crasher"}) == 0
    assert m.registry.get_sample_value("kcover_detector_up", {"detector": "ticker"}) == 1


@pytest.mark.looptime
async def test_a_failed_optional_plugin_is_reported_and_leaves_the_process_ready(start: Any) -> None:
    sup, _, m = await start({"crasher": {}, "ticker": {}})  # "tests" is a third-party distribution: optional
    await asyncio.sleep(3)
    assert sup.health() == {"crasher": "failed", "ticker": "running"}
    ok, detail = sup.readiness()
    assert ok
    assert "optional failed: crasher: RuntimeError: sensor on fire" in detail
    assert sup.describe()["crasher"]["required"] is False
    assert m.registry.get_sample_value("kcover_detector_up", {"detector": "crasher"}) == 0


@pytest.mark.looptime
async def test_unavailable_detector_does_not_fail_readiness(start: Any) -> None:
    sup, _, m = await start({"missing": {}})
    await asyncio.sleep(1)
    assert sup.health() == {"missing": "unavailable"}
    assert sup.readiness()[0]
    assert m.registry.get_sample_value("kcover_detector_available", {"detector": "missing"}) == 0


@pytest.mark.looptime
async def test_an_attempt_settles_after_settle_seconds_and_availability_returns_only_then(start: Any) -> None:
    """Each retry of an unavailable detector runs a moment before it finds out again: its state stays
    `unavailable`, the gauge 0 and the attempt unsettled through those, and all return (`running`, 1) once an
    attempt has run the settle time."""
    d.Appearing.attempts.clear()
    d.Appearing.unavailable_for = 2
    sup, _, m = await start({"appearing": {}, "ticker": {}}, restart_max_seconds=30, settle_seconds=5)

    def available() -> float | None:
        return m.registry.get_sample_value("kcover_detector_available", {"detector": "appearing"})

    seen: list[tuple[str, bool, float | None]] = []
    for _ in range(80):  # one look a second over two retries, as a scrape and the agent's ticks would
        status = sup.statuses()["appearing"]
        seen.append((status.state, status.settled, available()))
        await asyncio.sleep(1)
    assert [round(t - d.Appearing.attempts[0]) for t in d.Appearing.attempts] == [0, 30, 60]
    first_settled = next(i for i, (_, settled, _) in enumerate(seen) if settled)
    assert 64 <= first_settled <= 66, seen  # the third attempt, at 60 s, settled 5 s later
    assert all(value == 0 for _, _, value in seen[1:first_settled]), seen  # no blink on a retry
    assert {state for state, _, _ in seen[1:first_settled]} == {"unavailable"}, seen  # nor at /detectors
    assert seen[-1] == ("running", True, 1)
    assert sup.statuses()["ticker"].settled  # a detector that ran at once settled too


def test_unknown_detector_is_an_error_naming_the_known_ones() -> None:
    m = metrics.Metrics()
    ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m)
    sup = supervising.Supervisor(make_registry(), ctx, bus_.Bus(), detector_settings({}), m)
    with pytest.raises(errors.ConfigError) as info:
        sup.wanted(detector_settings({"tickr": {}}))
    assert "detectors.entries.tickr: unknown detector; installed: agent-only, appearing, broken, crasher, missing, ticker" in info.value.errors


def test_bad_detector_config_and_broken_required_plugin_are_field_level_errors() -> None:
    """A plugin that cannot be imported is a problem only when its entry makes it required; optional (the
    default for plugins), it runs as failed and leaves the process ready."""
    problems = make_registry().check_entries(detector_settings(
        {"ticker": {"config": {"interval_seconds": "often"}}, "broken": {"required": True}}).entries)
    assert "detectors.entries.ticker.config.interval_seconds: Input should be a valid number, unable to parse string as a number" in problems
    assert any(p.startswith("detectors.entries.broken:") and "ImportError: no module named x" in p for p in problems)
    assert make_registry().check_entries(detector_settings({"broken": {}}).entries) == []


@pytest.mark.looptime
def test_discovery_imports_a_detector_only_when_it_is_asked_for(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A role imports the detectors its configuration enables: an installed plugin that is disabled (or not
    configured) is listed but never imported."""
    module = f"lazy_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(f"from {d.__name__} import Ticker\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [md.EntryPoint(name="lazy", value=f"{module}:Ticker", group=registry.GROUP),
           md.EntryPoint(name="lazy", value="elsewhere:Ticker", group=registry.GROUP)]  # found twice: first wins
    reg = registry.discover(eps)
    assert reg.names() == ["lazy"]
    assert reg.check_entries({"lazy": settings.DetectorEntry(enabled=False)}) == []
    assert module not in sys.modules
    assert reg.get("lazy").cls is d.Ticker
    assert module in sys.modules
    monkeypatch.delitem(sys.modules, module)
    assert [i.value for i in reg.infos] == [f"{module}:Ticker"]


async def test_reconfigure_restarts_only_changed_detectors(start: Any) -> None:
    d.Ticker.starts.clear()
    sup, b, _ = await start({"ticker": {"config": {"label": "old"}}, "crasher": {"enabled": False}})
    sub = b.subscribe("t")
    await asyncio.sleep(1.5)
    touched = sup.reconfigure(detector_settings({"ticker": {"config": {"label": "new", "interval_seconds": 0.5}}}))
    assert touched == ["ticker"]
    await asyncio.sleep(2)
    assert d.Ticker.starts == ["old", "new"]
    labels = [e.message.split("-")[0] for e in sub.get_nowait()]
    assert labels[-1] == "new"
    assert "old" in labels
    # an unchanged config touches nothing
    assert sup.reconfigure(detector_settings({"ticker": {"config": {"label": "new", "interval_seconds": 0.5}}})) == []
    # an invalid one changes nothing
    with pytest.raises(errors.ConfigError):
        sup.reconfigure(detector_settings({"ticker": {"config": {"label": 5}}}))
    assert d.Ticker.starts == ["old", "new"]
    # disabling stops it
    assert sup.reconfigure(detector_settings({"ticker": {"enabled": False}})) == ["ticker"]
    await asyncio.sleep(1)
    assert sup.health() == {}


async def test_a_failed_optional_plugin_shows_at_detectors_in_kcover_detectors_and_is_told_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kcover import cli, serving

    d.Crasher.attempts.clear()
    m = metrics.Metrics()
    ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m)
    sup = supervising.Supervisor(make_registry(), ctx, bus_.Bus(dedupe_window_seconds=0),
                                 detector_settings({"crasher": {}, "ticker": {}}, restart_initial_seconds=0.05,
                                                   restart_max_seconds=0.1), m)
    told: list[tuple[str, str, bool]] = []

    async def on_failure(name: str, detail: str, required: bool) -> None:
        told.append((name, detail, required))

    sup.on_failure = on_failure
    health = serving.Health()
    health.detectors = sup.describe
    server = serving.Server(health, m, host="127.0.0.1", port=0)
    await server.start()
    stop = asyncio.Event()
    task = asyncio.create_task(sup.run(stop))
    try:
        for _ in range(1500):  # a positive signal (up to 30 s): the first failure's traceback is slow to log when loaded
            if len(d.Crasher.attempts) >= 3:
                break
            await asyncio.sleep(0.02)
        assert len(d.Crasher.attempts) >= 2, "restarted more than once"
        assert told == [("crasher", "RuntimeError: sensor on fire", False)], "once per distinct failure, not per restart"
        url = f"http://127.0.0.1:{server.port}"
        code = await asyncio.to_thread(cli.main, ["detectors", "--url", url])
        out = capsys.readouterr().out
        assert code == 1
        assert "crasher  failed   no" in out
        assert "RuntimeError: sensor on fire" in out
        assert "ticker   running" in out
        assert await asyncio.to_thread(cli.main, ["detectors", "--url", "http://127.0.0.1:1"]) == 3
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await server.stop()
