"""The four controller detectors on a ClusterCache fed by the simulated API server.

Each injected fault gives exactly the expected events; healthy churn (1,000 pod updates), a forced
re-list and a restart (a new cache and new detector instances) give none.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import metrics, model
from kcover.aio import clock as clock_
from kcover.detectors import contract, dra_health, event_watcher, node_condition, pod_status
from kcover.kube import caching, client, watching

simserver = pytest.importorskip("kcover.sim.server")  # lands with the simulated cluster

OPTIONS = watching.ReflectorOptions(page_size=100, backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                                    missing_retry_seconds=1.0)
NS = "ml"


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, client.KubeClient]]:
    async with simserver.SimServer() as srv:
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield srv, kube
        finally:
            await kube.close()


def now_text(seconds_ago: float = 0) -> str:
    return clock_.rfc3339(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago))


def seed(srv: Any) -> dict[str, Any]:
    srv.store.create("namespaces", {"metadata": {"name": NS}})
    for i in range(3):
        srv.store.create("nodes", {"metadata": {"name": f"gpu-{i}"}, "spec": {},
                                   "status": {"capacity": {"nvidia.com/gpu": "8"},
                                              "conditions": [{"type": "KcoverGPUHealthy", "status": "True",
                                                              "lastTransitionTime": now_text(3600)}]}})
    job = srv.store.create("pytorchjobs.kubeflow.org", {"metadata": {
        "name": "bert", "namespace": NS, "labels": {"kcover.io/cascading-recovery": "true"}}, "spec": {}})
    other = srv.store.create("pytorchjobs.kubeflow.org", {"metadata": {"name": "other", "namespace": NS}, "spec": {}})
    for owner, count in ((job, 4), (other, 1)):
        ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": owner["metadata"]["name"],
               "uid": owner["metadata"]["uid"], "controller": True}
        for i in range(count):
            srv.store.create("pods", {"metadata": {
                "name": f"{owner['metadata']['name']}-{i}", "namespace": NS, "ownerReferences": [ref],
                "labels": {"training.kubeflow.org/job-name": owner["metadata"]["name"]}},
                "spec": {"nodeName": f"gpu-{i % 3}", "containers": [{"name": "trainer"}]},
                "status": {"phase": "Running", "containerStatuses": [{
                    "name": "trainer", "restartCount": 0, "state": {"running": {"startedAt": now_text(60)}},
                    "allocatedResourcesStatus": [{"name": "claim:gpu/gpu", "resources": [
                        {"resourceID": f"gpu.nvidia.com/pool/gpu-{i}", "health": "Healthy"}]}]}]}})
    return job


class Controller:
    """A cache and the four detectors, as the controller wires them."""

    def __init__(self, kube: client.KubeClient, context: contract.DetectorContext, bus: bus_.Bus) -> None:
        self.cache = caching.ClusterCache(kube, options=OPTIONS)
        self.context = dataclasses.replace(context, cache=self.cache)
        self.bus = bus
        self.stop = asyncio.Event()
        cfg_dra = dra_health.DraHealthConfig(unknown_warning_seconds=0.5, tick_seconds=0.1)
        cfg_nc = node_condition.NodeConditionConfig(min_duration_seconds=0.5, tick_seconds=0.1)
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


def set_container(srv: Any, pod: str, **changes: Any) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["status"]["containerStatuses"][0].update(changes)
    srv.store.mutate("pods", NS, pod, change)


def set_health(srv: Any, pod: str, health: str, message: str = "") -> None:
    def change(obj: dict[str, Any]) -> None:
        res = obj["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]
        res["health"] = health
        if message:
            res["message"] = message
    srv.store.mutate("pods", NS, pod, change)


def set_condition(srv: Any, node: str, status: str, seconds_ago: float) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["status"]["conditions"] = [{"type": "KcoverGPUHealthy", "status": status, "reason": "XID79",
                                        "message": "GPU fell off the bus", "lastTransitionTime": now_text(seconds_ago)}]
    srv.store.mutate("nodes", "", node, change)


def annotated_event(srv: Any, name: str, *, kind: str, target: str, namespace: str, uid: str = "",
                    component: str = "someone", target_namespace: str | None = None) -> None:
    srv.store.create("events", {
        "metadata": {"name": name, "namespace": namespace, "annotations": {"kcover.io/need-recovery": "true"}},
        "involvedObject": {"kind": kind, "name": target, "uid": uid,
                           "namespace": target_namespace if target_namespace is not None else namespace if kind == "Pod" else ""},
        "reason": "TrainerHung", "message": "please restart", "type": "Warning", "count": 1,
        "source": {"component": component}, "firstTimestamp": now_text(), "lastTimestamp": now_text()})


async def until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def churn(srv: Any, cache: caching.ClusterCache, updates: int = 1000) -> None:
    pods = [f"bert-{i}" for i in range(4)] + ["other-0"]
    for i in range(updates):
        srv.store.mutate("pods", NS, pods[i % len(pods)],
                         lambda o, i=i: o["metadata"].setdefault("annotations", {}).update(tick=str(i)))
        if i % 100 == 99:
            await asyncio.sleep(0)
    last = str(srv.store.resource_version)
    await until(lambda: cache.pod_reflector.resource_version == last, 20)


async def test_faults_give_exactly_their_events_and_churn_relist_restart_give_none(
        cluster: tuple[Any, client.KubeClient]) -> None:
    srv, kube = cluster
    job = seed(srv)
    bus = bus_.Bus(dedupe_window_seconds=0)  # no dedupe: a repeat must show
    sub = bus.subscribe("test")
    context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics.Metrics())
    first = Controller(kube, context, bus)
    async with first.running() as ctl:
        assert await quiet(sub) == []
        bert0 = ctl.cache.pod_by_name(NS, "bert-0")
        assert bert0 is not None
        # -- faults
        set_container(srv, "bert-0", state={"terminated": {"reason": "Error", "exitCode": 3, "finishedAt": now_text()}})
        set_container(srv, "other-0", state={"terminated": {"reason": "Error", "exitCode": 3, "finishedAt": now_text()}})
        set_health(srv, "bert-1", "Unhealthy", "XID 79: GPU has fallen off the bus")
        set_health(srv, "bert-2", "Unknown")
        set_condition(srv, "gpu-2", "False", seconds_ago=60)
        annotated_event(srv, "ev-pod", kind="Pod", target="bert-3", namespace=NS)
        annotated_event(srv, "ev-pod-other-ns", kind="Pod", target="bert-3", namespace="default", target_namespace=NS)
        annotated_event(srv, "ev-node-untrusted", kind="Node", target="gpu-1", namespace="default")
        annotated_event(srv, "ev-node", kind="Node", target="gpu-1", namespace="default", component="kcover.io/agent")
        got = await collect(sub, 6)
        assert shape(got) == [
            ("dra-health", "DeviceHealthUnknown", "Warning", "bert-2"),
            ("dra-health", "DeviceUnhealthy", "Error", "bert-1"),
            ("event-watcher", "RecoveryRequested", "Error", "bert-3"),
            ("event-watcher", "RecoveryRequested", "Error", "gpu-1"),
            ("node-condition", "NodeConditionBad", "Error", "gpu-2"),
            ("pod-status", "ContainerError", "Error", "bert-0"),
        ]
        by_reason = {e.reason: e for e in got}
        err = by_reason["ContainerError"]
        assert err.target == model.Target(kind=model.TargetKind.POD, namespace=NS, name="bert-0", uid=bert0.uid,
                                          node="gpu-0")
        assert err.attributes["container"] == "trainer"
        assert err.attributes["exit_code"] == 3
        assert err.attributes["restart_count"] == 0
        assert err.attributes["workload"] == {"kind": "PyTorchJob", "name": "bert", "uid": job["metadata"]["uid"],
                                              "apiVersion": "kubeflow.org/v1"}
        dra = by_reason["DeviceUnhealthy"]
        assert dra.attributes["claim"] == "claim:gpu/gpu"
        assert dra.attributes["resource_id"] == "gpu.nvidia.com/pool/gpu-1"
        assert dra.attributes["device_message"] == "XID 79: GPU has fallen off the bus"
        rejected = {s.labels["reason"]: s.value for s in context.metrics.events_rejected.collect()[0].samples
                    if s.name.endswith("_total")}
        assert rejected == {"namespace_mismatch": 1.0, "untrusted_reporter": 1.0}

        # -- the same termination after an in-place restart is not new
        ended = srv.store.get("pods", NS, "bert-0")["status"]["containerStatuses"][0]["state"]
        set_container(srv, "bert-0", restartCount=1, state={"running": {"startedAt": now_text()}}, lastState=ended)
        assert await quiet(sub) == []

        # -- healthy churn and a forced re-list: nothing
        await churn(srv, ctl.cache)
        assert await quiet(sub) == []
        lists = ctl.cache.pod_reflector.lists
        for key in ("pods", "nodes", "events", "pytorchjobs.kubeflow.org"):
            srv.faults.expire_next_watch(key)
        srv.faults.drop_watches()
        await until(lambda: ctl.cache.pod_reflector.lists == lists + 1)
        assert await quiet(sub) == []

    # -- restart: a new cache and new detector instances, the same process state
    second = Controller(kube, context, bus)
    async with second.running() as ctl2:
        assert await quiet(sub) == []
        await churn(srv, ctl2.cache, 200)
        assert await quiet(sub) == []
        # -- recoveries are Info, once
        set_health(srv, "bert-1", "Healthy")
        set_condition(srv, "gpu-2", "True", seconds_ago=0)
        got = await collect(sub, 2)
        assert shape(got) == [("dra-health", "DeviceRecovered", "Info", "bert-1"),
                              ("node-condition", "NodeConditionRecovered", "Info", "gpu-2")]
        assert await quiet(sub, 0.3) == []
