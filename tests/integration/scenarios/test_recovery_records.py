"""Recovery resources on every cluster backend: what `kubectl get recoveries` shows after kcover acted.

The real controller runs against the backend (on `apiserver` the Recovery CRD is installed with the
session's test CRDs, tests/controlplane/crds/kcover-recoveries.yaml, a link to the chart's file); the
harness plays kubelet and operator. A restart that runs again ends `Recovered` with its MTTR, a restart
past the budget is a `Refused` row with the code, a restart whose pods cannot be scheduled ends
`Stalled` with the cause. `kubectl get recoveries` (a real kubectl binary, when one is found) prints the
same columns from kube-apiserver's Table and from the simulated server's.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from pathlib import Path
from typing import Any

import recordkit
import test_closed_loop_scenarios as loop
import test_recovery_scenarios as base

from kcover.recovery import recoveries

Cluster = Any
COLUMNS = ["NAME", "PHASE", "ACTION", "TARGET", "KIND", "FAULT", "CAUSE", "MTTR", "DETECTED", "AGE"]


async def _recoveries(cluster: Cluster) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", recoveries.collection(cluster.namespace))
    return list(listed.get("items") or [])


async def _until_phases(cluster: Cluster, want: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Wait until the namespace's recoveries are exactly `want` ((action, phase), any order)."""
    async def probe() -> list[dict[str, Any]] | None:
        items = await _recoveries(cluster)
        got = sorted((i["spec"]["decision"]["action"], (i.get("status") or {}).get("phase", "")) for i in items)
        return items if got == sorted(want) else None
    try:
        return await base._until(probe, f"recoveries {sorted(want)}")
    except AssertionError:
        items = await _recoveries(cluster)
        raise AssertionError(f"recoveries: {[(i['spec']['decision'], i.get('status')) for i in items]}") from None


async def test_a_restart_is_recorded_recovered_and_a_refusal_refused(cluster: Cluster, tmp_path: Path) -> None:
    node = f"rec-{secrets.token_hex(3)}"
    await base._node(cluster.client, node)
    train = await base._job(cluster, "train", node)
    uid, ns = train["metadata"]["uid"], cluster.namespace
    pods = await base._pods(cluster, "train")
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, max_restarts_per_window=1,
                                                            workload_cooldown_seconds=0.5,
                                                            resume_interval_seconds=0.3):
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="worker group failed")
        await base._until(functools.partial(base._restarts, cluster, uid, 1), "the restart of PyTorchJob train")
        for pod in await base._recreated(cluster, "train", base._uids(pods)):
            await cluster.harness.run_pod(ns, pod["metadata"]["name"])
        await _until_phases(cluster, [("RestartWorkload", "Recovered")])
        await asyncio.sleep(1.0)  # past the cooldown: only the budget refuses now
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="failed again")
        items = await _until_phases(cluster, [("RestartWorkload", "Recovered"), ("Skip", "Refused")])
        table = await recordkit.kubectl_get(cluster.kubeconfig_path, ns)
    restart = next(i for i in items if i["spec"]["decision"]["action"] == "RestartWorkload")
    refused = next(i for i in items if i["spec"]["decision"]["action"] == "Skip")
    assert restart["spec"]["target"] == {"kind": "PyTorchJob", "name": "train", "namespace": ns, "uid": uid,
                                         "apiVersion": "kubeflow.org/v1", "node": node}
    assert restart["spec"]["fault"]["detector"] == "pod-status"
    assert restart["spec"]["fault"]["identity"] == {"container": base.CONTAINER}
    status = restart["status"]
    assert status["detectedAt"] <= status["actedAt"] <= status["recoveredAt"]
    assert 0 < status["mttrSeconds"] < base.WAIT
    assert refused["status"]["cause"] == "BudgetExhausted"
    assert refused["spec"]["decision"]["code"] == "BudgetExhausted"
    assert "actedAt" not in refused["status"]
    if table is not None:  # the same columns from kube-apiserver's Table and the simulated server's
        assert table[0] == COLUMNS, table
        assert sorted(row[1] for row in table[1:]) == ["Recovered", "Refused"], table


async def test_a_stalled_restart_is_recorded_stalled_with_its_cause(cluster: Cluster, tmp_path: Path) -> None:
    node = f"rec-{secrets.token_hex(3)}"
    await base._node(cluster.client, node)
    await base._job(cluster, "train", node)
    ns = cluster.namespace
    old = base._uids(await base._pods(cluster, "train"))
    async with cluster.harness.playing(), base._controllers(cluster, tmp_path, verify={"deadline_seconds": 2.0},
                                                            resume_interval_seconds=0.3):
        await cluster.harness.fail_container(ns, "train-worker-1", base.CONTAINER, message="worker group failed")
        await _until_phases(cluster, [("RestartWorkload", "Verifying")])
        for pod in await base._recreated(cluster, "train", old):  # the scheduler cannot place them
            await cluster.harness.set_status(ns, pod["metadata"]["name"], loop._unschedulable)
        items = await _until_phases(cluster, [("RestartWorkload", "Stalled")])
    assert items[0]["status"]["cause"] == "Unschedulable"
    assert loop.MESSAGE in items[0]["status"]["message"]
    assert "recoveredAt" not in items[0]["status"]
