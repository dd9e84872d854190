"""Conformance: pod deletion and pods/log validation (K8S-SEMANTICS.md "Delete", "pods/log").

The real backend runs no kubelet: pods stay Pending, unscheduled pods delete at once, and a pod
created with spec.nodeName keeps its deletionTimestamp until a grace-0 delete.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

from conformance_client import Api


def pod(name: str, *, node: str = "", containers: tuple[str, ...] = ("main",), **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


async def test_unscheduled_pod_deletes_at_once(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    created = await conformance_api.ok("POST", path, body=pod("p"))
    assert created["status"]["phase"] == "Pending" and created["metadata"].get("generation", 1) >= 1
    gone = await conformance_api.ok("DELETE", f"{path}/p")
    assert gone["kind"] == "Pod" and gone["metadata"]["name"] == "p"
    code, _ = await conformance_api.request("GET", f"{path}/p")
    assert code == 404


async def test_scheduled_pod_deletes_gracefully(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", path, body=pod("p", node="conf-node-none"))
    held = await conformance_api.ok("DELETE", f"{path}/p", query={"gracePeriodSeconds": 30})
    assert held["kind"] == "Pod" and held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["deletionGracePeriodSeconds"] == 30
    still = await conformance_api.ok("GET", f"{path}/p")
    assert still["metadata"]["deletionTimestamp"]
    await conformance_api.ok("DELETE", f"{path}/p", body={"gracePeriodSeconds": 0})
    code, _ = await conformance_api.request("GET", f"{path}/p")
    assert code == 404


async def test_pod_spec_is_mostly_immutable(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", path, body=pod("p"))
    smp = "application/strategic-merge-patch+json"
    got = await conformance_api.ok("PATCH", f"{path}/p", content_type=smp,
                                   body={"spec": {"containers": [{"name": "main", "image": "alpine"}]}})
    assert [(c["name"], c["image"]) for c in got["spec"]["containers"]] == [("main", "alpine")]
    code, body = await conformance_api.request("PATCH", f"{path}/p", content_type=smp,
                                               body={"spec": {"restartPolicy": "Never"}})
    assert code == 422 and body["reason"] == "Invalid"


async def test_pod_status_conditions_merge_by_type(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", path, body=pod("p"))
    smp = "application/strategic-merge-patch+json"
    for cond in ({"type": "Ready", "status": "False"}, {"type": "kcover.io/Test", "status": "True"},
                 {"type": "Ready", "status": "True"}):
        got = await conformance_api.ok("PATCH", f"{path}/p/status", content_type=smp,
                                       body={"status": {"conditions": [cond]}})
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["kcover.io/Test"] == "True"
    got = await conformance_api.ok("PATCH", f"{path}/p", content_type=smp, body={"status": {"phase": "Failed"}})
    assert got["status"]["phase"] == "Pending"


async def test_log_validation(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", path, body=pod("two", containers=("a", "b")))
    await conformance_api.ok("POST", path, body=pod("one"))
    code, body = await conformance_api.request("GET", f"{path}/two/log")
    assert code == 400 and body["message"] == "a container name must be specified for pod two, choose one of: [a b]"
    code, body = await conformance_api.request("GET", f"{path}/two/log", query={"container": "zz"})
    assert code == 400 and body["message"] == "container zz is not valid for pod two"
    code, body = await conformance_api.request("GET", f"{path}/one/log", query={"tailLines": -1})
    assert code == 422
    code, body = await conformance_api.request("GET", f"{path}/one/log", query={"limitBytes": 0})
    assert code == 422
    code, body = await conformance_api.request("GET", f"{path}/missing/log")
    assert code == 404
    code, body = await conformance_api.request("GET", f"{path}/one/log")  # unscheduled: no kubelet to ask
    assert code == 204
