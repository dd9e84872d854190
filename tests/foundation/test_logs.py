from __future__ import annotations

import asyncio
import io
import json
import secrets
import socket

import pytest
import structlog

from kcover import bus as bus_
from kcover import errors, logs, metrics, settings
from kcover.detectors import contract, supervising
from kcover.kube import client as client_
from kcover.kube import retrying, transport

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


async def _failed_request(token: str) -> errors.KubeError:
    """A request with a bearer token whose connection is refused, as the error kcover's client raises."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kube = client_.KubeClient(transport.Transport(f"http://127.0.0.1:{port}", token=transport.static_token(
        f"Bearer {token}")), retry=retrying.NO_RETRY)
    try:
        await kube.request("GET", "/api/v1/pods")
    except errors.KubeError as exc:
        return exc
    finally:
        await kube.close()
    raise AssertionError("the request did not fail")


@pytest.mark.parametrize("fmt", [settings.LogFormat.JSON, settings.LogFormat.CONSOLE])
async def test_a_logged_request_error_never_carries_the_bearer_token(fmt: settings.LogFormat) -> None:
    """The HTTP layer's frames hold the request headers; a traceback logged with `exc_info` (as task
    boundaries do) shows the frames, never their locals."""
    token = "kcover-test-secret-" + secrets.token_hex(16)
    error = await _failed_request(token)
    out = io.StringIO()
    logs.configure(settings.LoggingSettings(level="info", format=fmt), stream=out)
    try:
        structlog.get_logger().error("request_failed", exc_info=error)
        try:
            raise RuntimeError("task failed") from error
        except RuntimeError:
            structlog.get_logger().exception("task_crashed")
    finally:
        logs.configure(settings.LoggingSettings(level="warning"))
    text = out.getvalue()
    assert "transport.py" in text, "the traceback and its frames are logged"
    assert "ClientConnectorError" in text or "Connect" in text
    assert token not in text
