"""Device-level isolation through the recovery engine, against a real HTTP API server: what the server holds.

Two opted-in PyTorchJobs share node `gpu-0` under DRA: `a` holds device gpu-3, `b` holds gpu-5 (as
the kubelet reports them in `allocatedResourcesStatus`). Device gpu-3 turns Unhealthy: the server ends
up with kcover's DeviceTaintRule selecting exactly that device, `a`'s pods deleted, `b`'s untouched,
the node schedulable and untainted, and a KcoverTaintedDevice Event on the node. When the device is
reported healthy again the rule goes; a rule somebody else wrote stays. On a server that serves no
DeviceTaintRules (the simulated server with the resource taken out, as a 1.32 server), the same fault
of a node-level kind cordons the node instead and says so once, with `kcover_device_taints_served 0`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from enginekit import KF, Clock, Cluster, Rig, done

from kcover import kinds, model
from kcover.kube import caching
from kcover.kube import projections as proj
from kcover.recovery import devicetainting
from kcover.sim import registry

RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


def _device(node: str, name: str) -> model.DraDevice:
    return model.DraDevice(driver="gpu.nvidia.com", pool=node, device=name)


async def _seed(cluster: Cluster, node: str) -> dict[str, dict[str, Any]]:
    ns, kube = cluster.namespace, cluster.harness.kube
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                                                      "status": {"capacity": {"cpu": "8"}}})
    await kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}"} for i in range(8)]}})
    jobs: dict[str, dict[str, Any]] = {}
    for job, dev in (("a", "gpu-3"), ("b", "gpu-5")):
        created = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
            "apiVersion": KF, "kind": "PyTorchJob",
            "metadata": {"name": job, "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "OnFailure"}}}})
        jobs[job] = created
        pod = f"{job}-worker-0"
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "labels": {kinds.KUBEFLOW_JOB_NAME: job},
                         "ownerReferences": [{"apiVersion": KF, "kind": "PyTorchJob", "name": job,
                                              "uid": created["metadata"]["uid"], "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "trainer",
                                                       "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{job}-gpu"}]}})
        await cluster.harness.run_pod(ns, pod)
        await _health(cluster, pod, _device(node, dev), "Healthy")
    return jobs


async def _health(cluster: Cluster, pod: str, device: model.DraDevice, health: str) -> None:
    """What the kubelet writes from the DRA driver's health report (KEP-4680)."""
    ns, kube = cluster.namespace, cluster.harness.kube
    live = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
    live["status"]["containerStatuses"] = [{
        "name": "c", "image": "trainer", "imageID": "", "ready": True, "restartCount": 0,
        "state": {"running": {"startedAt": live["status"].get("startTime") or "2026-01-01T00:00:00Z"}},
        "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
            {"resourceID": device.resource_id, "health": health}]}]}]
    await kube.request("PUT", f"/api/v1/namespaces/{ns}/pods/{pod}/status", body=live)


async def _objects(cluster: Cluster) -> list[dict[str, Any]]:
    ns, kube = cluster.namespace, cluster.harness.kube
    out: list[dict[str, Any]] = []
    for path, kind, api in ((f"/api/v1/namespaces/{ns}/pods", "Pod", "v1"), ("/api/v1/nodes", "Node", "v1"),
                            (f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", "PyTorchJob", KF),
                            ("/apis/resource.k8s.io/v1/resourceslices", "ResourceSlice", "resource.k8s.io/v1")):
        for item in (await kube.request("GET", path)).get("items") or []:
            item.setdefault("apiVersion", api)
            item.setdefault("kind", kind)
            out.append(item)
    return out


def _fault(cluster: Cluster, pod: dict[str, Any], device: model.DraDevice, *, cleared: bool = False,
           clock: Clock) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="dra-health", severity=model.Severity.INFO if cleared else model.Severity.ERROR,
        reason="DeviceRecovered" if cleared else "DeviceUnhealthy", message="XID 79: GPU has fallen off the bus",
        target=model.Target(kind=model.TargetKind.POD, namespace=cluster.namespace, name=pod["metadata"]["name"],
                            uid=pod["metadata"]["uid"], node=pod["spec"]["nodeName"]),
        fault=model.Fault(dra=device, container="c"), cleared=cleared, observed_at=clock.now())


async def _node_events(cluster: Cluster, node: str) -> list[str]:
    listed = await cluster.harness.kube.request("GET", "/api/v1/namespaces/default/events")
    return [e["reason"] for e in listed.get("items") or [] if e["involvedObject"].get("name") == node]


