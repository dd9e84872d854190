"""`kubectl get recoveries -A` after the pod-error, gpu-xid, restart-storm and restart-stalled scenarios.

Each scenario is played by the real controller replicas and agents on the simulated cluster (as
`kcover sim <scenario>` does); then the Recovery resources are read the way a person would: with a real
kubectl binary when one is found (the simulated server's Table output, columns as the CRD prints them),
and through the API in every case. One row per action, with the phase each should have ended in.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kcover.recovery import recoveries
from kcover.sim import cluster as cluster_
from kcover.sim import playing, scenarios

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "scenarios"))
import recordkit

SIZE = cluster_.Size(nodes=3, gpus_per_node=3, jobs=2, seed=3)
"""Room on two nodes for all six 1-GPU pods: the scheduler counts GPUs, and gpu-xid cordons one node."""
WAIT = 10.0


def _rows(items: list[dict[str, Any]]) -> Counter[tuple[str, str, str, str]]:
    """(namespace, action, kind, phase) per Recovery."""
    return Counter((i["metadata"]["namespace"], i["spec"]["decision"]["action"], i["spec"]["target"]["kind"],
                    (i.get("status") or {}).get("phase", "")) for i in items)


def _expected(name: str, c: cluster_.SimCluster, on_node: int) -> Counter[tuple[str, str, str, str]]:
    ns, system = cluster_.NAMESPACE, c.replicas[0].controller.settings.recovery.ledger_namespace
    if name == "pod-error":
        return Counter({(ns, "RestartWorkload", "PyTorchJob", "Recovered"): 1})
    if name == "gpu-xid":
        return Counter({(system, "CordonNode", "Node", "Recovered"): 1,
                        (ns, "RestartWorkload", "PyTorchJob", "Recovered"): on_node})
    if name == "restart-storm":
        budget = int(scenarios.RESTART_STORM.overrides["recovery"]["max_restarts_per_window"])
        # the job's own crash loop: restarted up to its budget, then refused; no node is blamed for it
        return Counter({(ns, "RestartWorkload", "PyTorchJob", "Recovered"): budget,
                        (ns, "Skip", "PyTorchJob", "Refused"): 1})
    return Counter({(ns, "RestartWorkload", "PyTorchJob", "Stalled"): 1})


async def _all(c: cluster_.SimCluster) -> list[dict[str, Any]]:
    return [e.obj() for e in c.srv.store.list(f"{recoveries.PLURAL}.{recoveries.GROUP}", _everything()).entries]


def _everything() -> Any:
    from kcover.sim import tables
    return tables.Filter()


async def _settled(c: cluster_.SimCluster, want: Counter[tuple[str, str, str, str]]) -> list[dict[str, Any]]:
    """The recoveries once they match `want`, or as they are after `WAIT` seconds (the writer is asynchronous)."""
    items = await _all(c)
    for _ in range(int(WAIT / 0.1)):
        if _rows(items) == want:
            break
        await asyncio.sleep(0.1)
        items = await _all(c)
    return items


@pytest.mark.parametrize("name", ["pod-error", "gpu-xid", "restart-storm", "restart-stalled"])
async def test_one_recovery_per_action_with_its_phase(name: str, tmp_path: Path) -> None:
    scenario = scenarios.catalogue()[name]
    async with cluster_.SimCluster(SIZE, overrides=scenario.overrides,
                                   agent_overrides=scenario.agent_overrides) as c:
        node = str(c.running_pods(c.jobs[0])[1]["spec"]["nodeName"])  # where gpu-xid strikes
        on_node = len(c.jobs_on_node(node))
        run = playing.Run(c)
        async with asyncio.timeout(scenario.timeout):
            await scenario.play(run)
        assert all(check.ok for check in run.checks), [check.text for check in run.checks if not check.ok]
        want = _expected(name, c, on_node)
        items = await _settled(c, want)
        kubeconfig = str(c.srv.write_kubeconfig(tmp_path / "kubeconfig"))
        table = await recordkit.kubectl_get(kubeconfig, None)
    assert _rows(items) == want, [(i["spec"]["decision"], i.get("status")) for i in items]
    for item in items:
        status = item["status"]
        assert status["detectedAt"], item
        if status["phase"] == "Recovered" and item["spec"]["decision"]["action"] == "RestartWorkload":
            assert status["mttrSeconds"] > 0
            assert status["recoveredAt"] >= status["actedAt"] >= status["detectedAt"]
        if status["phase"] == "Stalled":
            assert status["cause"] == "Unschedulable"
            assert "nodes are available" in status["message"]
        if status["phase"] == "Refused":
            assert status["cause"] == "BudgetExhausted"
    if table is not None:  # what a person reads: one row per action, its phase in the PHASE column
        header, rows = table[0], table[1:]
        assert header[:3] == ["NAMESPACE", "NAME", "PHASE"], header
        assert Counter((r[0], r[header.index("ACTION")], r[header.index("KIND")], r[2]) for r in rows) == want
