"""XID 79 end to end on every cluster backend (the simulated server and a real kube-apiserver).

The real agent (fake NVML backend, real detectors and reporter) and the real controller (cache,
detectors, engine, Lease) run against the backend; the harness plays kubelet and training operator.
What a user sees: the agent marks the node KcoverGPUHealthy=False and posts an Event as
`kcover.io/agent`; the controller cordons and taints the node and restarts the opted-in job whose
pods ran there, leaving another node's job alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

from kcover import layering, metrics, serving, settings
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.nvml import fake

Cluster = Any  # tests/backends.py's Cluster


async def _job(kube: Any, ns: str, name: str, node: str | list[str], harness: Any) -> dict[str, Any]:
    """A 2-worker PyTorchJob, both running on `node` (or worker i on `node[i]`)."""
    nodes = node if isinstance(node, list) else [node, node]
    job: dict[str, Any] = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure"}}}})
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
             "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    for i in range(2):
        pod = f"{name}-worker-{i}"
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "ownerReferences": [owner],
                         "labels": {"training.kubeflow.org/job-name": name,
                                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                                    "training.kubeflow.org/replica-type": "worker",
                                    "training.kubeflow.org/replica-index": str(i)}},
            "spec": {"nodeName": nodes[i], "restartPolicy": "OnFailure",
                     "containers": [{"name": "pytorch", "image": "trainer"}]}})
        await harness.run_pod(ns, pod)
    return job


async def _node(kube: Any, name: str) -> None:
    await kube.request("POST", "/api/v1/nodes", body={
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    node["status"] = {"capacity": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
                      "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


def _settings(ns: str, node: str, **detectors: dict[str, Any]) -> settings.Settings:
    """The test's agent and controller settings; `detectors`: more detector entries (name: entry)."""
    return layering.layer(file_data={
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}},
        "lease": {"namespace": ns, "identity": "controller-a", "lease_duration_seconds": 4,
                  "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "agent": {"node_name": node, "event_namespace": ns, "min_write_interval_seconds": 0},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
        "detectors": {"entries": {
            "nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.1}},
            "dcgm": {"enabled": False},
            "node-condition": {"config": {"min_duration_seconds": 0, "tick_seconds": 0.2}},
            **detectors,
        }},
    }).settings


@contextlib.asynccontextmanager
async def _roles(cluster: Cluster, cfg: settings.Settings, node: str,
                 nvml: fake.FakeNvml) -> AsyncIterator[tuple[agent_running.Agent, controller_running.Controller]]:
    """The real agent on `node` (over `nvml`) and the real controller, running against the backend, each with
    its own client, while the harness plays kubelet and operator; both stopped when the block ends."""
    stop = asyncio.Event()
    async with cluster.new_client() as agent_kube, cluster.new_client() as controller_kube, \
            cluster.harness.playing(interval=0.1):
        agent = agent_running.Agent(cfg, client=agent_kube, metrics=metrics.Metrics(), health=None,
                                    node=node, nvml=nvml, reporter_tick_seconds=0.1)
        controller = controller_running.Controller(cfg, client=controller_kube, metrics=metrics.Metrics(),
                                                   health=serving.Health())
        async with asyncio.TaskGroup() as group:
            group.create_task(agent.run(stop), name="agent")
            group.create_task(controller.run(stop), name="controller")
            try:
                yield agent, controller
            finally:
                stop.set()


async def test_xid79_cordons_the_node_and_restarts_the_job_that_ran_there(cluster: Cluster) -> None:
    ns = cluster.namespace
    suffix = secrets.token_hex(3)
    sick, healthy = f"xid-sick-{suffix}", f"xid-healthy-{suffix}"
    kube = cluster.client
    nvml = fake.FakeNvml(8)
    try:
        await _node(kube, sick)
        await _node(kube, healthy)
        hit = await _job(kube, ns, "hit", sick, cluster.harness)
        spared = await _job(kube, ns, "spared", healthy, cluster.harness)
        await cluster.harness.run_agent_pod(ns, sick)
        cfg = _settings(ns, sick)
        async with _roles(cluster, cfg, sick, nvml) as (_, controller):
            async with asyncio.timeout(20):
                while not (controller.is_leader() and controller.cache.synced and nvml.registered):  # noqa: ASYNC110  (polling plain state)
                    await asyncio.sleep(0.05)
                nvml.xid(79, gpu_index=3)
                while True:
                    node = await kube.request("GET", f"/api/v1/nodes/{sick}")
                    spec = node.get("spec") or {}
                    taints = {(t["key"], t["effect"]) for t in spec.get("taints") or []}
                    if spec.get("unschedulable") and ("kcover.io/unhealthy", "NoSchedule") in taints:
                        break
                    await asyncio.sleep(0.1)
                while True:  # the job that ran there comes back with new pods
                    pods = (await kube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                               query={"labelSelector": "training.kubeflow.org/job-name=hit"}))["items"]
                    events = (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
                    if any(e.get("reason") == "KcoverRestartedWorkload" for e in events) and len(pods) == 2 \
                            and all(p["metadata"]["creationTimestamp"] for p in pods):
                        break
                    await asyncio.sleep(0.1)
        conditions = {c["type"]: c for c in node["status"].get("conditions") or []}
        assert conditions["KcoverGPUHealthy"]["status"] == "False"
        assert "79" in conditions["KcoverGPUHealthy"]["message"]
        assert node["metadata"]["annotations"]["kcover.io/cordoned-by"] == "kcover"
        agent_events = [e for e in (await kube.request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
                        if e["involvedObject"].get("name") == sick and e.get("reportingComponent") == "kcover.io/agent"]
        assert agent_events
        restarted = [e for e in events if e.get("reason") == "KcoverRestartedWorkload"]
        assert [e["involvedObject"]["uid"] for e in restarted] == [hit["metadata"]["uid"]]
        assert spared["metadata"]["uid"] not in {e["involvedObject"].get("uid") for e in events}
        still = (await kube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                    query={"labelSelector": "training.kubeflow.org/job-name=spared"}))["items"]
        assert sorted(p["metadata"]["name"] for p in still) == ["spared-worker-0", "spared-worker-1"]
        assert all(not p["metadata"].get("deletionTimestamp") for p in still)
        healthy_node = await kube.request("GET", f"/api/v1/nodes/{healthy}")
        assert not (healthy_node.get("spec") or {}).get("unschedulable")
    finally:
        for name in (sick, healthy):
            await kube.request("DELETE", f"/api/v1/nodes/{name}")
