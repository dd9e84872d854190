"""The four controller detectors on a ClusterCache fed by a real HTTP API server (every backend).

Each injected fault gives exactly the expected events; healthy churn (1,000 pod updates), a forced
re-list and a restart (a new cache and new detector instances) give none. On a server that does not keep
`allocatedResourcesStatus` naming a DRA claim (`Cluster.device_health_refused`: before Kubernetes 1.31, or
its gates off) the device-health writes are dropped by the server, and dra-health must say nothing.

The forced re-list: on the sim, its fault injection expires the watches; on the real kube-apiserver,
whose test control plane keeps no watch cache for pods (tests/controlplane/server.py), the pod
reflector's watches end after 1 s, unrelated writes move etcd's revision on and an etcd compaction
makes the reflector's next watch from its resourceVersion answer 410, so it re-lists and diffs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog

from kcover import bus as bus_
from kcover import errors, metrics, model
from kcover.aio import clock as clock_
from kcover.detectors import contract, dra_health, event_watcher, node_condition, pod_status
from kcover.kube import caching, client, watching

OPTIONS = watching.ReflectorOptions(page_size=100, backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                                    missing_retry_seconds=1.0)
Cluster = Any  # tests/backends.py's Cluster
CLAIM = "claim:gpu/gpu"


def now_text(seconds_ago: float = 0) -> str:
    return clock_.rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago))


async def seed(cluster: Cluster) -> dict[str, Any]:
    kube, ns = cluster.harness.kube, cluster.namespace
    for i in range(3):
        await kube.request("POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i}"}, "spec": {}})
        await set_condition(cluster, f"gpu-{i}", "True", 3600, why=False, capacity={"nvidia.com/gpu": "8"})
    jobs = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
    job = await kube.request("POST", jobs, body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {
        "name": "bert", "namespace": ns, "labels": {"kcover.io/cascading-recovery": "true"}}, "spec": {}})
    other = await kube.request("POST", jobs, body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                   "metadata": {"name": "other", "namespace": ns}, "spec": {}})
    for owner, count in ((job, 4), (other, 1)):
        ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": owner["metadata"]["name"],
               "uid": owner["metadata"]["uid"], "controller": True}
        for i in range(count):
            name = f"{owner['metadata']['name']}-{i}"
            # the device a KEP-4680 status names must be one of the container's claims (a real server checks)
            await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [ref],
                             "labels": {"training.kubeflow.org/job-name": owner["metadata"]["name"]}},
                "spec": {"nodeName": f"gpu-{i % 3}",
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                         "containers": [{"name": "trainer", "image": "trainer",
                                         "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]}})
            await cluster.harness.run_pod(ns, name)
            await cluster.harness.set_device_health(ns, name, "trainer", resource_name=CLAIM,
                                                    resource_id=f"gpu.nvidia.com/pool/gpu-{i}", health="Healthy")
    await cluster.harness.run_agent_pod(ns, "gpu-1")
    return dict(job)


class Controller:
    """A cache and the four detectors, as the controller wires them."""

    def __init__(self, kube: client.KubeClient, context: contract.DetectorContext, bus: bus_.Bus,
                 options: watching.ReflectorOptions = OPTIONS) -> None:
        self.cache = caching.ClusterCache(kube, options=options)
        self.context = dataclasses.replace(context, cluster=self.cache)
        self.bus = bus
        self.stop = asyncio.Event()
        cfg_dra = dra_health.DraHealthConfig(unknown_warning_seconds=0.5, tick_seconds=0.1)
        cfg_nc = node_condition.NodeConditionConfig(min_duration_seconds=0.5, tick_seconds=0.1,
                                                    recovered_hold_seconds=0.5)
        self.detectors: list[Any] = [
            pod_status.PodStatusDetector("pod-status", pod_status.PodStatusConfig(), self.context),
            dra_health.DraHealthDetector("dra-health", cfg_dra, self.context),
            event_watcher.EventWatcherDetector("event-watcher", event_watcher.EventWatcherConfig(), self.context),
            node_condition.NodeConditionDetector("node-condition", cfg_nc, self.context),
        ]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Controller]:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.cache.run(self.stop), name="cache")
            for d in self.detectors:
                tg.create_task(d.run(self.bus, self.stop), name=d.name)
            await asyncio.wait_for(self.cache.wait_synced(), 10)
            try:
                yield self
            finally:
                self.stop.set()


async def quiet(sub: bus_.Subscription, seconds: float = 0.8) -> list[model.CollectorEvent]:
    await asyncio.sleep(seconds)
    return sub.get_nowait()


async def collect(sub: bus_.Subscription, n: int, within: float = 10.0) -> list[model.CollectorEvent]:
    got: list[model.CollectorEvent] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        got += sub.get_nowait()
        await asyncio.sleep(0.02)
    got += await quiet(sub, 0.5)
    return got


def shape(events: list[model.CollectorEvent]) -> list[tuple[str, str, str, str]]:
    return sorted((e.detector, e.reason, e.severity.value, e.target.name) for e in events)


async def set_container(cluster: Cluster, pod: str, **changes: Any) -> None:
    def change(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"]["containerStatuses"][0].update(changes)
        return dict(obj["status"])
    await cluster.harness.set_status(cluster.namespace, pod, change)


async def set_health(cluster: Cluster, pod: str, health: str, message: str = "") -> None:
    index = int(pod.rsplit("-", 1)[1])
    await cluster.harness.set_device_health(cluster.namespace, pod, "trainer", resource_name=CLAIM,
                                            resource_id=f"gpu.nvidia.com/pool/gpu-{index}", health=health,
                                            message=message)


async def set_condition(cluster: Cluster, node: str, status: str, seconds_ago: float, *, why: bool = True,
                        **extra: Any) -> None:
    kube = cluster.harness.kube
    condition = {"type": "KcoverGPUHealthy", "status": status, "lastTransitionTime": now_text(seconds_ago)}
    if why:
        condition.update(reason="XID79", message="GPU fell off the bus")
    for _ in range(10):
        obj = await kube.request("GET", f"/api/v1/nodes/{node}")
        obj["status"] = {**(obj.get("status") or {}), **extra, "conditions": [condition]}
        try:
            await kube.request("PUT", f"/api/v1/nodes/{node}/status", body=obj)
            return
        except errors.ConflictError:
            continue


async def annotated_event(cluster: Cluster, name: str, *, kind: str, target: str, namespace: str, uid: str = "",
                          component: str = "someone", target_namespace: str | None = None, host: str = "") -> None:
    # an Event about a Node outside default/kube-system must name its own namespace in the reference
    node_ns = "" if namespace in ("default", "kube-system") else namespace
    inv_ns = target_namespace if target_namespace is not None else namespace if kind == "Pod" else node_ns
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace, "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": {"kind": kind, "name": target, "uid": uid, "namespace": inv_ns},
        "reason": "TrainerHung", "message": "please restart", "type": "Warning", "count": 1,
        "source": {"component": component, **({"host": host} if host else {})}, "firstTimestamp": now_text(), "lastTimestamp": now_text()}
    if inv_ns and inv_ns != namespace:
        # core/v1 refuses a namespace mismatch unless the event is in the new (eventTime) shape
        body.update(eventTime=clock_.micro_time(dt.datetime.now(dt.UTC)), reportingComponent=component,
                    reportingInstance="somewhere", action="Restart")
    await cluster.harness.kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)


async def until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def churn(cluster: Cluster, cache: caching.ClusterCache, updates: int = 1000) -> None:
    pods = [f"bert-{i}" for i in range(4)] + ["other-0"]
    kube, ns = cluster.harness.kube, cluster.namespace

    async def touch(i: int) -> int:
        out = await kube.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{pods[i % len(pods)]}",
                                 body={"metadata": {"annotations": {"tick": str(i)}}}, content_type=client.MERGE_PATCH)
        return int(out["metadata"]["resourceVersion"])

    last = 0
    for start in range(0, updates, 10):
        last = max(last, *await asyncio.gather(*(touch(i) for i in range(start, min(start + 10, updates)))))
    await until(lambda: int(cache.pod_reflector.resource_version or 0) >= last, 20)


async def relist_by_compaction(cluster: Cluster, reflector: watching.Reflector[Any]) -> None:
    """Make `reflector` (pods, not cached by the test control plane) go through 410 -> re-list -> diff.

    Writes unrelated objects so etcd's revision passes the reflector's resourceVersion by more than one,
    then compacts etcd there: the reflector's next watch (each ends after 1 s) from its resourceVersion
    answers 410 Expired. Asserts it logged the expiry and listed exactly once more.
    """
    lists, rv = reflector.lists, int(reflector.resource_version)
    path = f"/api/v1/namespaces/{cluster.namespace}/configmaps"
    with structlog.testing.capture_logs() as logs:
        for i in range(3):
            await cluster.harness.kube.request("POST", path, body={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"unrelated-{i}"}})
        compacted = await asyncio.to_thread(cluster.controlplane.compact)
        assert compacted > rv + 1
        await until(lambda: reflector.lists == lists + 1)
        await asyncio.sleep(1.5)  # the next watches (from the new list's RV) are not expired: no second re-list
    expired = [e for e in logs if e["event"] == "watch_expired_relisting" and e["reflector"] == reflector.name]
    assert [e["resource_version"] for e in expired] == [str(rv)]
    assert reflector.lists == lists + 1
    assert reflector.store  # the re-list found the pods again


async def test_faults_give_exactly_their_events_and_churn_relist_restart_give_none(
        cluster: Cluster) -> None:
    kube, NS = cluster.client, cluster.namespace
    device_health = not await cluster.device_health_refused()
    job = await seed(cluster)
    bus = bus_.Bus(dedupe_window_seconds=0)  # no dedupe: a repeat must show
    sub = bus.subscribe("test")
    context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics(), namespace=NS)
    # a real server ends each watch after 1 s, so the reflector watches again from its resourceVersion
    options = OPTIONS if cluster.controlplane is None else dataclasses.replace(OPTIONS, watch_timeout_seconds=1)
    first = Controller(kube, context, bus, options)
    async with first.running() as ctl:
        assert await quiet(sub) == []
        bert0 = ctl.cache.pod_by_name(NS, "bert-0")
        assert bert0 is not None
        # -- faults (refusals are read from the log: on a real API server shared by the session, other tests'
        #    annotated Events are judged by this cache too, so the refusal counter is exact only on sim)
        refusals = structlog.testing.capture_logs()
        captured = refusals.__enter__()
        await set_container(cluster, "bert-0", state={"terminated": {"reason": "Error", "exitCode": 3, "finishedAt": now_text()}})
        await set_container(cluster, "other-0", state={"terminated": {"reason": "Error", "exitCode": 3, "finishedAt": now_text()}})
        await set_health(cluster, "bert-1", "Unhealthy", "XID 79: GPU has fallen off the bus")
        await set_health(cluster, "bert-2", "Unknown")
        await set_condition(cluster, "gpu-2", "False", seconds_ago=60)
        await annotated_event(cluster, "ev-pod", kind="Pod", target="bert-3", namespace=NS)
        await annotated_event(cluster, "ev-pod-other-ns", kind="Pod", target="bert-3", namespace="default", target_namespace=NS)
        await annotated_event(cluster, "ev-node-untrusted", kind="Node", target="gpu-1", namespace=NS, host="gpu-1")
        await annotated_event(cluster, "ev-node-default", kind="Node", target="gpu-1", namespace="default",
                              component="kcover.io/agent", host="gpu-1")  # not kcover's namespace
        await annotated_event(cluster, "ev-node", kind="Node", target="gpu-1", namespace=NS, component="kcover.io/agent",
                              host="gpu-1")  # the agent's: kcover's namespace, its node, an agent pod there
        expected = [
            ("dra-health", "DeviceHealthUnknown", "Warning", "bert-2"),
            ("dra-health", "DeviceUnhealthy", "Error", "bert-1"),
            ("event-watcher", "RecoveryRequested", "Error", "bert-3"),
            ("event-watcher", "RecoveryRequested", "Error", "gpu-1"),
            ("node-condition", "NodeConditionBad", "Error", "gpu-2"),
            ("pod-status", "ContainerError", "Error", "bert-0"),
        ]
        if not device_health:  # the server dropped the device-health writes: dra-health has nothing to say
            expected = [e for e in expected if e[0] != "dra-health"]
        got = await collect(sub, len(expected))
        refusals.__exit__(None, None, None)
        mine = {"ev-pod-other-ns", "ev-node-untrusted", "ev-node-default"}
        refused = {e["k8s_event"].rsplit("/", 1)[1]: e["reason"] for e in captured
                   if e["event"] == "recovery_event_rejected" and e["k8s_event"].rsplit("/", 1)[1] in mine}
        assert refused == {"ev-pod-other-ns": "namespace_mismatch", "ev-node-untrusted": "untrusted_reporter",
                           "ev-node-default": "namespace_not_allowed"}
        assert shape(got) == expected
        by_reason = {e.reason: e for e in got}
        err = by_reason["ContainerError"]
        assert err.target == model.Target(kind=model.TargetKind.POD, namespace=NS, name="bert-0", uid=bert0.uid,
                                          node="gpu-0")
        assert err.fault == model.Fault(container="trainer")
        assert err.attributes["exit_code"] == 3
        assert err.attributes["restart_count"] == 0
        assert err.attributes["workload"] == {"kind": "PyTorchJob", "name": "bert", "uid": job["metadata"]["uid"],
                                              "apiVersion": "kubeflow.org/v1"}
        assert (by_reason["NodeConditionBad"].recommended, by_reason["NodeConditionBad"].fault.check) == \
            (model.Action.CORDON_NODE, "KcoverGPUHealthy")
        if device_health:
            dra = by_reason["DeviceUnhealthy"]
            assert dra.fault == model.Fault(container="trainer",
                                            dra=model.DraDevice(driver="gpu.nvidia.com", pool="pool", device="gpu-1"))
            assert dra.attributes["claim"] == "claim:gpu/gpu"
            assert dra.attributes["resource_id"] == "gpu.nvidia.com/pool/gpu-1"
            assert dra.attributes["device_message"] == "XID 79: GPU has fallen off the bus"
        family = next(iter(context.metrics.events_rejected.collect()))
        rejected = {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total") and s.value}
        if cluster.controlplane is None:  # alone on its server: the counter holds exactly these refusals
            assert rejected == {"namespace_mismatch": 1.0, "untrusted_reporter": 1.0, "namespace_not_allowed": 1.0}

        # -- the same termination after an in-place restart is not new
        ended = (await kube.request("GET", f"/api/v1/namespaces/{NS}/pods/bert-0"))["status"]["containerStatuses"][0]["state"]
        await set_container(cluster, "bert-0", restartCount=1, state={"running": {"startedAt": now_text()}}, lastState=ended)
        assert await quiet(sub) == []

        # -- healthy churn and a forced re-list: nothing
        await churn(cluster, ctl.cache)
        assert await quiet(sub) == []
        if cluster.sim is not None:  # forcing a re-list needs the sim's fault injection
            lists = ctl.cache.pod_reflector.lists
            for key in ("pods", "nodes", "events", "pytorchjobs.kubeflow.org"):
                cluster.sim.faults.expire_next_watch(key)
            cluster.sim.faults.drop_watches()
            await until(lambda: ctl.cache.pod_reflector.lists == lists + 1)
            assert await quiet(sub) == []
        elif cluster.controlplane is not None:  # a real server: an etcd compaction past the reflector's RV
            await relist_by_compaction(cluster, ctl.cache.pod_reflector)
            assert await quiet(sub) == []

    # -- restart: a new cache and new detector instances, the same process state
    second = Controller(kube, context, bus, options)
    async with second.running() as ctl2:
        assert await quiet(sub) == []
        await churn(cluster, ctl2.cache, 200)
        assert await quiet(sub) == []
        # -- recoveries are Info, once
        await set_health(cluster, "bert-1", "Healthy")
        await set_condition(cluster, "gpu-2", "True", seconds_ago=0)
        recovered = [("dra-health", "DeviceRecovered", "Info", "bert-1"),
                     ("node-condition", "NodeConditionRecovered", "Info", "gpu-2")][0 if device_health else 1:]
        got = await collect(sub, len(recovered))
        assert shape(got) == recovered
        assert [e.cleared for e in got] == [True] * len(recovered)
        assert await quiet(sub, 0.3) == []
