"""The recovery engine reading the product's one cluster model, on every backend: GPU nodes and workload pods.

The snapshot is a `ClusterCache` filled from the server's objects through the reflectors' list path
(`ClusterCache.offline`). What is asserted is what the API server ends up holding: which nodes are
unschedulable and tainted by kcover, which pods were deleted, what the ledger recorded.

* The cordon breaker counts GPU nodes by `kube.gpus`: on a cluster whose GPUs are published only as
  DRA ResourceSlices, only as MIG slices, or only as AMD GPUs, kcover cordons up to
  `recovery.max_cordoned_fraction` of those nodes and refuses past it. CPU nodes (one of them with a
  non-GPU DRA driver, one labelled `nvidia.com/gpu.present` without any GPU) are in each cluster and
  must not count: counted, the breaker would let one more cordon through.
  On a server that serves no `resource.k8s.io/v1` ResourceSlices (before Kubernetes 1.34 without the
  runtime-config) the DRA-only cluster is skipped, saying so, and the others are built without slices.
* A JobSet restart deletes, and records in its ledger intent, every pod of the JobSet (through its
  Jobs), not only the faulting pod.
"""

from __future__ import annotations

import contextlib

import pytest
from enginekit import Clock, Cluster, Rig, done, items, ledger_data

from kcover import errors, kinds, model
from kcover.kube import projections as proj
from kcover.recovery import steps as st

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def node_fault(node: str, clock: Clock) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU has fallen off the bus", observed_at=clock.now(),
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node))


# ------------------------------------------------------------------------------------------ GPU nodes

CLUSTERS = {
    # flavour: (capacity of each GPU node, DRA driver publishing its GPUs or "")
    "dra-only": ({}, "gpu.nvidia.com"),
    "mig": ({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}, ""),
    "amd": ({"amd.com/gpu": "8"}, ""),
}
GPU_NODES = 5
FRACTION = 0.4
"""With 5 GPU nodes: two cordons (0/5, then 1/5 held) pass, the third (2/5 held) is refused. Were the 4
CPU nodes counted (2/9 < 0.4), the third would pass; were no node counted, the first would be refused."""


async def _make_nodes(cluster: Cluster, flavour: str) -> tuple[list[str], list[str]]:
    capacity, driver = CLUSTERS[flavour]
    if driver:
        await cluster.require("resource.k8s.io/v1", "resourceslices")
    dra = await cluster.serves("resource.k8s.io/v1", "resourceslices")
    prefix = cluster.namespace
    gpu_nodes = [f"{prefix}-gpu-{i}" for i in range(GPU_NODES)]
    cpu_nodes = [f"{prefix}-cpu-{i}" for i in range(4)]
    for name in gpu_nodes:
        await cluster.harness.kube.request("POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": {"cpu": "96", "memory": "1Ti", "pods": "110", **capacity}}})
    for i, name in enumerate(cpu_nodes):
        labels = {"nvidia.com/gpu.present": "true"} if i == 0 else {}
        await cluster.harness.kube.request("POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"cpu": "96", "memory": "1Ti", "pods": "110"}}})
    slices = [(name, driver) for name in gpu_nodes if driver] + [(cpu_nodes[1], "nic.example.com")]
    for node, slice_driver in slices if dra else ():
        await cluster.harness.kube.request("POST", SLICES, body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{slice_driver.replace('.', '-')}"},
            "spec": {"driver": slice_driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"dev-{i}"} for i in range(4)]}})
    return gpu_nodes, cpu_nodes


async def _drop_slices(cluster: Cluster) -> None:
    if not await cluster.serves("resource.k8s.io/v1", "resourceslices"):
        return
    for item in await items(cluster, SLICES):
        if item["metadata"]["name"].startswith(cluster.namespace):
            with contextlib.suppress(errors.NotFoundError):
                await cluster.harness.kube.request(
                    "DELETE", f"{SLICES}/{item['metadata']['name']}")