async def test_an_unhealthy_device_is_tainted_its_job_restarted_and_the_node_left_schedulable(cluster: Cluster) -> None:
    await cluster.require("resource.k8s.io/v1", "resourceslices")
    await cluster.require("resource.k8s.io/v1beta2", "devicetaintrules")
    if why := await cluster.device_health_refused():
        pytest.skip(why)
    node = "dra-" + cluster.namespace
    await _seed(cluster, node)
    kube = cluster.harness.kube
    rig = Rig(cluster, Clock(), caching.ClusterCache.offline(await _objects(cluster)))
    dev3 = _device(node, "gpu-3")
    await _health(cluster, "a-worker-0", dev3, "Unhealthy")
    pod = await kube.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods/a-worker-0")
    try:
        results = await rig.handle(_fault(cluster, pod, dev3, clock=rig.clock))
        assert done(results) == ["taint_device:done", "restart_workload:done"]
        rule = await kube.request("GET", f"{RULES}/{devicetainting.rule_name(dev3)}")
        assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-3"}
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["spec"]["taint"]["key"] == "kcover.io/unhealthy"
        pods = {p["metadata"]["name"]: p for p in (await kube.request(
            "GET", f"/api/v1/namespaces/{cluster.namespace}/pods"))["items"]}
        assert "a-worker-0" not in pods or pods["a-worker-0"]["metadata"].get("deletionTimestamp")
        assert not pods["b-worker-0"]["metadata"].get("deletionTimestamp")
        live = await kube.request("GET", f"/api/v1/nodes/{node}")
        assert not live["spec"].get("unschedulable")
        assert not [t for t in live["spec"].get("taints") or [] if t["key"].startswith("kcover.io/")]
        assert "KcoverTaintedDevice" in await _node_events(cluster, node)
        assert rig.metrics.registry.get_sample_value("kcover_device_taints_served") == 1

        rig.clock.moment += dt.timedelta(seconds=30)
        results = await rig.handle(_fault(cluster, pod, dev3, cleared=True, clock=rig.clock))
        assert done(results) == ["untaint_device:done"]
        listed = await kube.request("GET", RULES)
        assert devicetainting.rule_name(dev3) not in {r["metadata"]["name"] for r in listed["items"]}
        assert "KcoverUntaintedDevice" in await _node_events(cluster, node)
    finally:
        for r in (await kube.request("GET", RULES))["items"]:
            if r["metadata"]["annotations"].get("kcover.io/node") == node:
                await kube.request("DELETE", f"{RULES}/{r['metadata']['name']}")
        await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-gpus")


@pytest.mark.sim_only("takes DeviceTaintRules out of the simulated server, as on a server without them")
async def test_without_device_taints_the_node_is_cordoned_and_that_is_said_once(cluster: Cluster) -> None:
    cluster.sim.store.registry = registry.Registry(tuple(r for r in registry.RESOURCES if r.plural != "devicetaintrules"))
    node = "dra-" + cluster.namespace
    await _seed(cluster, node)
    kube = cluster.harness.kube
    rig = Rig(cluster, Clock(), caching.ClusterCache.offline(await _objects(cluster)))
    dev3 = _device(node, "gpu-3")
    await _health(cluster, "a-worker-0", dev3, "Unhealthy")
    pod = await kube.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods/a-worker-0")
    agent = model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.ERROR, reason="XID79", message="fallen off the bus",
        target=model.Target(kind=model.TargetKind.DEVICE, name=node, node=node, device_id="GPU-3"),
        fault=model.Fault(xid=79, gpu_index=3, dra=dev3, pods=(f"{cluster.namespace}/a-worker-0",)),
        recommended=model.Action.CORDON_NODE, observed_at=rig.clock.now())
    results = await rig.handle(agent)
    assert done(results)[0] == "cordon_node:done", "no DeviceTaintRules: the node-level answer at once"
    live = await kube.request("GET", f"/api/v1/nodes/{node}")
    assert live["spec"].get("unschedulable") is True
    assert rig.metrics.registry.get_sample_value("kcover_device_taints_served") == 0
    assert rig.metrics.registry.get_sample_value("kcover_device_taint_fallbacks_total") == 1
    # a second device fault: answered at node level again (here, a restart only), said no second time
    results = await rig.handle(_fault(cluster, pod, dev3, clock=rig.clock))
    assert done(results) == ["restart_workload:done"]  # its rule restarts the holder; the node is cordoned already
    assert (await _node_events(cluster, node)).count("KcoverDeviceTaintsUnavailable") == 1
