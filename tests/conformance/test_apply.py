"""Conformance: server-side apply (`kubectl apply --server-side`) and managed fields, as kube-apiserver does them:
apply creates, owns what it applied, removes what it stops applying, answers 409 for a field another manager
owns with a different value (unless forced), and every write through the API records its field manager."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

from conformance_client import Api

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def _fields(obj: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(manager, operation) -> fieldsV1, with the entries' other keys checked (an applier whose apply changed
    nothing has no time)."""
    out = {}
    for entry in obj["metadata"].get("managedFields") or []:
        assert entry["fieldsType"] == "FieldsV1", entry
        assert "time" not in entry or entry["time"].endswith("Z")
        out[(entry["manager"], entry["operation"])] = entry["fieldsV1"]
    return out


async def _apply(api: Api, path: str, body: dict[str, Any], manager: str, **query: Any) -> tuple[int, Any]:
    """As kubectl sends it: the configuration as JSON (which is YAML) with the apply content type."""
    return await api.request("PATCH", path, body=body, content_type=APPLY, query={"fieldManager": manager, **query})


def cm(ns: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "namespace": ns}, "data": data}


async def test_apply_creates_owns_changes_and_prunes(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps/applied"
    code, made = await _apply(conformance_api, path, cm(ns, a="1", b="2"), "alice")
    assert code == 201 and made["data"] == {"a": "1", "b": "2"}
    assert _fields(made) == {("alice", "Apply"): {"f:data": {"f:a": {}, "f:b": {}}}}
    assert made["metadata"]["managedFields"][0]["apiVersion"] == "v1"
    code, changed = await _apply(conformance_api, path, cm(ns, a="10"), "alice")
    assert code == 200 and changed["data"] == {"a": "10"}  # b is no longer applied by anyone: removed
    assert _fields(changed) == {("alice", "Apply"): {"f:data": {"f:a": {}}}}
    again = await conformance_api.ok("GET", path)
    assert again["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]


async def test_a_field_another_applier_owns_conflicts_unless_forced(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps/applied"
    await _apply(conformance_api, path, cm(ns, a="1", b="2"), "alice")
    code, same = await _apply(conformance_api, path, cm(ns, a="1"), "bob")  # the same value: shared, no conflict
    assert code == 200 and _fields(same)[("bob", "Apply")] == {"f:data": {"f:a": {}}}
    code, body = await _apply(conformance_api, path, cm(ns, a="3", b="4"), "carol")
    assert code == 409 and body["reason"] == "Conflict" and body["kind"] == "Status"
    assert body["message"].startswith("Apply failed with 3 conflicts: conflicts with \"alice\":\n")
    assert sorted((c["reason"], c["message"], c["field"]) for c in body["details"]["causes"]) == [
        ("FieldManagerConflict", 'conflict with "alice"', ".data.a"),
        ("FieldManagerConflict", 'conflict with "alice"', ".data.b"),
        ("FieldManagerConflict", 'conflict with "bob"', ".data.a")]
    code, one = await _apply(conformance_api, path, cm(ns, b="4"), "carol")
    assert code == 409 and one["message"] == 'Apply failed with 1 conflict: conflict with "alice": .data.b'
    code, forced = await _apply(conformance_api, path, cm(ns, a="3"), "carol", force="true")
    assert code == 200 and forced["data"] == {"a": "3", "b": "2"}
    assert _fields(forced) == {("alice", "Apply"): {"f:data": {"f:b": {}}}, ("carol", "Apply"): {"f:data": {"f:a": {}}}}


async def test_an_update_takes_a_field_and_the_applier_then_conflicts_with_it(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps/applied"
    await _apply(conformance_api, path, cm(ns, a="1"), "alice")
    patched = await conformance_api.ok("PATCH", path, body={"data": {"a": "2"}}, content_type=MERGE,
                                       query={"fieldManager": "kubectl-edit"})
    assert _fields(patched) == {("kubectl-edit", "Update"): {"f:data": {"f:a": {}}}}
    code, body = await _apply(conformance_api, path, cm(ns, a="1"), "alice")
    assert code == 409
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.a'
    assert body["details"]["causes"] == [{"reason": "FieldManagerConflict", "field": ".data.a",
                                          "message": 'conflict with "kubectl-edit" using v1'}]


async def test_a_create_records_its_manager_and_a_no_op_records_nothing(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    made = await conformance_api.ok("POST", path, body={"metadata": {"name": "made", "labels": {"x": "y"}},
                                                        "data": {"a": "1"}}, query={"fieldManager": "creator"})
    assert _fields(made) == {("creator", "Update"): {"f:data": {".": {}, "f:a": {}},
                                                     "f:metadata": {"f:labels": {".": {}, "f:x": {}}}}}
    same = await conformance_api.ok("PATCH", f"{path}/made", body={"data": {"a": "1"}}, content_type=MERGE,
                                    query={"fieldManager": "other"})
    assert same["metadata"]["managedFields"] == made["metadata"]["managedFields"]
    assert same["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]


async def test_apply_merges_containers_by_name_and_owns_them_by_key(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods/web"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
           "spec": {"containers": [{"name": "main", "image": "nginx:1"}]}}
    code, made = await _apply(conformance_api, path, pod, "kubectl")
    assert code == 201
    assert _fields(made)[("kubectl", "Apply")] == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}}}
    sidecar = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
               "spec": {"containers": [{"name": "main", "image": "nginx:2"}]}}
    code, body = await _apply(conformance_api, path, sidecar, "kubectl")
    assert code == 200, body
    assert [(c["name"], c["image"]) for c in body["spec"]["containers"]] == [("main", "nginx:2")]
    assert "labels" not in body["metadata"]  # no longer applied


async def test_apply_needs_a_field_manager_and_force_needs_apply(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps/applied"
    code, body = await conformance_api.request("PATCH", path, body=cm(ns, a="1"), content_type=APPLY)
    assert code == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"] == [{"reason": "FieldValueRequired", "field": "fieldManager",
                                          "message": "Required value: is required for apply patch"}]
    await _apply(conformance_api, path, cm(ns, a="1"), "alice")
    code, body = await conformance_api.request("PATCH", path, body={"data": {"a": "2"}}, content_type=MERGE,
                                               query={"force": "true"})
    assert code == 422 and body["details"]["causes"][0]["field"] == "force"


async def test_apply_to_a_custom_resource(conformance_api: Api, ns: str) -> None:
    path = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/applied"
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "applied"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {"containers": [
               {"name": "pytorch", "image": "trainer"}]}}}}}}
    code, made = await _apply(conformance_api, path, job, "kubectl")
    assert code == 201, made.get("message")
    assert made["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert ("kubectl", "Apply") in _fields(made)
