"""ClusterCache against the simulated API server: indexes, owner resolution with UID checks, changes."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from harness import objects as o

from kcover import kinds, settings
from kcover.kube import caching, client, indexing, watching
from kcover.kube import projections as proj

simserver = pytest.importorskip("kcover.sim.server")  # lands with the simulated cluster

OPTIONS = watching.ReflectorOptions(backoff_initial_seconds=0.05, missing_retry_seconds=0.5)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, client.KubeClient]]:
    async with simserver.SimServer() as srv:
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield srv, kube
        finally:
            await kube.close()


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def create(srv: Any, key: str, name: str, *, owner: dict[str, Any] | None = None,
           labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return dict(srv.store.create(key, {"metadata": meta, "spec": {}, **extra}))


def pod(srv: Any, name: str, *, owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        node: str = "n1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return dict(srv.store.create("pods", {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                                          "status": {"phase": "Running"}}))


async def test_owner_chain_opt_in_and_indexes(cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    train = create(srv, "trainjobs.trainer.kubeflow.org", "llm", labels={"kcover.io/cascading-recovery": "true"})
    jobset = create(srv, "jobsets.jobset.x-k8s.io", "llm", owner=train)
    job = create(srv, "jobs.batch", "llm-worker-0", owner=jobset)
    p_train = pod(srv, "llm-worker-0-0", owner=job, labels={"jobset.sigs.k8s.io/jobset-name": "llm"})
    lws = create(srv, "leaderworkersets.leaderworkerset.x-k8s.io", "serve")
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "serve", "uid": "sts-uid"}}  # not cached
    p_lws = pod(srv, "serve-0", owner=sts, labels={"leaderworkerset.sigs.k8s.io/name": "serve"}, node="n2")
    # a Volcano Job and a batch Job of the same name: only the UID-checked owner counts
    vc = create(srv, "jobs.batch.volcano.sh", "same", labels={"kcover.io/cascading-recovery": "true"})
    batch = create(srv, "jobs.batch", "same")
    p_batch = pod(srv, "same-0", owner=batch, labels={"batch.kubernetes.io/job-name": "same"}, node="n2")
    stale_ref = dict(batch, metadata={**batch["metadata"], "uid": "gone"})
    p_orphan = pod(srv, "same-old", owner=stale_ref, labels={"batch.kubernetes.io/job-name": "same"}, node="n2")

    cache = caching.ClusterCache(kube, options=OPTIONS)
    stop = asyncio.Event()
    task = asyncio.create_task(cache.run(stop), name="cache")
    try:
        await asyncio.wait_for(cache.wait_synced(), 10)
        assert cache.synced
        got = cache.pod(p_train["metadata"]["uid"])
        assert got is not None
        assert [w.kind for w in cache.owner_chain(got)] == ["Job", "JobSet", "TrainJob"]
        assert cache.opted_in(got)
        assert cache.workload_ref(got) == {"kind": "TrainJob", "name": "llm", "uid": train["metadata"]["uid"],
                                           "apiVersion": "trainer.kubeflow.org/v1alpha1"}
        assert [p.name for p in cache.pods_of_workload(train["metadata"]["uid"])] == ["llm-worker-0-0"]
        got_lws = cache.pod(p_lws["metadata"]["uid"])
        assert got_lws is not None
        assert cache.workload_of(got_lws) == cache.workload(lws["metadata"]["uid"])
        assert not cache.opted_in(got_lws)
        got_batch = cache.pod(p_batch["metadata"]["uid"])
        assert got_batch is not None
        assert cache.workload_of(got_batch) == cache.workload(batch["metadata"]["uid"])
        assert not cache.opted_in(got_batch)  # the opted-in Volcano Job shares the name only
        orphan = cache.pod(p_orphan["metadata"]["uid"])
        assert orphan is not None
        assert cache.workload_of(orphan) is None
        assert cache.workload_by_name("batch.volcano.sh", "Job", "default", "same") == cache.workload(vc["metadata"]["uid"])
        assert cache.workload_by_name("jobset.x-k8s.io", "JobSet", "default", "llm") == cache.workload(jobset["metadata"]["uid"])
        assert [p.name for p in cache.pods_of_workload(lws["metadata"]["uid"])] == ["serve-0"]  # by label
        assert sorted(p.name for p in cache.pods_on_node("n2")) == ["same-0", "same-old", "serve-0"]
        assert cache.pod_by_name("default", "serve-0") == got_lws

        stream = cache.stream(replay=False)
        seen: list[tuple[indexing.Kind, str | None, str | None]] = []

        async def read() -> None:
            async for kind, old, new in stream:
                seen.append((kind, old.name if old else None, new.name if new else None))

        reader = asyncio.create_task(read(), name="reader")
        srv.store.delete("pods", "default", "serve-0", grace_seconds=0)
        srv.store.create("nodes", {"metadata": {"name": "n9"}, "spec": {}, "status": {}})
        for _ in range(200):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.02)
        stream.close()
        await reader
        # ordered within a collection; pods and nodes are separate watches
        assert sorted(seen) == [(indexing.Kind.NODE, None, "n9"), (indexing.Kind.POD, "serve-0", None)]
        assert cache.pods_on_node("n2")
        assert cache.pod_by_name("default", "serve-0") is None
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_missing_workload_kind_is_not_fatal(cluster: tuple[Any, client.KubeClient]) -> None:
    _, kube = cluster
    bogus = caching.WorkloadKind("Widget", "example.com", "v1", "widgets", kinds.Family.BATCH_JOB,
                                 "example.com/widget-name", kinds.Removal.DELETE)
    cache = caching.ClusterCache(kube, workload_kinds=[bogus], watch_events=False, options=OPTIONS)
    stop = asyncio.Event()
    task = asyncio.create_task(cache.run(stop), name="cache")
    try:
        await asyncio.wait_for(cache.wait_synced(), 10)
        assert cache.synced
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_a_freezing_cache_freezes_what_its_first_lists_made_as_their_pause_ends(
        cluster: tuple[Any, client.KubeClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """`freeze_gc` with the lists' GC pause: the first sync's objects are collected and frozen when the last
    list ends, before the collector runs again (it would otherwise traverse them all in its youngest
    generation first), and the collector runs again after it."""
    srv, kube = cluster
    for i in range(20):
        pod(srv, f"p{i}")
    seen: list[tuple[bool, int]] = []
    real = caching._collect_and_freeze

    def noted() -> None:
        real()
        seen.append((gc.isenabled(), gc.get_freeze_count()))

    monkeypatch.setattr(caching, "_collect_and_freeze", noted)
    cache = caching.ClusterCache(kube, watch_events=False, options=OPTIONS, freeze_gc=True)
    stop = asyncio.Event()
    task = asyncio.create_task(cache.run(stop), name="cache")
    try:
        await asyncio.wait_for(cache.wait_synced(), 10)
        await until_called(seen, 2)
        assert seen[0][0] is False, "the first freeze ran while the collector was still held off"
        assert seen[0][1] > 0
        assert gc.isenabled()
        assert watching.LISTING.depth == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        gc.unfreeze()


async def until_called(seen: list[Any], times: int) -> None:
    for _ in range(500):
        if len(seen) >= times:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"called {len(seen)} times, not {times}")


def test_workload_kinds_from_settings() -> None:
    assert settings.KubeSettings().workload_kinds == list(caching.DEFAULT_WORKLOAD_KINDS)
    assert [k.key for k in caching.workload_kinds(caching.DEFAULT_WORKLOAD_KINDS)] == list(caching.DEFAULT_WORKLOAD_KINDS)
    with pytest.raises(ValueError):
        caching.workload_kinds(["widgets.example.com"])


def test_the_nodes_kcover_cordoned_and_the_gpu_nodes_follow_every_node_change() -> None:
    """Recovery asks for both with every fault; the cache keeps them as nodes change instead of searching."""
    mine = {proj.CORDONED_BY: "kcover"}
    cache = caching.ClusterCache.offline([o.node("a", annotations=mine), o.node("b"), o.node("c", annotations=mine),
                                          o.node("cpu", capacity={})])
    assert cache.cordoned_by_kcover() == ["a", "c"]
    assert cache.kcover_cordons("kcover.io/unhealthy") == []  # the annotation alone is no cordon in effect
    assert cache.gpu_node_count() == 3
    cache.load([o.node("a", rv="2"), o.node("b", annotations=mine, rv="2"), o.node("cpu", capacity={}),
                o.node("gpu", rv="2")])  # a returned, b cordoned, c deleted, gpu added
    assert cache.cordoned_by_kcover() == ["b"]
    assert cache.gpu_node_count() == 3
    cache.load([o.node("b", annotations={proj.CORDONED_BY: "someone"}, rv="3"), o.node("cpu", capacity={})])
    assert cache.cordoned_by_kcover() == []
    assert cache.gpu_node_count() == 1
    cache.load([o.node("b", capacity={}, rv="4"), o.node("cpu", rv="4")])  # b lost its GPUs, cpu gained some
    assert cache.gpu_node_count() == 1
    cache.load([o.node("cpu", capacity={}, rv="5")])
    assert cache.gpu_node_count() == 0


def test_the_cordons_kcover_has_in_effect_are_its_marked_nodes_still_unschedulable_or_tainted() -> None:
    mine = {proj.CORDONED_BY: "kcover"}
    tainted = o.node("t", annotations=mine)
    tainted["spec"] = {"taints": [{"key": "kcover.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]}
    cache = caching.ClusterCache.offline([o.node("u", annotations=mine, unschedulable=True), tainted,
                                          o.node("marks", annotations=mine), o.node("other", unschedulable=True)])
    assert cache.cordoned_by_kcover() == ["marks", "t", "u"]
    assert cache.kcover_cordons("kcover.io/unhealthy") == ["t", "u"]
    assert cache.kcover_cordons("example.com/other-key") == ["u"]
    cache.load([o.node("u", annotations=mine, rv="2"), tainted, o.node("marks", annotations=mine)])  # u uncordoned
    assert cache.kcover_cordons("kcover.io/unhealthy") == ["t"]
