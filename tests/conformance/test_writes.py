"""Conformance: create, update, patch, delete and their Status errors (K8S-SEMANTICS.md "Writes", "Errors")."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

from conformance_client import Api

CONFLICT = ("the object has been modified; please apply your changes to the latest version and try again")
PTJ = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


async def test_discovery(conformance_api: Api) -> None:
    version = await conformance_api.ok("GET", "/version")
    assert version["gitVersion"].startswith("v1.")
    core = await conformance_api.ok("GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["namespaced"] is True and "po" in by_name["pods"]["shortNames"]
    assert by_name["nodes"]["namespaced"] is False and "watch" in by_name["nodes"]["verbs"]
    assert "pods/status" in by_name and "pods/log" in by_name
    eviction = by_name["pods/eviction"]  # what kubectl drain checks before it evicts instead of deleting
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1", "Eviction")
    groups = await conformance_api.ok("GET", "/apis")
    names = {g["name"] for g in groups["groups"]}
    assert {"coordination.k8s.io", "events.k8s.io", "batch", "kubeflow.org"} <= names
    kubeflow = await conformance_api.ok("GET", "/apis/kubeflow.org/v1")
    assert {"pytorchjobs", "pytorchjobs/status"} <= {r["name"] for r in kubeflow["resources"]}


async def test_create_sets_server_fields_and_refuses_duplicates(conformance_api: Api, ns: str) -> None:
    created = await conformance_api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", body=cm("a"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"] and meta["namespace"] == ns
    code, body = await conformance_api.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=cm("a"))
    assert code == 409 and body["reason"] == "AlreadyExists" and body["kind"] == "Status"
    assert body["details"] == {"name": "a", "kind": "configmaps"}
    assert body["message"] == 'configmaps "a" already exists'


async def test_generate_name(conformance_api: Api, ns: str) -> None:
    created = await conformance_api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                       body={"metadata": {"generateName": "gen-"}})
    assert created["metadata"]["name"].startswith("gen-") and len(created["metadata"]["name"]) == 9


async def test_create_in_missing_namespace_is_404(conformance_api: Api) -> None:
    code, body = await conformance_api.request("POST", "/api/v1/namespaces/no-such-ns-x1/configmaps", body=cm("a"))
    assert code == 404 and body["reason"] == "NotFound"
    assert body["details"]["kind"] == "namespaces" and body["details"]["name"] == "no-such-ns-x1"


async def test_not_found_names_plural_and_group(conformance_api: Api, ns: str) -> None:
    code, body = await conformance_api.request("GET", PTJ.format(ns=ns) + "/missing")
    assert code == 404 and body["reason"] == "NotFound" and body["code"] == 404
    assert body["details"] == {"name": "missing", "group": "kubeflow.org", "kind": "pytorchjobs"}
    assert body["message"] == 'pytorchjobs.kubeflow.org "missing" not found'


async def test_put_with_stale_rv_conflicts(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    created = await conformance_api.ok("POST", path, body=cm("a"))
    created["data"] = {"k": "v2"}
    await conformance_api.ok("PUT", f"{path}/a", body=created)
    created["data"] = {"k": "v3"}
    code, body = await conformance_api.request("PUT", f"{path}/a", body=created)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == f'Operation cannot be fulfilled on configmaps "a": {CONFLICT}'


async def test_put_without_rv(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a"))
    updated = await conformance_api.ok("PUT", f"{path}/a", body={"metadata": {"name": "a"}, "data": {"k": "x"}})
    assert updated["data"] == {"k": "x"}
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    await conformance_api.ok("POST", lease_path, body={"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    code, body = await conformance_api.request("PUT", f"{lease_path}/l",
                                               body={"metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}})
    assert code == 422 and body["reason"] == "Invalid"
    await conformance_api.ok("POST", PTJ.format(ns=ns), body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                             "metadata": {"name": "j"}, "spec": {"a": 1}})
    code, body = await conformance_api.request("PUT", PTJ.format(ns=ns) + "/j", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"}, "spec": {"a": 2}})
    assert code == 422 and body["reason"] == "Invalid"


async def test_noop_patch_keeps_resource_version(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    created = await conformance_api.ok("POST", path, body=cm("a", x="1"))
    patched = await conformance_api.ok("PATCH", f"{path}/a", body={"metadata": {"labels": {"x": "1"}}},
                                       content_type="application/merge-patch+json")
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_custom_resource_generation_and_status(conformance_api: Api, ns: str) -> None:
    path = PTJ.format(ns=ns)
    job = await conformance_api.ok("POST", path, body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                       "metadata": {"name": "j"}, "spec": {"a": 1},
                                                       "status": {"dropped": True}})
    assert job["metadata"]["generation"] == 1 and "status" not in job
    merge = "application/merge-patch+json"
    job = await conformance_api.ok("PATCH", f"{path}/j", body={"metadata": {"labels": {"x": "y"}}}, content_type=merge)
    assert job["metadata"]["generation"] == 1
    job = await conformance_api.ok("PATCH", f"{path}/j/status", body={"status": {"phase": "Running"}},
                                   content_type=merge)
    assert job["metadata"]["generation"] == 1 and job["status"] == {"phase": "Running"}
    job = await conformance_api.ok("PATCH", f"{path}/j", body={"spec": {"a": 2}, "status": {"phase": "Lost"}},
                                   content_type=merge)
    assert job["metadata"]["generation"] == 2 and job["status"] == {"phase": "Running"}
    job = await conformance_api.ok("PATCH", f"{path}/j/status", body={"spec": {"a": 3}, "status": {"phase": "Done"}},
                                   content_type=merge)
    assert job["spec"] == {"a": 2} and job["status"] == {"phase": "Done"}


async def test_custom_resources_refuse_strategic_merge(conformance_api: Api, ns: str) -> None:
    path = PTJ.format(ns=ns)
    await conformance_api.ok("POST", path, body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                 "metadata": {"name": "j"}, "spec": {}})
    code, body = await conformance_api.request("PATCH", f"{path}/j", body={"spec": {"a": 1}},
                                               content_type="application/strategic-merge-patch+json")
    assert code == 415 and body["reason"] == "UnsupportedMediaType"


async def test_json_patch_and_rv_precondition(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    created = await conformance_api.ok("POST", path, body=cm("a"))
    rv = created["metadata"]["resourceVersion"]
    patched = await conformance_api.ok("PATCH", f"{path}/a", content_type="application/json-patch+json", body=[
        {"op": "test", "path": "/data/k", "value": "v"}, {"op": "add", "path": "/data/n", "value": "1"}])
    assert patched["data"] == {"k": "v", "n": "1"}
    code, body = await conformance_api.request("PATCH", f"{path}/a", content_type="application/merge-patch+json",
                                               body={"metadata": {"resourceVersion": rv}, "data": {"n": "2"}})
    assert code == 409 and body["reason"] == "Conflict"


async def test_strategic_merge_lists(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": n, "uid": u}
            for n, u in (("o1", "11111111-1111-1111-1111-111111111111"), ("o2", "22222222-2222-2222-2222-222222222222"))]
    body = cm("a")
    body["metadata"]["ownerReferences"] = [refs[0]]
    await conformance_api.ok("POST", path, body=body)
    smp = "application/strategic-merge-patch+json"
    got = await conformance_api.ok("PATCH", f"{path}/a", content_type=smp,
                                   body={"metadata": {"ownerReferences": [refs[1]]}})
    # the item only the patch has comes first, as kube-apiserver orders a merged list
    assert [r["name"] for r in got["metadata"]["ownerReferences"]] == ["o2", "o1"]
    got = await conformance_api.ok("PATCH", f"{path}/a", content_type=smp, body={"metadata": {"ownerReferences": [
        {"uid": refs[0]["uid"], "$patch": "delete"}]}})
    assert [r["name"] for r in got["metadata"]["ownerReferences"]] == ["o2"]


async def test_node_taints_replaced_whole_and_validated(conformance_api: Api) -> None:
    name = "conf-node-taints"
    await conformance_api.request("DELETE", f"/api/v1/nodes/{name}")
    taint = {"key": "a", "effect": "NoSchedule"}
    await conformance_api.ok("POST", "/api/v1/nodes", body={"metadata": {"name": name}, "spec": {"taints": [taint]}})
    try:
        smp = "application/strategic-merge-patch+json"
        got = await conformance_api.ok("PATCH", f"/api/v1/nodes/{name}", content_type=smp,
                                       body={"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})
        assert [t["key"] for t in got["spec"]["taints"]] == ["b"]
        code, body = await conformance_api.request("PATCH", f"/api/v1/nodes/{name}", content_type=smp,
                                                   body={"spec": {"taints": [taint, taint]}})
        assert code == 422 and body["reason"] == "Invalid" and body["details"]["causes"]
        code, body = await conformance_api.request("PATCH", f"/api/v1/nodes/{name}", content_type=smp,
                                                   body={"spec": {"taints": [{"key": "c", "effect": "Bad"}]}})
        assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.taints[0].effect"  # sic
        assert body["details"]["kind"] == "Node"
    finally:
        await conformance_api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_finalizers_hold_deletion(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    body = cm("a")
    body["metadata"]["finalizers"] = ["kcover.io/test"]
    await conformance_api.ok("POST", path, body=body)
    held = await conformance_api.ok("DELETE", f"{path}/a")
    assert held["metadata"]["deletionTimestamp"]
    assert (await conformance_api.ok("GET", f"{path}/a"))["metadata"]["deletionTimestamp"]
    await conformance_api.ok("PATCH", f"{path}/a", body={"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    code, _ = await conformance_api.request("GET", f"{path}/a")
    assert code == 404


async def test_delete_returns_status_and_honours_uid_precondition(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    created = await conformance_api.ok("POST", path, body=cm("a"))
    code, body = await conformance_api.request("DELETE", f"{path}/a", body={
        "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})
    assert code == 409 and body["reason"] == "Conflict"
    done = await conformance_api.ok("DELETE", f"{path}/a", body={"preconditions": {"uid": created["metadata"]["uid"]}})
    assert done["kind"] == "Status" and done["status"] == "Success"
    assert done["details"]["name"] == "a" and done["details"]["kind"] == "configmaps"


async def test_delete_collection_by_label(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        await conformance_api.ok("POST", path, body=cm(name, team=team))
    gone = await conformance_api.ok("DELETE", path, query={"labelSelector": "team=x"})
    assert gone["kind"] == "ConfigMapList" and sorted(i["metadata"]["name"] for i in gone["items"]) == ["a", "b"]
    left = await conformance_api.ok("GET", path)
    assert [i["metadata"]["name"] for i in left["items"]] == ["c"]
