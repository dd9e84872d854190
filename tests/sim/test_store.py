"""Store rules: resourceVersions, no-op writes, generation, finalizers, graceful pod deletion, watch history."""

from __future__ import annotations

from typing import Any

import pytest

from kcover.sim import selectors, status, store, tables


def pod(name: str, *, node: str = "n1", phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}, "status": {"phase": phase}}


def test_one_counter_and_no_op_writes() -> None:
    s = store.Store()
    a = s.create("pods", pod("a"))
    b = s.create("configmaps", {"metadata": {"name": "b"}})
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1
    before = s.resource_version
    same = s.update("pods", s.get("pods", "default", "a"))
    assert same["metadata"]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert s.resource_version == before


def test_generation_bumps_on_spec_only() -> None:
    s = store.Store()
    s.create("pytorchjobs.kubeflow.org", {"metadata": {"name": "j"}, "spec": {"x": 1}})
    job = s.mutate("pytorchjobs.kubeflow.org", "default", "j", lambda o: o["metadata"].update(labels={"a": "b"}))
    assert job["metadata"]["generation"] == 1
    job = s.mutate("pytorchjobs.kubeflow.org", "default", "j", lambda o: o.update(status={"p": 1}))
    assert job["metadata"]["generation"] == 1
    job = s.mutate("pytorchjobs.kubeflow.org", "default", "j", lambda o: o["spec"].update(x=2))
    assert job["metadata"]["generation"] == 2


@pytest.mark.parametrize(("node", "phase", "grace", "gone"), [
    ("n1", "Running", None, False), ("n1", "Running", 0, True), ("", "Pending", None, True),
    ("n1", "Succeeded", None, True), ("n1", "Failed", 30, True), ("n1", "Running", 5, False),
])
def test_pod_delete(node: str, phase: str, grace: int | None, gone: bool) -> None:
    s = store.Store()
    s.create("pods", pod("p", node=node, phase=phase))
    obj, deleted = s.delete("pods", "default", "p", grace_seconds=grace)
    assert deleted is gone
    if not gone:
        assert obj["metadata"]["deletionTimestamp"]
        assert s.get("pods", "default", "p")["metadata"]["deletionGracePeriodSeconds"] == (grace or 30)
        _, deleted = s.delete("pods", "default", "p", grace_seconds=0)  # the kubelet finishes
        assert deleted
    with pytest.raises(status.ApiError):
        s.get("pods", "default", "p")


def test_finalizers_hold_until_removed() -> None:
    s = store.Store()
    s.create("configmaps", {"metadata": {"name": "c", "finalizers": ["f"]}})
    obj, gone = s.delete("configmaps", "default", "c")
    assert not gone
    assert obj["metadata"]["deletionTimestamp"]
    s.mutate("configmaps", "default", "c", lambda o: o["metadata"].pop("finalizers"))
    assert s.count("configmaps") == 0


def test_create_rules() -> None:
    s = store.Store()
    with pytest.raises(status.ApiError) as info:
        s.create("configmaps", {"metadata": {"name": "c", "namespace": "nope"}})
    assert info.value.status == 404
    s.create("configmaps", {"metadata": {"name": "c"}})
    with pytest.raises(status.ApiError) as info:
        s.create("configmaps", {"metadata": {"name": "c"}})
    assert info.value.reason == "AlreadyExists"
    made = s.create("configmaps", {"metadata": {"generateName": "g-"}})
    assert made["metadata"]["name"].startswith("g-")


async def test_watch_history_and_compaction() -> None:
    s = store.Store(history=3)
    start = s.resource_version
    for i in range(2):
        s.create("pods", pod(f"p{i}"))
    w = s.watch("pods", tables.Filter(), start)
    assert [c.new.name for c in w.initial] == ["p0", "p1"]
    w.close()
    for i in range(2, 6):
        s.create("pods", pod(f"p{i}"))
    with pytest.raises(status.ApiError) as info:
        s.watch("pods", tables.Filter(), start)
    assert info.value.status == 410
    s.compact("pods")
    with pytest.raises(status.ApiError):
        s.watch("pods", tables.Filter(), s.resource_version - 1)


async def test_watcher_selector_transitions() -> None:
    s = store.Store()
    s.create("pods", pod("p", team="a"))
    flt = tables.Filter(labels=selectors.parse_labels("team=b"))
    w = s.watch("pods", flt, s.resource_version)
    s.mutate("pods", "default", "p", lambda o: o["metadata"]["labels"].update(team="b"))
    s.mutate("pods", "default", "p", lambda o: o["metadata"]["labels"].update(team="c"))
    events = [w.translate(w.queue.get_nowait()) for _ in range(2)]  # type: ignore[arg-type]
    assert [e[0] for e in events if e] == ["ADDED", "DELETED"]
    deleted = events[1][1].obj() if events[1] else {}
    assert deleted["metadata"]["labels"] == {"team": "b"}
    assert deleted["metadata"]["resourceVersion"] == str(s.resource_version)
    w.close()


def test_list_at_rebuilds_past_state() -> None:
    s = store.Store()
    s.create("pods", pod("a"))
    rv = s.resource_version
    s.create("pods", pod("b"))
    s.mutate("pods", "default", "a", lambda o: o["status"].update(phase="Failed"))
    s.delete("pods", "default", "a", grace_seconds=0)
    past = s.list_at("pods", tables.Filter(), rv)
    assert [(e.name, e.obj()["status"]["phase"]) for e in past] == [("a", "Running")]


def test_namespace_delete_removes_content() -> None:
    s = store.Store()
    s.create("namespaces", {"metadata": {"name": "x"}})
    s.create("pods", {**pod("p"), "metadata": {"name": "p", "namespace": "x"}})
    obj, _ = s.delete("namespaces", "", "x")
    assert obj["status"]["phase"] == "Terminating"
    assert s.count("pods") == 0
    assert not s.namespace_exists("x")
