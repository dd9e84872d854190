"""Conformance: a DELETE's propagationPolicy becomes garbage-collector finalizers, as kube-apiserver's generic
registry store does it (no garbage collector runs on either backend, so the finalizers stay until removed):
Orphan and Foreground hold the object, Background does not, batch/v1 Jobs orphan by default, Events take
no policy, a second DELETE changes the policy of an object another finalizer holds."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

import pytest
from conformance_client import Api

MERGE = "application/merge-patch+json"


def cm(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"metadata": meta, "data": {"k": "v"}}


def job(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"suspend": True, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}


async def _release(api: Api, path: str) -> None:
    await api.ok("PATCH", path, body={"metadata": {"finalizers": None}}, content_type=MERGE)
    code, _ = await api.request("GET", path)
    assert code == 404


@pytest.mark.parametrize(("policy", "finalizer"), [("Orphan", "orphan"), ("Foreground", "foregroundDeletion")])
async def test_orphan_and_foreground_hold_the_object_with_their_finalizer(conformance_api: Api, ns: str,
                                                                         policy: str, finalizer: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("held"))
    code, body = await conformance_api.request("DELETE", f"{path}/held", body={"propagationPolicy": policy})
    assert code == 200 and body["kind"] == "ConfigMap"
    assert body["metadata"]["finalizers"] == [finalizer] and body["metadata"]["deletionTimestamp"]
    got = await conformance_api.ok("GET", f"{path}/held")
    assert got["metadata"]["finalizers"] == [finalizer] and got["metadata"]["deletionGracePeriodSeconds"] == 0
    await _release(conformance_api, f"{path}/held")


async def test_background_deletes_at_once(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("gone"))
    code, body = await conformance_api.request("DELETE", f"{path}/gone", query={"propagationPolicy": "Background"})
    assert code == 200 and body["kind"] == "Status" and body["status"] == "Success"
    assert (await conformance_api.request("GET", f"{path}/gone"))[0] == 404


async def test_legacy_orphan_dependents_is_the_orphan_policy(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("legacy"))
    body = await conformance_api.ok("DELETE", f"{path}/legacy", body={"orphanDependents": True})
    assert body["metadata"]["finalizers"] == ["orphan"]
    await _release(conformance_api, f"{path}/legacy")


async def test_a_batch_v1_job_orphans_its_pods_by_default(conformance_api: Api, ns: str) -> None:
    path = f"/apis/batch/v1/namespaces/{ns}/jobs"
    await conformance_api.ok("POST", path, body=job("kept"))
    body = await conformance_api.ok("DELETE", f"{path}/kept")
    assert body["kind"] == "Job" and body["metadata"]["finalizers"] == ["orphan"]
    await _release(conformance_api, f"{path}/kept")
    await conformance_api.ok("POST", path, body=job("cascaded"))
    body = await conformance_api.ok("DELETE", f"{path}/cascaded", body={"propagationPolicy": "Background"})
    assert body["kind"] == "Status" and body["status"] == "Success"


async def test_an_event_takes_no_policy(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/events"
    await conformance_api.ok("POST", path, body={
        "metadata": {"name": "ev"}, "reason": "R", "message": "m", "type": "Normal",
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p"}})
    body = await conformance_api.ok("DELETE", f"{path}/ev", body={"propagationPolicy": "Foreground"})
    assert body["kind"] == "Status" and body["status"] == "Success"


async def test_a_second_delete_changes_the_policy_of_an_object_another_finalizer_holds(
        conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("twice", ["example.com/hold"]))
    first = await conformance_api.ok("DELETE", f"{path}/twice")
    assert first["metadata"]["finalizers"] == ["example.com/hold"]
    second = await conformance_api.ok("DELETE", f"{path}/twice", body={"propagationPolicy": "Orphan"})
    assert second["metadata"]["finalizers"] == ["example.com/hold", "orphan"]
    assert second["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
    third = await conformance_api.ok("DELETE", f"{path}/twice", body={"propagationPolicy": "Background"})
    assert third["metadata"]["finalizers"] == ["example.com/hold"]
    await _release(conformance_api, f"{path}/twice")


async def test_an_unknown_policy_is_422(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("bad"))
    code, body = await conformance_api.request("DELETE", f"{path}/bad", body={"propagationPolicy": "Sideways"})
    assert code == 422 and body["reason"] == "Invalid"
