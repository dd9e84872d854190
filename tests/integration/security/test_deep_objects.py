"""Objects nested too deep for orjson, written by tenants, blind kcover to nothing.

kube-apiserver accepts and stores objects whose `metadata.managedFields[].fieldsV1` nest 1,100 levels,
and custom resources nested as deep in their schema-less fields; orjson refuses more than 1,024 levels.
Two tenants, each a ServiceAccount of its own namespace with a Role and its own token (TokenRequest) on
the real kube-apiserver, write such objects: one may only create Events, the other may create and patch
pods and create PyTorchJobs. Meanwhile a genuine failure of another namespace's job is restarted by the
running controller, a controller started afterwards syncs and restarts it again, the tenants' objects
stay in the cache where they can be decoded without their managedFields, the PyTorchJob that cannot be
decoded at all is skipped and counted (`kcover_objects_skipped_total`), and /readyz stays ready. That
failure is a pod's, seen through the pods watch; so a second test writes the deep Event and then a
genuine Event annotated `kcover.io/need-recovery` about an opted-in pod of another namespace, which the
running controller's Events watch (the event-watcher detector's cache) must still deliver: the job is
restarted once. On the simulated server (no RBAC) the same objects are written by plain clients; it
stores them as the real one does (tests/conformance/test_managed_fields.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import secrets
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from harness import playing
from test_trust import Replica, _job, _node, _pods, _until

from kcover import metrics as metrics_
from kcover import serving, settings
from kcover.aio import clock as clock_
from kcover.controller import running
from kcover.kube import client as client_
from kcover.kube import decoding, retrying

Cluster = Any
Obj = dict[str, Any]
DEPTH = 1100
FIELDS = b'{"f:a":' * DEPTH + b"{}" + b"}" * DEPTH
LEASE = {"lease_duration_seconds": 2.0, "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2}


def managed_fields(manager: str) -> bytes:
    return (b'"managedFields":[{"manager":"' + manager.encode() + b'","operation":"Update","apiVersion":"v1",'
            b'"fieldsType":"FieldsV1","fieldsV1":' + FIELDS + b"}]")


def _settings(cluster: Cluster, identity: str) -> settings.Settings:
    ns = cluster.namespace
    return settings.Settings.model_validate({
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}, "workload_cooldown_seconds": 0},
        "lease": {"namespace": ns, "identity": identity, **LEASE},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "gc_freeze_after_sync": False},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False}}},
    })


async def _start(cluster: Cluster, identity: str) -> tuple[Replica, serving.Health]:
    kube = cluster.new_client()
    mets = metrics_.Metrics()
    health = serving.Health()
    ctl = running.Controller(_settings(cluster, identity), client=kube, metrics=mets, health=health)
    stop = asyncio.Event()
    replica = Replica(identity, kube, mets, ctl, asyncio.create_task(ctl.run(stop), name=f"controller:{identity}"), stop)

    async def ready() -> bool:
        states = ctl.supervisor.health()
        return ctl.is_leader() and health.readiness()[0] and bool(states) and all(
            s == "running" for s in states.values())
    try:
        await _until(ready, f"controller {identity} to lead, ready")
    except AssertionError:
        await replica.shutdown()
        raise
    await asyncio.sleep(0.3)  # detectors subscribe right after the cache synced
    return replica, health


@contextlib.asynccontextmanager
async def _tenant(cluster: Cluster, namespace: str, name: str, rules: list[Obj]) -> AsyncIterator[client_.KubeClient]:
    """A client with the token of ServiceAccount `name` of `namespace`, bound to a Role of `rules` there (on the
    simulated server, which has no RBAC and no tokens, a plain client)."""
    if cluster.sim is not None:
        tenant = client_.from_configuration(cluster.configuration, retry=retrying.NO_RETRY)
    else:
        kube = cluster.client
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body={
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        await kube.request("POST", f"{rbac}/roles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules})
        await kube.request("POST", f"{rbac}/rolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
        got = await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
        configuration = copy.copy(cluster.configuration)
        configuration.api_key = {"BearerToken": f"Bearer {got['status']['token']}"}
        configuration.api_key_prefix = {}
        configuration.refresh_api_key_hook = None
        tenant = client_.from_configuration(configuration, retry=retrying.NO_RETRY)
    try:
        yield tenant
    finally:
        await tenant.close()


async def _raw_list(cluster: Cluster, path: str) -> str:
    """A list's text as the server sends it (the premise: orjson alone cannot read it)."""
    return str(await cluster.client.text(path))


