"""`kcover status`: what a person reads, and the exit code that says whether they must act.

The gpu-xid scenario runs on the simulated cluster (real controllers and agents, their settings in the
cluster's `kcover-config` ConfigMap as the chart holds them); `kcover status` then reads it through a
kubeconfig, as a person would, and must name the cordoned node and the restarted jobs and show the limits the
controllers run with (the simulation's 50 %, not the default 5 %). Where the ConfigMap cannot be used, status
says so and judges with its own settings. What needs a person is a table over the report's parts.
tests/integration/recovery/test_status_reads.py reads the breaker, limits, pauses, held restarts and suspects
on both backends.
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
from kcover.sim import cluster as cluster_
from kcover.sim import playing, scenarios
from kcover.status import deployed, gathering
from kcover.status import report as status_

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
        await scenario.play(playing.Run(c))
        kubeconfig = str(c.srv.write_kubeconfig(tmp_path / "kubeconfig"))
        running = c.replicas[0].controller.settings.recovery
        for _ in range(50):  # the Recovery writer runs beside the engine
            code, text = await asyncio.to_thread(_status, "--kubeconfig", kubeconfig)
            if text.count("RestartWorkload") == len(jobs):
                break
            await asyncio.sleep(0.1)
        code_json, doc_text = await asyncio.to_thread(_status, "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0, text
    assert "settings:   ConfigMap kcover-system/kcover-config (the controllers')" in text
    assert "acting:     on everything it decides\n" in text
    assert running.max_cordoned_fraction == 0.5  # the simulation's, unlike the default 0.05
    assert (f"  nodes cordoned at once:              1 of 2  (recovery.max_cordoned_fraction 0.5 of "
            f"{SIZE.nodes} GPU nodes, recovery.max_cordoned_nodes 50)\n") in text
    assert ("breaker:    closed, at its limit on cordons in 3600s: the next action counted there is refused and "
            "latches it\n") in text  # one cordon an hour on four GPU nodes (1 %, at least one)
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


def _limits(cordoned: int = 0) -> list[status_.Limit]:
    return [status_.Limit("nodes cordoned at once", cordoned, 1, "recovery.max_cordoned_fraction 0.1 of 10 GPU nodes"),
            status_.Limit("restarts in flight", None, 10, "recovery.max_concurrent_restarts 10", trips=False)]


def _report(**kw: object) -> status_.Report:
    leader = status_.Leader(holder="a", renewed_seconds_ago=1.0, held_seconds=60.0, duration_seconds=15)
    report = status_.Report(lease="kcover-system/kcover-controller", leader=leader, gpu_nodes=10,
                            settings=deployed.Source("kcover-system/kcover-config", found=True), limits=_limits())
    for key, value in kw.items():
        setattr(report, key, value)
    return report


def _row(phase: str) -> status_.Row:
    return status_.Row("ml", "r", phase, "RestartWorkload", "PyTorchJob ml/train", "XID79", cause="Unschedulable")


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"leader": status_.Leader()}, "no controller leads"),
    ({"leader": status_.Leader(holder="a", renewed_seconds_ago=40.0, duration_seconds=15)}, "last renewed by a 40s ago"),
    ({"breaker": status_.Breaker(latched=True, since="2026-05-01T13:00:00Z", reason="too many restarts",
                                 cooldown_seconds=300)},
     "latched open since 2026-05-01T13:00:00Z (too many restarts); `kcover breaker reset` closes the latch; then "
     "restarts and cordons stay refused for 300s"),
    ({"limits": _limits(cordoned=1)}, None),  # the next cordon latches it: then a person is needed
    ({"limits": _limits(cordoned=1), "breaker": status_.Breaker(latch=False)},
     "the breaker's limit on nodes cordoned at once is reached (1 of 1"),
    ({"breaker": status_.Breaker(reset_at="2026-05-01T13:00:00Z", cooling_seconds_left=100)}, None),  # cooling
    ({"held": [status_.Held("w.u", "PyTorchJob ml/train", "Paused", "paused", "t0", "t1")]}, None),
    ({"suspects": [status_.Suspect("n1", "t0", "3 different workloads")]}, None),
    ({"settings": deployed.Source("kcover-system/kcover-config", problem="ConfigMap kcover-system/kcover-config "
                                  "not found")}, "the controllers' settings were not read (ConfigMap"),
    ({"ledger_available": False}, "the LedgerEntry CRD (ledgerentries.kcover.io) is not served"),
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
    from kcover.recovery import ledger, ledgerentries
    from kcover.sim import server as simserver

    cfg = settings.Settings.model_validate({"recovery": {"max_restarts_per_window": 2}})
    now = clock_.utcnow()
    async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube:
        led = ledger.Ledger(gateway.Http(kube), namespace=cfg.recovery.ledger_namespace,
                            name=cfg.recovery.ledger_name, retention_seconds=lambda: 3600.0)

        def restarted(times: list[float], note: str) -> Callable[[ledgerentries.Entry, dict[str, float]], None]:
            def mutate(entry: ledgerentries.Entry, signals: dict[str, float]) -> None:
                assert isinstance(entry, ledgerentries.Unit)
                for at in times:
                    entry.record(at, "")
                entry.note = note
            return mutate
        await led.update("w.u1", restarted([now.timestamp() - 60, now.timestamp() - 30], "PyTorchJob ml/train"),
                         now=now.timestamp())
        await led.update("w.u2", restarted([now.timestamp() - 30], ""), now=now.timestamp())
        report = await gathering.gather(kube, cfg, now=now)
    assert [(w.key, w.what, w.restarts) for w in report.out_of_budget] == [("w.u1", "PyTorchJob ml/train", 2)]
    assert any("out of its restart budget" in p for p in report.problems())