@pytest.mark.parametrize("flavour", sorted(CLUSTERS))
async def test_the_breaker_counts_gpu_nodes_by_the_one_rule(cluster: Cluster, flavour: str) -> None:
    try:
        gpu_nodes, cpu_nodes = await _make_nodes(cluster, flavour)
        rig = await Rig.make(cluster, Clock(), max_cordoned_fraction=FRACTION,  # the window's limits out of the way
                             max_cordons_per_window=100, max_cordons_per_window_fraction=1.0,
                             rules=[{"detector": "node-condition", "action": "cordon-node"}])
        ours = {n for n in rig.snap.nodes if n.startswith(cluster.namespace)}
        assert {n for n in ours if rig.snap.is_gpu_node(rig.snap.nodes[n])} == set(gpu_nodes)
        outcomes = []
        for name in gpu_nodes[:3]:
            outcomes += [o for o in done(await rig.handle(node_fault(name, rig.clock))) if o.startswith(("cordon", "refuse"))]
            await rig.refresh()
        assert outcomes == ["cordon_node:done", "cordon_node:done", "refuse:BreakerOpen"]

        held = {}
        for name in [*gpu_nodes, *cpu_nodes]:
            node = await cluster.harness.kube.request("GET", f"/api/v1/nodes/{name}")
            kcover_taints = [t for t in node["spec"].get("taints") or [] if t["key"] == "kcover.io/unhealthy"]
            cordoned = (node["metadata"].get("annotations") or {}).get(proj.CORDONED_BY) == "kcover"
            held[name] = (bool(node["spec"].get("unschedulable")), len(kcover_taints), cordoned)
        assert held == {name: ((True, 1, True) if name in gpu_nodes[:2] else (False, 0, False))
                        for name in [*gpu_nodes, *cpu_nodes]}
        skipped = [e for e in await items(cluster, "/api/v1/namespaces/default/events")
                   if e["reason"] == "KcoverRecoverySkipped" and e["involvedObject"]["name"] == gpu_nodes[2]]
        assert len(skipped) == 1
        assert f"kcover holds 2 of {GPU_NODES} GPU nodes cordoned" in skipped[0]["message"]
    finally:
        await _drop_slices(cluster)


# ------------------------------------------------------------------------------------------ JobSet pods

async def test_a_jobset_restart_deletes_and_records_all_its_pods(cluster: Cluster) -> None:
    ns = cluster.namespace
    kube = cluster.harness.kube
    for i in range(4):
        await kube.request("POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{ns}-gpu-{i}"},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    js = await kube.request("POST", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", body={
        "apiVersion": JOBSET_API, "kind": "JobSet",
        "metadata": {"name": "llm", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"replicatedJobs": [{"name": "worker", "replicas": 2, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "trainer"}]}}}}}]}})
    js_ref = {"apiVersion": JOBSET_API, "kind": "JobSet", "name": "llm", "uid": js["metadata"]["uid"],
              "controller": True}
    members = {kinds.JOBSET_NAME: "llm", kinds.JOBSET_UID: js["metadata"]["uid"]}
    pods: dict[str, str] = {}
    for j in range(2):
        job = await kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"llm-worker-{j}", "namespace": ns, "labels": members, "ownerReferences": [js_ref]},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": members}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "trainer"}]}}}})
        job_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                   "uid": job["metadata"]["uid"], "controller": True}
        for p in range(2):
            name = f"llm-worker-{j}-{p}"
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [job_ref],
                             "labels": {**members, kinds.BATCH_JOB_NAME: job["metadata"]["name"]}},
                "spec": {"nodeName": f"{ns}-gpu-{2 * j + p}", "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "trainer"}]}})
            pods[name] = (await cluster.harness.run_pod(ns, name))["metadata"]["uid"]
    rig = await Rig.make(cluster, Clock())
    assert sorted(p.name for p in rig.snap.pods_of_workload(js["metadata"]["uid"])) == sorted(pods)

    faulting = "llm-worker-1-0"
    event = model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                 message="exit code 1", observed_at=rig.clock.now(),
                                 target=model.Target(kind=model.TargetKind.POD, namespace=ns, name=faulting,
                                                     uid=pods[faulting]))
    [result] = await rig.handle(event)
    assert isinstance(result, st.Done)
    assert result.removed == 4
    assert rig.kube.request_counts["CREATE pods/eviction"] == 4  # a JobSet's pods are evicted
    alive = {o["metadata"]["name"] for o in await items(cluster, f"/api/v1/namespaces/{ns}/pods")
             if not o["metadata"].get("deletionTimestamp")}
    assert alive == set()
    entry = (await ledger_data(cluster))[f"w.{js['metadata']['uid']}"]
    intent = entry["p"]
    assert intent["u"][0] == pods[faulting]  # the faulting pod first, then every other pod of the JobSet
    assert sorted(intent["u"]) == sorted(pods.values())
    assert intent["a"] is True, "every member is recorded"
