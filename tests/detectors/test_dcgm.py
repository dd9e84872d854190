"""The DCGM detector over a scripted command runner and a real HTTP exporter (the parsers: tests/nvml)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiohttp import web

from kcover import bus as bus_
from kcover import errors, metrics, model
from kcover.aio import commands
from kcover.detectors import contract, dcgm
from kcover.nvml import xid_policy

FIXTURES = Path(__file__).parents[1] / "fixtures"
A = xid_policy.Action


def _read(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def _with_value(text: str, metric: str, value: str) -> str:
    """A real sample with one metric's value changed (the captured nodes were healthy)."""
    return "\n".join(f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(metric + "{") else line
                     for line in text.splitlines()) + "\n"


# ---------------------------------------------------------------------------------------------- detector

class ScriptedRunner:
    def __init__(self, outputs: dict[str, list[str]], *, missing: bool = False) -> None:
        self.outputs = outputs
        self.missing = missing
        self.calls: list[list[str]] = []
        self.running: dict[str, int] = {}
        self.max_running: dict[str, int] = {}

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> commands.CommandResult:
        if self.missing:
            raise commands.CommandNotFoundError(f"{argv[0]} not found")
        self.calls.append(list(argv))
        kind = argv[1]
        self.running[kind] = self.running.get(kind, 0) + 1
        self.max_running[kind] = max(self.max_running.get(kind, 0), self.running[kind])
        try:
            await asyncio.sleep(0.01)
            queue = self.outputs.get(argv[1], [])
            out = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else "")
            if out == "TIMEOUT":
                raise commands.CommandTimeoutError(f"{argv[0]} ran past {timeout_seconds}s")
            return commands.CommandResult(0, out, "")
        finally:
            self.running[kind] -= 1


def _detector(runner: ScriptedRunner | None, **config: object) -> dcgm.DcgmDetector:
    context = contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics.Metrics(), node_name="gpu-node-1")
    if runner is not None:
        context.command_runner = runner
    cfg = dcgm.DcgmConfig.model_validate({"diag_interval_seconds": 0.05, "health_interval_seconds": 0.05, **config})
    return dcgm.DcgmDetector("dcgm", cfg, context)


async def _collect(detector: dcgm.DcgmDetector, seconds: float) -> list[model.CollectorEvent]:
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    stop = asyncio.Event()
    task = asyncio.create_task(detector.run(bus, stop), name="dcgm")
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 3)
    return sub.get_nowait()


async def test_dcgmi_missing_is_unavailable() -> None:
    with pytest.raises(errors.DetectorUnavailableError):
        await _detector(ScriptedRunner({}, missing=True)).run(bus_.Bus(), asyncio.Event())


async def test_diag_failure_is_published_then_cleared() -> None:
    failing = _read("dcgmi-diag", "ml-engineering-r2-gpu-memory-fail-gpu0-thermal-violation-excerpt.txt")
    passing = _read("dcgmi-diag", "dcgm-124-r2-pass-dcgm4.4.2-a10g-table.txt")
    runner = ScriptedRunner({"diag": [failing, passing], "health": [json.dumps({"body": {}})]})
    events = await _collect(_detector(runner), 0.5)
    diag = [e for e in events if e.fault.check.startswith("diag/")]
    assert [(e.cleared, e.recommended, e.fault.gpu_index) for e in diag] == \
        [(False, model.Action.CORDON_NODE, 0), (True, None, 0)]
    assert diag[0].fault == diag[1].fault == model.Fault(gpu_index=0, check="diag/GPU Memory")
    assert diag[0].reason == "DCGMGpuMemory"
    assert diag[0].target.kind is model.TargetKind.NODE
    assert ["dcgmi", "diag", "-r", "1", "-j"] in runner.calls
    assert runner.max_running == {"--version": 1, "diag": 1, "health": 1}


async def test_diag_runs_never_overlap_and_timeouts_are_survived() -> None:
    runner = ScriptedRunner({"diag": ["TIMEOUT", "TIMEOUT", ""], "health": ["TIMEOUT"]})
    events = await _collect(_detector(runner, health_interval_seconds=10), 0.4)
    assert events == []
    assert sum(1 for c in runner.calls if c[1] == "diag") >= 3
    assert runner.max_running["diag"] == 1


async def test_exporter_mode_reads_metrics_over_http() -> None:
    text = _with_value(_read("dcgm-exporter", "lke-rtx4000ada-580.95.05-xid-errcode-labels-k8s-pod.prom"),
                       "DCGM_FI_DEV_XID_ERRORS", "48")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        events = await _collect(_detector(None, exporter_url=f"http://127.0.0.1:{port}/metrics",
                                          exporter_interval_seconds=0.05), 0.3)
    finally:
        await runner.cleanup()
    assert len(events) == 1
    ev = events[0]
    assert (ev.reason, ev.fault.xid, ev.recommended) == ("XID48", 48, model.Action.CORDON_NODE_AND_RESTART)
    assert ev.fault.check == "exporter/DCGM_FI_DEV_XID_ERRORS"
    assert ev.target == model.Target(kind=model.TargetKind.DEVICE, node="gpu-node-1", name="gpu-node-1",
                                     device_id="GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c")
    assert ev.fault.pods == ("default/cuda-75454ffb9f-8ljq7",)
    assert ev.fault.gpu_uuid == "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c"


async def test_dcgm_checks_are_counted_by_mode_and_result() -> None:
    """`kcover_dcgm_polls_total{mode,result}` from 0, and the age of the last check that was read."""
    passing = _read("dcgmi-diag", "dcgm-124-r2-pass-dcgm4.4.2-a10g-table.txt")
    runner = ScriptedRunner({"diag": [passing], "health": ["TIMEOUT", "not json", json.dumps({"body": {}})]})
    detector = _detector(runner, diag_interval_seconds=10)
    registry = detector.context.metrics.registry
    assert registry.get_sample_value("kcover_dcgm_polls_total", {"mode": "health", "result": "failed"}) == 0
    await _collect(detector, 0.5)
    assert registry.get_sample_value("kcover_dcgm_polls_total", {"mode": "diag", "result": "ok"}) == 1
    assert registry.get_sample_value("kcover_dcgm_polls_total", {"mode": "health", "result": "failed"}) == 2
    assert (registry.get_sample_value("kcover_dcgm_polls_total", {"mode": "health", "result": "ok"}) or 0) >= 1
    age = detector.context.metrics.health_checks.age("dcgm")
    assert age is not None
    assert age < 1
