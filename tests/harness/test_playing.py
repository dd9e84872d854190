"""The harness on every backend: what a kubelet and a job operator write is accepted and held by the server.

Also the pure shapes of `kcover.sim.behaviour` the harness and the sim's actors share.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kcover.sim import behaviour

Cluster = Any  # tests/backends.py's Cluster
NOW = "2026-01-01T00:00:00Z"
JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
       "metadata": {"name": "bert", "namespace": "ml", "uid": "u-1"},
       "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 2, "template": {
           "metadata": {"labels": {"team": "a"}},
           "spec": {"containers": [{"name": "pytorch", "image": "trainer"}]}}}}}}


def test_job_pods_name_label_and_own_every_replica() -> None:
    pods = behaviour.job_pods(JOB, "pytorchjobs.kubeflow.org")
    assert [p["metadata"]["name"] for p in pods] == ["bert-master-0", "bert-worker-0", "bert-worker-1"]
    worker = pods[2]["metadata"]
    assert worker["labels"] == {"team": "a", behaviour.JOB_NAME: "bert",
                                behaviour.OPERATOR_NAME: "pytorchjob-controller",
                                behaviour.REPLICA_TYPE: "worker", behaviour.REPLICA_INDEX: "1"}
    assert pods[0]["metadata"]["labels"][behaviour.JOB_ROLE] == "master"
    assert worker["ownerReferences"] == [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "bert",
                                          "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]
    assert pods[2]["spec"]["restartPolicy"] == "OnFailure"
    deleting = {**JOB, "metadata": {**JOB["metadata"], "deletionTimestamp": NOW}}
    assert behaviour.job_pods(deleting, "pytorchjobs.kubeflow.org") == []


POD = {"metadata": {"name": "p"}, "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "i"}]},
       "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("pod", "phase"), [
    (POD, "Running"),
    ({**POD, "status": {"phase": "Running"}}, None),  # already started
    ({**POD, "metadata": {"name": "p", "deletionTimestamp": NOW}}, None),  # being deleted
])
def test_running_status(pod: dict[str, Any], phase: str | None) -> None:
    st = behaviour.running_status(pod, NOW)
    assert (st or {}).get("phase") == phase
    if st is not None:
        assert st["containerStatuses"][0]["state"] == {"running": {"startedAt": NOW}}


@pytest.mark.parametrize(("policy", "restart", "want_state", "want_phase", "want_count"), [
    ("Always", None, "running", "Running", 1),    # restarted in place, lastState keeps the error
    ("Never", None, "terminated", "Failed", 0),   # stays terminated, the pod fails
    ("Always", False, "terminated", "Running", 0),  # seen between exit and restart
])
def test_failed_container_status(policy: str, restart: bool | None, want_state: str, want_phase: str,
                                 want_count: int) -> None:
    pod = {**POD, "spec": {**POD["spec"], "restartPolicy": policy}}
    pod["status"] = behaviour.running_status(pod, NOW)
    st = behaviour.failed_container_status(pod, "c", NOW, exit_code=3, restart=restart)
    cs = st["containerStatuses"][0]
    assert list(cs["state"]) == [want_state]
    assert st["phase"] == want_phase
    assert cs["restartCount"] == want_count
    ended = cs["state"].get("terminated") or cs["lastState"]["terminated"]
    assert (ended["exitCode"], ended["reason"]) == (3, "Error")
    assert pod["status"]["containerStatuses"][0]["state"] == {"running": {"startedAt": NOW}}  # input untouched


def test_device_health_replaces_only_that_device() -> None:
    pod = {**POD, "status": behaviour.running_status(POD, NOW)}
    st = behaviour.device_health_status(pod, "c", resource_name="claim:g/g", resource_id="a", health="Healthy")
    pod["status"] = behaviour.device_health_status({**pod, "status": st}, "c", resource_name="claim:g/g",
                                                   resource_id="b", health="Healthy")
    st = behaviour.device_health_status(pod, "c", resource_name="claim:g/g", resource_id="a", health="Unhealthy",
                                        message="XID 79")
    assert st["containerStatuses"][0]["allocatedResourcesStatus"] == [{"name": "claim:g/g", "resources": [
        {"resourceID": "b", "health": "Healthy"}, {"resourceID": "a", "health": "Unhealthy", "message": "XID 79"}]}]


# ------------------------------------------------------------------------------------------------ on a server

async def pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods")
    return {p["metadata"]["name"]: p for p in listed["items"]}


async def test_kubelet_writes_are_accepted_and_held(cluster: Cluster) -> None:
    ns, kube, harness = cluster.namespace, cluster.client, cluster.harness
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "p-gpu"}],
                 "containers": [{"name": "c", "image": "trainer",
                                 "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]}})
    await harness.run_pod(ns, "p", "n1")  # binds, then runs
    await harness.set_device_health(ns, "p", "c", resource_name="claim:gpu/gpu", resource_id="pool/gpu-0",
                                    health="Unhealthy", message="XID 79")
    await harness.fail_container(ns, "p", "c", exit_code=3)
    pod = (await pods(cluster))["p"]
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["status"]["phase"] == "Running"
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 3
    assert cs["allocatedResourcesStatus"] == [{"name": "claim:gpu/gpu", "resources": [
        {"resourceID": "pool/gpu-0", "health": "Unhealthy", "message": "XID 79"}]}]


async def test_operator_recreates_deleted_job_pods_once_deletions_finish(cluster: Cluster) -> None:
    ns, kube, harness = cluster.namespace, cluster.client, cluster.harness
    job = await kube.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        **JOB, "metadata": {"name": "bert", "namespace": ns}})
    assert await harness.reconcile_jobs() == 3
    assert await harness.reconcile_jobs() == 0
    first = await pods(cluster)
    assert sorted(first) == ["bert-master-0", "bert-worker-0", "bert-worker-1"]
    assert first["bert-worker-0"]["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    for name in first:
        await harness.run_pod(ns, name, "n1")
    await kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/bert-worker-0")
    assert (await pods(cluster))["bert-worker-0"]["metadata"].get("deletionTimestamp")  # graceful: it stays
    async with harness.playing(interval=0.05):
        for _ in range(100):
            now = await pods(cluster)
            if now.get("bert-worker-0", {}).get("metadata", {}).get("uid") not in (None, first["bert-worker-0"]["metadata"]["uid"]):
                break
            await asyncio.sleep(0.05)
    again = await pods(cluster)
    assert sorted(again) == sorted(first)
    assert again["bert-worker-0"]["metadata"]["uid"] != first["bert-worker-0"]["metadata"]["uid"]
    assert again["bert-worker-0"]["status"]["phase"] == "Pending"
