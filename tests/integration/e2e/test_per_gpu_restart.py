"""Per-GPU restarts under the device plugin, end to end: XID 13 on GPU 2 restarts only the job on GPU 2.

One GPU node with two opted-in jobs: `on2` holds GPU 2, `on5` holds GPU 5, as the node's kubelet says
through PodResources v1, served by a kubelet-like gRPC server on a unix socket
(tests/harness/podresources_server.py) and read by the agent's real client. The agent's NVML detector
(fake NVML) sees XID 13 (an application error, `restart-workload` in the XID policy) on GPU 2; its
Event names `on2`'s pod; the controller restarts `on2` alone, cordons nothing, and `on5` keeps its
pods. The MIG fixture: GPUs 2 and 5 are MIG-enabled with two instances each and the jobs hold a MIG
instance (`nvidia.com/mig-1g.10gb`, a MIG UUID) instead: the fault on GPU 2 maps to the pods holding
GPU 2's MIG instances. Simulated cluster (a real kube-apiserver runs the same agent and controller in
tests/integration/e2e/test_fault_table.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from harness.podresources_server import Container, Pod, PodResourcesServer

from kcover import layering, metrics, serving, settings
from kcover.agent import podresources
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.nvml import fake

Cluster = Any
WAIT = 25.0
RESTARTED = "KcoverRestartedWorkload"


async def _until(probe: Callable[[], Awaitable[bool]], what: str, within: float = WAIT) -> None:
    try:
        async with asyncio.timeout(within):
            while not await probe():  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


def _settings(ns: str, node: str) -> settings.Settings:
    off = {"enabled": False}
    return layering.layer(file_data={
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}},
        "lease": {"namespace": ns, "identity": "controller-a", "lease_duration_seconds": 4,
                  "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "agent": {"node_name": node, "event_namespace": ns, "min_write_interval_seconds": 0,
                  "event_dedupe_seconds": 0},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
        "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.1}},
                                  "dcgm": off, "metax": off, "script": off, "logscan": off}},
    }).settings


async def _job(cluster: Cluster, name: str, node: str, resource: str) -> dict[str, Any]:
    ns, kube = cluster.namespace, cluster.client
    job: dict[str, Any] = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": {
            "spec": {"nodeName": node, "restartPolicy": "OnFailure", "containers": [
                {"name": "pytorch", "image": "trainer", "resources": {"limits": {resource: "1"}}}]}}}}}})
    await cluster.harness.reconcile_jobs()
    for pod in await _pods(cluster, name):
        await cluster.harness.run_pod(ns, pod["metadata"]["name"])
    return job


async def _pods(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods",
                                          query={"labelSelector": f"training.kubeflow.org/job-name={job}"})
    return list(listed.get("items") or [])


def _holding(ns: str, pod: str, resource: str, device: str) -> Pod:
    return Pod(ns, pod, [Container("pytorch", devices={resource: [device]})])


@pytest.mark.sim_only("the simulated cluster, as the issue asks; the fault table runs the agent on kube-apiserver")
@pytest.mark.parametrize("mig", [False, True], ids=["whole-gpus", "mig"])
async def test_xid13_on_gpu2_restarts_only_the_job_on_gpu2(cluster: Cluster, mig: bool, tmp_path: Path) -> None:
    ns, kube = cluster.namespace, cluster.client
    node = f"gpu-node-{secrets.token_hex(3)}"
    nvml = fake.FakeNvml(8, mig={2: 2, 5: 2} if mig else None)
    resource = "nvidia.com/mig-1g.10gb" if mig else "nvidia.com/gpu"
    capacity = {resource: "4" if mig else "8", "cpu": "64", "pods": "110"}
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                                                      "status": {"capacity": capacity, "allocatable": capacity}})
    jobs = {name: await _job(cluster, name, node, resource) for name in ("on2", "on5")}
    before = {name: {p["metadata"]["uid"] for p in await _pods(cluster, name)} for name in jobs}
    nvml.init()
    device = {2: nvml.mig_devices(2)[1].uuid, 5: nvml.mig_devices(5)[0].uuid} if mig else \
        {2: nvml.device_info(2).uuid, 5: nvml.device_info(5).uuid}
    cfg = _settings(ns, node)
    stop = asyncio.Event()
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [_holding(ns, (await _pods(cluster, "on2"))[0]["metadata"]["name"], resource, device[2]),
                        _holding(ns, (await _pods(cluster, "on5"))[0]["metadata"]["name"], resource, device[5])]
        lookup = podresources.PodResources(kubelet.socket_path)
        await cluster.harness.run_agent_pod(ns, node)
        async with cluster.new_client() as agent_kube, cluster.new_client() as controller_kube, \
                cluster.harness.playing(interval=0.1):
            agent = agent_running.Agent(cfg, client=agent_kube, metrics=metrics.Metrics(), health=None, node=node,
                                        nvml=nvml, reporter_tick_seconds=0.1, pod_lookup=lookup)
            controller = controller_running.Controller(cfg, client=controller_kube, metrics=metrics.Metrics(),
                                                       health=serving.Health())

            async def restarted() -> set[str]:
                events = (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
                by_uid = {j["metadata"]["uid"]: name for name, j in jobs.items()}
                return {by_uid.get(e["involvedObject"].get("uid"), "?") for e in events if e.get("reason") == RESTARTED}

            async def replaced() -> bool:
                live = [p for p in await _pods(cluster, "on2") if not p["metadata"].get("deletionTimestamp")]
                return len(live) == 1 and live[0]["metadata"]["uid"] not in before["on2"]

            async with asyncio.TaskGroup() as group:
                group.create_task(controller.run(stop), name="controller")
                try:
                    await _until(lambda: _ready(controller), "the controller to lead with a synced cache")
                    group.create_task(agent.run(stop), name="agent")
                    await _until(lambda: _registered(nvml), "the agent's NVML detector to listen")
                    nvml.xid(13, gpu_index=2)
                    await _until(lambda: _is(restarted, {"on2"}), "kcover to restart on2")
                    await _until(replaced, "the operator to recreate on2's pod")
                    await asyncio.sleep(1.0)  # room for a wrong restart or cordon
                    assert await restarted() == {"on2"}
                    assert {p["metadata"]["uid"] for p in await _pods(cluster, "on5")} == before["on5"]
                    live = await kube.request("GET", f"/api/v1/nodes/{node}")
                    assert not live["spec"].get("unschedulable")
                    assert kubelet.calls["List"] >= 1
                finally:
                    stop.set()
    with contextlib.suppress(Exception):
        await kube.request("DELETE", f"/api/v1/nodes/{node}")


async def _is(probe: Callable[[], Awaitable[set[str]]], wanted: set[str]) -> bool:
    return await probe() == wanted


async def _ready(controller: controller_running.Controller) -> bool:
    return controller.is_leader() and controller.cache.synced


async def _registered(nvml: fake.FakeNvml) -> bool:
    return bool(nvml.registered)
