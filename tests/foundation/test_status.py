"""`kcover status`: what a person reads, and the exit code that says whether they must act.

The gpu-xid scenario runs on the simulated cluster (real controllers and agents); `kcover status` then
reads it through a kubeconfig, as a person would, and must name the cordoned node and the restarted
jobs. What needs a person is a table over the report's parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kcover import cli
from kcover import status as status_
from kcover.sim import cluster as cluster_
from kcover.sim import scenarios

SIZE = cluster_.Size(nodes=4, gpus_per_node=4, jobs=2, seed=5)


def _status(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["status", *args])
    return code, out.getvalue()


async def test_status_names_the_cordoned_node_and_the_restarted_jobs_during_gpu_xid(tmp_path: Path) -> None:
    scenario = scenarios.catalogue()["gpu-xid"]
    async with cluster_.SimCluster(SIZE, overrides=scenario.overrides,
                                   agent_overrides=scenario.agent_overrides) as c:
        node = str(c.running_pods(c.jobs[0])[1]["spec"]["nodeName"])
        jobs = c.jobs_on_node(node)
        await scenario.play(scenarios.Run(c))
        kubeconfig = str(c.srv.write_kubeconfig(tmp_path / "kubeconfig"))
        fraction = f"recovery.max_cordoned_fraction={c.replicas[0].controller.settings.recovery.max_cordoned_fraction}"
        for _ in range(50):  # the Recovery writer runs beside the engine
            code, text = await asyncio.to_thread(_status, "--kubeconfig", kubeconfig, "--set", fraction)
            if text.count("RestartWorkload") == len(jobs):
                break
            await asyncio.sleep(0.1)
        code_json, doc_text = await asyncio.to_thread(_status, "--kubeconfig", kubeconfig, "--set", fraction,
                                                      "-o", "json")
    assert code == 0, text
    assert f"cordoned by kcover (1):\n  {node}  since" in text
    assert "XID 79" in text
    for job in jobs:
        assert f"RestartWorkload  PyTorchJob {cluster_.NAMESPACE}/{job}" in text
    assert "needs a person: no" in text
    doc = json.loads(doc_text)
    assert code_json == 0
    assert [c["node"] for c in doc["cordoned"]] == [node]
    assert doc["recoveries_by_phase"] == {"Recovered": 1 + len(jobs)}
    assert doc["leader"]["holder"].startswith("kcover-controller-")
    assert doc["needs_a_person"] is False


def _report(**kw: object) -> status_.Report:
    leader = status_.Leader(holder="a", renewed_seconds_ago=1.0, held_seconds=60.0, duration_seconds=15)
    report = status_.Report(lease="kcover-system/kcover-controller", leader=leader, gpu_nodes=10,
                            max_cordoned_fraction=0.1)
    for key, value in kw.items():
        setattr(report, key, value)
    return report


def _row(phase: str) -> status_.Row:
    return status_.Row("ml", "r", phase, "RestartWorkload", "PyTorchJob ml/train", "XID79", cause="Unschedulable")


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"leader": status_.Leader()}, "no controller leads"),
    ({"leader": status_.Leader(holder="a", renewed_seconds_ago=40.0, duration_seconds=15)}, "last renewed by a 40s ago"),
    ({"breaker_latched": True, "breaker_reason": "too many restarts"}, "latched open (too many restarts)"),
    ({"cordoned": [status_.Cordon("n1", "XID79", "")]}, "the breaker is open"),
    ({"recoveries": [_row("Recovered"), _row("Verifying"), _row("Refused")]}, None),
    ({"recoveries": [_row("Stalled")]}, "is Stalled"),
    ({"recoveries": [_row("Failed")]}, "is Failed"),
    ({"out_of_budget": [status_.OutOfBudget("w.u", "PyTorchJob ml/train", 5, "2026-05-01T13:00:00Z")]},
     "out of its restart budget"),
    ({"recoveries_available": False}, "CRD (recoveries.kcover.io) is not installed"),
])
def test_what_needs_a_person(changes: dict[str, object], problem: str | None) -> None:
    report = _report(**changes)
    problems = report.problems()
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]
    assert report.to_json()["needs_a_person"] is (problem is not None)
    assert ("needs a person: no" in status_.render(report)) is (problem is None)


async def test_a_workload_out_of_budget_is_read_from_the_per_unit_ledger() -> None:
    from kcover import settings
    from kcover.aio import clock as clock_
    from kcover.kube import client as client_
    from kcover.kube import gateway
    from kcover.recovery import ledger
    from kcover.sim import server as simserver

    cfg = settings.Settings.model_validate({"recovery": {"max_restarts_per_window": 2}})
    now = clock_.utcnow()
    async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube:
        led = ledger.Ledger(gateway.Http(kube), namespace=cfg.recovery.ledger_namespace,
                            name=cfg.recovery.ledger_name, retention_seconds=lambda: 3600.0)

        def restarted(times: list[float], note: str) -> Callable[[ledger.Entry, dict[str, float]], None]:
            def mutate(entry: ledger.Entry, signals: dict[str, float]) -> None:
                assert isinstance(entry, ledger.Unit)
                for at in times:
                    entry.record(at, "")
                entry.note = note
            return mutate
        await led.update("w.u1", restarted([now.timestamp() - 60, now.timestamp() - 30], "PyTorchJob ml/train"),
                         now=now.timestamp())
        await led.update("w.u2", restarted([now.timestamp() - 30], ""), now=now.timestamp())
        report = await status_.gather(kube, cfg, now=now)
    assert [(w.key, w.what, w.restarts) for w in report.out_of_budget] == [("w.u1", "PyTorchJob ml/train", 2)]
    assert any("out of its restart budget" in p for p in report.problems())
