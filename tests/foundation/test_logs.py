from __future__ import annotations

import asyncio
import io
import json

import structlog

from kcover import bus as bus_
from kcover import logs, metrics, settings
from kcover.detectors import contract, supervising

from .test_supervising import detector_settings, make_registry


def test_json_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    logs.configure(settings.LoggingSettings(level="info", format=settings.LogFormat.AUTO), stream=out)
    try:
        structlog.get_logger().info("lease_acquired", lease="kcover-controller", epoch=3)
        structlog.get_logger().debug("too_detailed")
    finally:
        logs.configure(settings.LoggingSettings(level="warning"))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 1
    assert lines[0]["event"] == "lease_acquired"
    assert lines[0]["epoch"] == 3
    assert lines[0]["level"] == "info"
    assert lines[0]["timestamp"].endswith("Z")


async def test_detector_logs_carry_the_detector_and_role() -> None:
    m = metrics.Metrics()
    ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m, node_name="gpu-node-7")
    sup = supervising.Supervisor(make_registry(), ctx, bus_.Bus(), detector_settings({"crasher": {}}), m)
    stop = asyncio.Event()
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as captured:
        task = asyncio.create_task(sup.run(stop))
        await asyncio.sleep(0.05)
        stop.set()
        await task
    failed = [e for e in captured if e["event"] == "detector_failed"]
    assert failed
    assert failed[0]["detector"] == "crasher"
    assert failed[0]["component"] == "controller"
    assert failed[0]["node"] == "gpu-node-7"
