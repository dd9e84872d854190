"""The agent's return-to-service validation (kcover/agent/validating.py) against the simulated API server.

A fake `dcgmi` (a shell script that prints a real `dcgmi diag` output from tests/fixtures/dcgmi-diag and
counts its runs) stands for DCGM; the whole agent runs with `agent.validation.enabled`. What is
asserted is what the API server ends up holding: the `KcoverGPUValidated` condition answering the
request the Node's annotations carry.
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kcover import layering, metrics, validationcodec
from kcover.agent import running, validating
from kcover.kube import client
from kcover.nvml import fake

simserver = pytest.importorskip("kcover.sim.server")

NODE = "gpu-node-1"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgmi-diag"
PASS = FIXTURES / "ramble-r3-pass-dcgm3.3.9-h200x8-table.txt"
FAIL = FIXTURES / "nccl-tests-264-r3-fail-cuda-init-dcgm3.3.8-h100x8-table.txt"


def fake_dcgmi(tmp_path: Path, fixture: Path | None, *, exit_code: int = 0, sleep: float = 0) -> Path:
    """A `dcgmi` that prints `fixture` (nothing for None) and appends its arguments to `runs`."""
    script = tmp_path / "dcgmi"
    runs = tmp_path / "runs"
    body = f"echo \"$@\" >> {runs}\n" + (f"exec sleep {sleep}\n" if sleep else "")  # exec: killed with it
    body += f"cat {fixture}\n" if fixture is not None else ""
    script.write_text(f"#!/bin/sh\n{body}exit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(("fixture", "exit_code", "outcome", "text"), [
    (PASS, 0, validationcodec.ValidationOutcome.PASSED, "every test passed"),
    (FAIL, 226, validationcodec.ValidationOutcome.FAILED, "GPU Memory"),
    (FIXTURES / "dcgm-253-r2-pcie-fail-internal-error-dcgm4.2.3-l40sx4-table.txt", 226,
     validationcodec.ValidationOutcome.FAILED, "failed"),
    (None, 1, validationcodec.ValidationOutcome.ERROR, "printed nothing"),
])
def test_verdict_on_real_dcgmi_output(fixture: Path | None, exit_code: int, outcome: validationcodec.ValidationOutcome,
                                      text: str) -> None:
    out = fixture.read_text() if fixture is not None else ""
    got, message = validating.verdict(exit_code, out, 3)
    assert got is outcome
    assert text in message


def test_an_answer_that_is_no_diagnostic_is_an_error() -> None:
    out = "Error: unable to establish a connection to the specified host: localhost\n"
    assert validating.verdict(255, out, 1)[0] is validationcodec.ValidationOutcome.ERROR


async def _node(srv: Any) -> None:
    srv.store.create("nodes", {"metadata": {"name": NODE}, "spec": {},
                               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})


async def _answer(kube: client.KubeClient, request: str, within: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            node = await kube.request("GET", f"/api/v1/nodes/{NODE}")
            for cond in node["status"].get("conditions") or []:
                if cond["type"] == validationcodec.VALIDATION_CONDITION and f"request {request}:" in cond["message"]:
                    return dict(cond)
            await asyncio.sleep(0.05)


async def _ask(kube: client.KubeClient, request: str, level: int) -> None:
    body = {"metadata": {"annotations": validationcodec.encode_validation_request(validationcodec.ValidationRequest(request, level))}}
    await kube.request("PATCH", f"/api/v1/nodes/{NODE}", body=body, content_type="application/merge-patch+json")


@pytest.fixture
async def kube() -> AsyncIterator[tuple[Any, client.KubeClient]]:
    async with simserver.SimServer() as srv:
        await _node(srv)
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield srv, kube
        finally:
            await kube.close()


async def _agent(kube: client.KubeClient, dcgmi: Path, stop: asyncio.Event, *, timeout: float = 30.0) -> asyncio.Task[None]:
    config = layering.layer(file_data={
        "agent": {"node_name": NODE, "min_write_interval_seconds": 0.0,
                  "validation": {"enabled": True, "dcgmi_path": str(dcgmi), "timeout_seconds": timeout}},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50}}, "dcgm": {"enabled": False}}},
    }).settings
    return asyncio.create_task(running.run(config, client=kube, metrics=metrics.Metrics(), health=None, stop=stop,
                                           nvml=fake.FakeNvml(8), reporter_tick_seconds=0.05), name="agent")


@pytest.mark.parametrize(("fixture", "exit_code", "status", "reason"), [
    (PASS, 0, "True", "Passed"),
    (FAIL, 226, "False", "Failed"),
])
async def test_the_agent_answers_a_request_once_with_the_diag_level_asked(
        kube: tuple[Any, client.KubeClient], tmp_path: Path, fixture: Path, exit_code: int, status: str,
        reason: str) -> None:
    _, api = kube
    stop = asyncio.Event()
    task = await _agent(api, fake_dcgmi(tmp_path, fixture, exit_code=exit_code), stop)
    try:
        await _ask(api, "r1", 3)
        cond = await _answer(api, "r1")
        assert (cond["status"], cond["reason"]) == (status, reason)
        assert runs(tmp_path) == ["diag -r 3 -j"]
        await api.request("PATCH", f"/api/v1/nodes/{NODE}", body={"metadata": {"labels": {"touched": "yes"}}},
                          content_type="application/merge-patch+json")
        await asyncio.sleep(0.5)
        assert runs(tmp_path) == ["diag -r 3 -j"], "a request already answered is not run again"
        await _ask(api, "r2", 1)
        await _answer(api, "r2")
        assert runs(tmp_path) == ["diag -r 3 -j", "diag -r 1 -j"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_request_answered_before_the_agent_restarted_is_not_run_again(
        kube: tuple[Any, client.KubeClient], tmp_path: Path) -> None:
    _, api = kube
    await _ask(api, "r1", 2)
    answered = validationcodec.encode_validation_answer(validationcodec.ValidationAnswer("r1", validationcodec.ValidationOutcome.PASSED, "ok"),
                                              "2026-01-01T00:00:00Z")
    await api.request("PATCH", f"/api/v1/nodes/{NODE}/status", body={"status": {"conditions": [answered]}},
                      content_type="application/strategic-merge-patch+json")
    stop = asyncio.Event()
    task = await _agent(api, fake_dcgmi(tmp_path, PASS), stop)
    try:
        await asyncio.sleep(1.0)
        assert runs(tmp_path) == []
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_diag_past_its_timeout_is_killed_and_reported_not_run(
        kube: tuple[Any, client.KubeClient], tmp_path: Path) -> None:
    _, api = kube
    stop = asyncio.Event()
    task = await _agent(api, fake_dcgmi(tmp_path, PASS, sleep=30), stop, timeout=0.5)
    try:
        await _ask(api, "r1", 1)
        cond = await _answer(api, "r1")
        assert (cond["status"], cond["reason"]) == ("Unknown", "DiagError")
        assert "ran past 0.5s" in cond["message"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