async def _write_deep_event(eventer: client_.KubeClient, namespace: str) -> None:
    """An Event in `namespace` whose managedFields nest `DEPTH` levels (the server keeps them as written)."""
    await eventer.request("POST", f"/api/v1/namespaces/{namespace}/events", body=(
        b'{"apiVersion":"v1","kind":"Event","metadata":{"name":"deep",' + managed_fields("eventer") + b'},'
        b'"involvedObject":{"kind":"Pod","namespace":"' + namespace.encode() + b'","name":"x"},'
        b'"reason":"Deep","message":"deep","type":"Normal"}'))


async def _ask_recovery(cluster: Cluster, pod: Obj) -> None:
    """A fresh Event annotated kcover.io/need-recovery about `pod`, in its namespace, as a health checker posts it."""
    meta = pod["metadata"]
    now = clock_.rfc3339(clock_.utcnow())
    await cluster.client.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body={
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(6)}", "namespace": meta["namespace"],
                     "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                           "uid": meta["uid"]},
        "reason": "NCCLAllReduceHang", "message": "all-reduce stalled for 300s", "type": "Warning",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": "healthcheck.example.com/checker"},
        "reportingComponent": "healthcheck.example.com/checker", "reportingInstance": "checker-0"})


async def _restarts(cluster: Cluster, namespace: str, uid: str) -> int:
    events = (await cluster.client.request("GET", f"/api/v1/namespaces/{namespace}/events")).get("items") or []
    return sum(1 for e in events if e.get("reason") == "KcoverRestartedWorkload" and e["involvedObject"].get("uid") == uid)


async def _fail_a_worker(cluster: Cluster, namespace: str) -> None:
    pods = [p for p in await _pods(cluster, namespace, "victim") if not p["metadata"].get("deletionTimestamp")]
    await cluster.harness.fail_container(namespace, pods[0]["metadata"]["name"], "pytorch")


