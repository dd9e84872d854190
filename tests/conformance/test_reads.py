"""Conformance: list, selectors, pagination, watch (K8S-SEMANTICS.md "resourceVersion, list and watch", "Selectors")."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import asyncio
from typing import Any

from conformance_client import Api


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


def names(body: dict[str, Any]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in body["items"])


async def test_label_selectors(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a", app="x", tier="1"))
    await conformance_api.ok("POST", path, body=cm("b", app="y"))
    await conformance_api.ok("POST", path, body=cm("c"))
    cases = {"app=x": ["a"], "app==x": ["a"], "app!=x": ["b", "c"], "app in (x,y)": ["a", "b"],
             "app notin (x)": ["b", "c"], "app": ["a", "b"], "!app": ["c"], "app,tier=1": ["a"],
             "app in (x, y),!tier": ["b"]}
    for selector, expected in cases.items():
        got = await conformance_api.ok("GET", path, query={"labelSelector": selector})
        assert names(got) == expected, selector


async def test_field_selectors(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    for name, node in (("p1", "n1"), ("p2", "n2"), ("p3", "")):
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
        if node:
            spec["nodeName"] = node
        await conformance_api.ok("POST", path, body={"metadata": {"name": name}, "spec": spec})
    assert names(await conformance_api.ok("GET", path, query={"fieldSelector": "spec.nodeName=n1"})) == ["p1"]
    assert names(await conformance_api.ok("GET", path, query={"fieldSelector": "spec.nodeName!=n1"})) == ["p2", "p3"]
    assert names(await conformance_api.ok("GET", path, query={"fieldSelector": "spec.nodeName="})) == ["p3"]
    got = await conformance_api.ok("GET", "/api/v1/pods", query={"fieldSelector": f"metadata.namespace={ns},status.phase=Pending"})
    assert names(got) == ["p1", "p2", "p3"]
    code, body = await conformance_api.request("GET", path, query={"fieldSelector": "spec.containers=x"})
    assert code == 400 and body["reason"] == "BadRequest"
    assert "field label not supported: spec.containers" in body["message"]
    assert names(await conformance_api.ok("GET", "/api/v1/nodes", query={"fieldSelector": "metadata.name=conf-none"})) == []


async def test_pagination(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    for i in range(7):
        await conformance_api.ok("POST", path, body=cm(f"c{i}"))
    seen: list[str] = []
    query: dict[str, Any] = {"limit": 3}
    pages = 0
    rvs = set()
    while True:
        page = await conformance_api.ok("GET", path, query=query)
        pages += 1
        seen += [i["metadata"]["name"] for i in page["items"]]
        rvs.add(page["metadata"]["resourceVersion"])
        token = page["metadata"].get("continue")
        if not token:
            break
        query = {"limit": 3, "continue": token}
    assert sorted(seen) == [f"c{i}" for i in range(7)] and pages == 3 and len(rvs) == 1
    first = await conformance_api.ok("GET", path, query={"limit": 3})
    assert first["metadata"]["remainingItemCount"] == 4
    code, _ = await conformance_api.request("GET", path, query={
        "limit": 3, "continue": first["metadata"]["continue"], "resourceVersion": first["metadata"]["resourceVersion"]})
    assert code == 400


async def test_list_resource_version_semantics(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a"))
    listed = await conformance_api.ok("GET", path)
    rv = listed["metadata"]["resourceVersion"]
    assert names(await conformance_api.ok("GET", path, query={"resourceVersion": "0"})) == ["a"]
    assert names(await conformance_api.ok("GET", path, query={"resourceVersion": rv})) == ["a"]
    exact = await conformance_api.ok("GET", path, query={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    assert exact["metadata"]["resourceVersion"] == rv and names(exact) == ["a"]
    await conformance_api.ok("POST", path, body=cm("b"))
    exact = await conformance_api.ok("GET", path, query={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    assert names(exact) == ["a"]
    code, body = await conformance_api.request("GET", path, query={"resourceVersion": str(int(rv) + 10_000_000)},
                                               request_timeout=60)
    assert code == 504 and body["reason"] == "Timeout"


async def test_watch_from_list_rv_sees_later_changes(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("old"))
    rv = (await conformance_api.ok("GET", path))["metadata"]["resourceVersion"]
    watch = asyncio.create_task(conformance_api.watch(path, {"resourceVersion": rv}, until=3))
    await asyncio.sleep(0.5)
    await conformance_api.ok("POST", path, body=cm("new"))
    await conformance_api.ok("PATCH", f"{path}/new", body={"data": {"k": "2"}}, content_type="application/merge-patch+json")
    await conformance_api.ok("DELETE", f"{path}/new")
    events = await watch
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new")]
    assert events[1]["object"]["data"] == {"k": "2"} and events[0]["object"]["kind"] == "ConfigMap"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


async def test_watch_from_zero_and_unset_sends_synthetic_added(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    for name in ("a", "b"):
        await conformance_api.ok("POST", path, body=cm(name))
    for query in ({"resourceVersion": "0"}, {}):
        events = await conformance_api.watch(path, query, until=2)
        assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [("ADDED", "a"), ("ADDED", "b")]


async def test_watch_selector_transitions(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a", team="x"))
    rv = (await conformance_api.ok("GET", path))["metadata"]["resourceVersion"]
    watch = asyncio.create_task(conformance_api.watch(path, {"resourceVersion": rv, "labelSelector": "team=y"}, until=2))
    await asyncio.sleep(0.5)
    merge = "application/merge-patch+json"
    await conformance_api.ok("PATCH", f"{path}/a", body={"metadata": {"labels": {"team": "y"}}}, content_type=merge)
    left = await conformance_api.ok("PATCH", f"{path}/a", body={"metadata": {"labels": {"team": "z"}}}, content_type=merge)
    events = await watch
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]
    assert events[1]["object"]["metadata"]["labels"] == {"team": "y"}  # previous content...
    assert events[1]["object"]["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]  # ...new RV


async def test_watch_timeout_ends_stream(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    rv = (await conformance_api.ok("GET", path))["metadata"]["resourceVersion"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await conformance_api.watch(path, {"resourceVersion": rv, "timeoutSeconds": 1}, seconds=10)
    assert events == [] and loop.time() - started < 8


async def test_watch_from_an_older_version_is_served_from_history(conformance_api: Api, ns: str) -> None:
    """A resourceVersion older than the change, and not compacted, is served from history, not refused.
    (Not from "1": any compaction earlier in the session, or the server's own every 5 minutes, expires it.)"""
    path = f"/api/v1/namespaces/{ns}/configmaps"
    before = (await conformance_api.ok("GET", path))["metadata"]["resourceVersion"]
    await conformance_api.ok("POST", path, body=cm("a"))
    events = await conformance_api.watch(path, {"resourceVersion": before}, until=1, seconds=5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


async def test_watch_too_old_is_410_event(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    first = await conformance_api.ok("POST", path, body=cm("a"))
    await conformance_api.ok("POST", path, body=cm("b"))
    await conformance_api.ok("POST", path, body=cm("c"))
    conformance_api.compact("configmaps")  # a watch from a's RV would start at b's, now compacted
    events = await conformance_api.watch(path, {"resourceVersion": first["metadata"]["resourceVersion"]}, until=1)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    # the watch cache says "too old resource version: N (M)", etcd "The resourceVersion for the
    # provided watch is too old."; clients must key on the code and reason, not the text
    assert "too old" in status["message"]


async def test_watch_bookmarks_carry_only_rv(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a"))
    code, events = await conformance_api.stream(path, {
        "sendInitialEvents": "true", "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan",
        "resourceVersion": "", "timeoutSeconds": 5}, until=2)
    if code == 422:
        return  # streaming lists refused: allowed, as long as never silently ignored
    assert code == 200
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a"
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    assert marks and marks[0]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert marks[0]["object"]["kind"] == "ConfigMap"


async def test_query_booleans_are_go_style(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body=cm("a"))
    for value in ("1", "true", "True"):
        events = await conformance_api.watch(path, {"watch": value, "resourceVersion": "0"}, until=1)
        assert events[0]["type"] == "ADDED"


async def test_list_items_of_builtin_kinds_carry_no_kind(conformance_api: Api, ns: str) -> None:
    """A typed list leaves TypeMeta out of its items; a custom resource's list keeps it; a get has it."""
    await conformance_api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", body=cm("a"))
    ptj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"},
           "spec": {"pytorchReplicaSpecs": {}}}
    await conformance_api.ok("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body=ptj)
    listed = await conformance_api.ok("GET", f"/api/v1/namespaces/{ns}/configmaps")
    assert (listed["kind"], listed["apiVersion"]) == ("ConfigMapList", "v1")
    item = next(i for i in listed["items"] if i["metadata"]["name"] == "a")
    assert "kind" not in item and "apiVersion" not in item
    got = await conformance_api.ok("GET", f"/api/v1/namespaces/{ns}/configmaps/a")
    assert (got["kind"], got["apiVersion"]) == ("ConfigMap", "v1")
    namespaces = await conformance_api.ok("GET", "/api/v1/namespaces", query={"fieldSelector": f"metadata.name={ns}"})
    assert [set(i) & {"kind", "apiVersion"} for i in namespaces["items"]] == [set()]
    jobs = await conformance_api.ok("GET", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs")
    assert [(i["kind"], i["apiVersion"]) for i in jobs["items"]] == [("PyTorchJob", "kubeflow.org/v1")]
