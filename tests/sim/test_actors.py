"""Simulated kubelets and Kubeflow operators acting on the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from kcover.sim import actors, status
from kcover.sim import server as simserver

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
MERGE = "application/merge-patch+json"


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[simserver.SimServer, actors.Kubelets]]:
    async with simserver.SimServer(seed=2) as srv:
        srv.store.create("nodes", {"metadata": {"name": "gpu-0"}, "spec": {}})
        srv.store.create("nodes", {"metadata": {"name": "bad"}, "spec": {"unschedulable": True}})
        kubelets = actors.Kubelets(srv, start_delay=0.01, finish_delay=0.05)
        operators = actors.KubeflowOperators(srv, interval=0.05)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(kubelets.run(stop), name="kubelets")
            tg.create_task(operators.run(stop), name="operators")
            yield srv, kubelets
            stop.set()


async def eventually(check: Callable[[], bool], seconds: float = 5) -> None:
    async with asyncio.timeout(seconds):
        while True:  # polling the store is the point
            if check():
                return
            await asyncio.sleep(0.02)


def job() -> dict[str, object]:
    template = {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                         "containers": [{"name": "pytorch", "image": "t",
                                         "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]}}
    return {"metadata": {"name": "train"}, "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": template}, "Worker": {"replicas": 2, "template": template}}}}


async def test_job_pods_run_and_come_back(cluster: tuple[simserver.SimServer, actors.Kubelets]) -> None:
    srv, kubelets = cluster
    made = srv.store.create("pytorchjobs.kubeflow.org", job())

    def running() -> list[dict[str, object]]:
        return [p for p in srv.store.iter_objects("pods") if p["status"].get("phase") == "Running"]

    await eventually(lambda: len(running()) == 3)
    pod = srv.store.get("pods", "default", "train-worker-1")
    assert pod["spec"]["nodeName"] == "gpu-0"
    assert pod["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert pod["metadata"]["labels"]["training.kubeflow.org/replica-index"] == "1"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    old_uid = pod["metadata"]["uid"]
    _, gone = srv.store.delete("pods", "default", "train-worker-1")
    assert not gone  # graceful: the kubelet finishes it
    await eventually(lambda: srv.store.count("pods") == 3 and all(
        p["metadata"]["uid"] != old_uid for p in srv.store.iter_objects("pods")) and len(running()) == 3)
    kubelets.set_device_health("default", "train-worker-0", "pytorch", resource_name="claim:gpu/gpu",
                               resource_id="gpu.nvidia.com/pool/gpu-3", message="XID 79")
    failed = kubelets.fail_container("default", "train-master-0", "pytorch", exit_code=137)
    assert failed["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    health = srv.store.get("pods", "default", "train-worker-0")["status"]["containerStatuses"][0]
    assert health["allocatedResourcesStatus"] == [{"name": "claim:gpu/gpu", "resources": [
        {"resourceID": "gpu.nvidia.com/pool/gpu-3", "health": "Unhealthy", "message": "XID 79"}]}]
    with pytest.raises(status.ApiError):
        srv.store.get("pods", "default", "train-worker-9")
    # a name the container has no claim (or resource) for is refused, as a real server refuses it
    with pytest.raises(status.ApiError) as refused:
        kubelets.set_device_health("default", "train-worker-0", "pytorch", resource_name="claim:other/gpu",
                                   resource_id="gpu.nvidia.com/pool/gpu-4")
    assert refused.value.status == 422
    assert refused.value.status_obj["details"]["causes"][0]["field"] == (
        "status.containerStatuses[0].allocatedResourcesStatus[1].name")
    assert srv.store.get("pods", "default", "train-worker-0")["status"]["containerStatuses"][0] == health


async def test_ready_node_loses_admission_taint_and_takes_pending_pods(
        cluster: tuple[simserver.SimServer, actors.Kubelets]) -> None:
    srv, _ = cluster
    async with aiohttp.ClientSession(srv.url) as http:
        srv.store.update("nodes", {**srv.store.get("nodes", "", "gpu-0"), "spec": {"unschedulable": True}})
        async with http.post("/api/v1/namespaces/default/pods", json={
                "metadata": {"name": "waits"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}) as resp:
            assert resp.status == 201
        async with http.post("/api/v1/nodes", json={"metadata": {"name": "late"}}) as resp:
            assert (await resp.json())["spec"]["taints"] == [NOT_READY]
        await asyncio.sleep(0.2)  # not Ready yet: the taint stays and keeps the pod off the node
        assert srv.store.get("nodes", "", "late")["spec"]["taints"] == [NOT_READY]
        assert not srv.store.get("pods", "default", "waits")["spec"].get("nodeName")
        async with http.patch("/api/v1/nodes/late/status", json={"status": {"conditions": [
                {"type": "Ready", "status": "True"}]}}, headers={"Content-Type": MERGE}) as resp:
            assert resp.status == 200
        await eventually(lambda: srv.store.get("pods", "default", "waits")["spec"].get("nodeName") == "late")
        assert "taints" not in srv.store.get("nodes", "", "late")["spec"]
        async with http.patch("/api/v1/nodes/late/status", json={"status": {"conditions": [
                {"type": "Ready", "status": "False"}]}}, headers={"Content-Type": MERGE}) as resp:
            assert resp.status == 200
        await eventually(lambda: srv.store.get("nodes", "", "late")["spec"].get("taints") == [NOT_READY])