async def test_objects_nested_too_deep_blind_nothing(cluster: Cluster) -> None:
    suffix = secrets.token_hex(3)
    events_ns = await cluster.create_namespace(f"deep-ev-{suffix}")
    pods_ns = await cluster.create_namespace(f"deep-po-{suffix}")
    victim_ns = await cluster.create_namespace(f"victim-{suffix}")
    node = f"deep-{suffix}"
    await _node(cluster.client, node)
    victim = await _job(cluster, victim_ns, "victim", node)
    victim_uid = victim["metadata"]["uid"]
    await cluster.client.request("POST", f"/api/v1/namespaces/{pods_ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "own"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})

    first, health = await _start(cluster, "a")
    second: Replica | None = None
    try:
        async with playing.Harness(cluster.harness.kube, namespace=victim_ns).playing(), \
                _tenant(cluster, events_ns, "eventer", [{"apiGroups": [""], "resources": ["events"],
                                                         "verbs": ["create"]}]) as eventer, \
                _tenant(cluster, pods_ns, "podder", [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "patch"]},
                    {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create"]}]) as podder:
            await _write_deep_event(eventer, events_ns)
            await podder.request("POST", f"/api/v1/namespaces/{pods_ns}/pods", body=(
                b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep",' + managed_fields("podder") + b'},'
                b'"spec":{"containers":[{"name":"c","image":"busybox"}]}}'))
            await podder.request("PATCH", f"/api/v1/namespaces/{pods_ns}/pods/own", content_type=client_.MERGE_PATCH,
                                 body=b'{"metadata":{' + managed_fields("patcher") + b"}}")
            with pytest.raises(decoding.Unreadable):  # stored; its answer is what kcover cannot decode at all
                await podder.request("POST", f"/apis/kubeflow.org/v1/namespaces/{pods_ns}/pytorchjobs", body=(
                    b'{"apiVersion":"kubeflow.org/v1","kind":"PyTorchJob","metadata":{"name":"deep"},"spec":{"x":'
                    + b"[" * DEPTH + b"]" * DEPTH + b',"pytorchReplicaSpecs":{}}}'))
            for path in (f"/api/v1/namespaces/{events_ns}/events", f"/api/v1/namespaces/{pods_ns}/pods"):
                with pytest.raises(orjson.JSONDecodeError):  # the premise: the server serves what orjson refuses
                    orjson.loads(await _raw_list(cluster, path))

            # the running controller still sees the tenants' pods and acts on another namespace's failure
            await _until(lambda: _has_pods(first, pods_ns, {"deep", "own"}), "the tenant's deep pods in the cache")
            before = {p["metadata"]["uid"] for p in await _pods(cluster, victim_ns, "victim")}
            await _fail_a_worker(cluster, victim_ns)
            await _until(lambda: _count_at_least(cluster, victim_ns, victim_uid, 1), "the victim's restart")
            skipped = first.sample("kcover_objects_skipped_total", {"kind": "PyTorchJob", "reason": "too_deep"})
            assert skipped >= 1, "the PyTorchJob nobody can decode is skipped and counted"
            assert health.readiness()[0], health.readiness()
            await first.shutdown()

            # a controller started now lists everything the tenants wrote: it syncs, leads and acts
            second, health = await _start(cluster, "b")
            assert second.sample("kcover_objects_skipped_total", {"kind": "PyTorchJob", "reason": "too_deep"}) >= 1
            await _until(lambda: _recreated(cluster, victim_ns, before), "the victim's workers recreated")
            for pod in await _pods(cluster, victim_ns, "victim"):
                await cluster.harness.run_pod(victim_ns, pod["metadata"]["name"])
            await _fail_a_worker(cluster, victim_ns)
            await _until(lambda: _count_at_least(cluster, victim_ns, victim_uid, 2), "the second restart")
            assert health.readiness()[0], health.readiness()
    finally:
        await first.shutdown()
        if second is not None:
            await second.shutdown()


async def test_an_event_nested_too_deep_leaves_the_events_watch_acting(cluster: Cluster) -> None:
    suffix = secrets.token_hex(3)
    events_ns = await cluster.create_namespace(f"deep-ev-{suffix}")
    victim_ns = await cluster.create_namespace(f"victim-{suffix}")
    node = f"deep-{suffix}"
    await _node(cluster.client, node)
    victim_uid = (await _job(cluster, victim_ns, "victim", node))["metadata"]["uid"]
    before = await _pods(cluster, victim_ns, "victim")

    first, health = await _start(cluster, "a")
    try:
        async with playing.Harness(cluster.harness.kube, namespace=victim_ns).playing(), \
                _tenant(cluster, events_ns, "eventer", [{"apiGroups": [""], "resources": ["events"],
                                                         "verbs": ["create"]}]) as eventer:
            await _write_deep_event(eventer, events_ns)
            with pytest.raises(orjson.JSONDecodeError):  # the premise: the server serves what orjson refuses
                orjson.loads(await _raw_list(cluster, f"/api/v1/namespaces/{events_ns}/events"))

            # written after the deep one, so the Events watch delivers it only if it read past the deep one
            await _ask_recovery(cluster, before[1])
            await _until(lambda: _count_at_least(cluster, victim_ns, victim_uid, 1),
                         "the victim's restart, asked by an annotated Event after the deep one")
            await _until(lambda: _recreated(cluster, victim_ns, {p["metadata"]["uid"] for p in before}),
                         "the victim's workers recreated")
            await asyncio.sleep(1.5)  # nothing restarts it twice
            assert await _restarts(cluster, victim_ns, victim_uid) == 1
            assert health.readiness()[0], health.readiness()
    finally:
        await first.shutdown()


async def _has_pods(replica: Replica, namespace: str, names: set[str]) -> bool:
    cache = replica.controller.cache
    return all(cache.pod_by_name(namespace, name) is not None for name in names)


async def _count_at_least(cluster: Cluster, namespace: str, uid: str, count: int) -> bool:
    return await _restarts(cluster, namespace, uid) >= count


async def _recreated(cluster: Cluster, namespace: str, old_uids: set[str]) -> bool:
    pods = await _pods(cluster, namespace, "victim")
    return len(pods) == 2 and all(p["metadata"]["uid"] not in old_uids and not p["metadata"].get("deletionTimestamp")
                                  for p in pods)
