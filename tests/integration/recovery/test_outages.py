"""Fourteen seconds of 500s on what recovery reads and writes first lose no fault, on every cluster backend.

The real controller (cache, detectors, Lease, engine) talks to the backend through an HTTP proxy that
answers one resource with 500 `InternalError`s (harness/faultproxy.py: the same outage on the simulated
server and on a real kube-apiserver, whose own 500s need etcd gone). The controls ConfigMap and the
Namespaces are watched: an outage of either at the controller's start keeps its cache from syncing, and
nothing is acted on until it does; the ledger is written before any pod is removed: an outage of its
writes keeps the fault, retried with backoff. A container fails during the outage; once it ends the job
is restarted exactly once. With `recovery.retry_seconds` shorter than the outage the fault ends in a
`KcoverRecoveryFailed` Event and `kcover_faults_given_up_total` instead, and nothing is restarted later.
Real time (looptime cannot drive sockets); every wait polls for what the API server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from harness.faultproxy import FaultProxy

from kcover import metrics as metrics_
from kcover import serving, settings
from kcover.controller import running
from kcover.kube import client as client_
from kcover.kube import retrying

Cluster = Any  # tests/backends.py's Cluster
Obj = dict[str, Any]

OUTAGE_SECONDS = 14.0
WAIT = 45.0
SETTLE = 3.0
CONTAINER = "pytorch"
JOB_NAME = "training.kubeflow.org/job-name"
READS = frozenset({"GET"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def _until(probe: Callable[[], Awaitable[Any]], what: str, within: float = WAIT) -> Any:
    try:
        async with asyncio.timeout(within):
            while not (got := await probe()):  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.2)
            return got
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def _job(cluster: Cluster, node: str) -> Obj:
    ns = cluster.namespace
    await cluster.client.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                                "metadata": {"name": node}})
    job: Obj = await cluster.client.request("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": ns, "labels": {"kcover.io/cascading-recovery": "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": {
            "spec": {"nodeName": node, "containers": [{"name": CONTAINER, "image": "trainer"}]}}}}}})
    await cluster.harness.reconcile_jobs()
    for pod in await _pods(cluster):
        await cluster.harness.run_pod(ns, pod["metadata"]["name"])
    return job


async def _pods(cluster: Cluster) -> list[Obj]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/pods",
                                          query={"labelSelector": f"{JOB_NAME}=train"})
    return sorted(listed.get("items") or [], key=lambda p: str(p["metadata"]["name"]))


async def _events(cluster: Cluster, reason: str) -> list[Obj]:
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/events")
    return [e for e in listed.get("items") or [] if e.get("reason") == reason]


@contextlib.asynccontextmanager
async def _controller(cluster: Cluster, proxy: FaultProxy, **recovery: Any) -> AsyncIterator[running.Controller]:
    ns = cluster.namespace
    cfg = settings.Settings.model_validate({
        "recovery": {"ledger_namespace": ns, "namespaces_deny": [], "save_logs": {"enabled": False}, **recovery},
        "lease": {"namespace": ns, "identity": "a", "lease_duration_seconds": 2.0, "renew_deadline_seconds": 1.5,
                  "retry_period_seconds": 0.2},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "gc_freeze_after_sync": False,
                 "retry_deadline_seconds": 2.0},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False}}},
    })
    kube = client_.from_configuration(proxy.configuration, retry=retrying.policy_from(cfg.kube))
    mets = metrics_.Metrics()
    ctl = running.Controller(cfg, client=kube, metrics=mets, health=serving.Health())
    ctl.metrics_ = mets  # type: ignore[attr-defined]
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop), name="controller:a")
    try:
        async def leading() -> bool:
            return ctl.is_leader()
        await _until(leading, "the controller to lead")
        yield ctl
    finally:
        stop.set()
        await asyncio.wait([task], timeout=10.0)
        await kube.close()
    task.result()  # a crash of the controller fails the test


CASES = [
    ("the controls ConfigMap's watch at the controller's start", "configmaps", READS, True),
    ("the Namespaces' watch at the controller's start", "namespaces", READS, True),
    ("the ledger's writes under a running controller", "ledgerentries", WRITES, False),
]


@pytest.mark.parametrize(("resource", "methods", "at_start"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_an_outage_of_fourteen_seconds_delays_the_restart_and_loses_nothing(
        cluster: Cluster, resource: str, methods: frozenset[str], at_start: bool) -> None:
    job = await _job(cluster, f"out-{secrets.token_hex(3)}")
    uid = job["metadata"]["uid"]
    old = {p["metadata"]["uid"] for p in await _pods(cluster)}
    async with cluster.harness.playing(), FaultProxy.around(cluster.configuration) as proxy:
        if at_start:
            proxy.fail(resource, methods=methods)
        async with _controller(cluster, proxy) as ctl:
            if not at_start:
                await _until(_synced(ctl), "the controller's cache to sync")
                proxy.fail(resource, methods=methods)
            await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER,
                                                 message="worker exited (exitcode: 1)")
            await asyncio.sleep(OUTAGE_SECONDS)
            during = await _events(cluster, "KcoverRestartedWorkload")
            assert proxy.failed[resource] > 0, "the outage was real"
            proxy.heal()

            async def restarted() -> list[Obj]:
                return [e for e in await _events(cluster, "KcoverRestartedWorkload")
                        if e["involvedObject"].get("uid") == uid]
            await _until(restarted, "the restart once the outage ended")
            await asyncio.sleep(SETTLE)  # room for a second restart to show
            done = await restarted()
            pods = await _pods(cluster)
    assert during == [], "nothing was restarted during the outage"
    assert len(done) == 1, [e["message"] for e in done]
    assert not {p["metadata"]["uid"] for p in pods} & old, "the job's pods were taken away and recreated"


async def test_an_outage_longer_than_retry_seconds_ends_in_recovery_failed_and_restarts_nothing(
        cluster: Cluster) -> None:
    job = await _job(cluster, f"out-{secrets.token_hex(3)}")
    old = {p["metadata"]["uid"] for p in await _pods(cluster)}
    async with cluster.harness.playing(), FaultProxy.around(cluster.configuration) as proxy, \
            _controller(cluster, proxy, retry_seconds=5.0) as ctl:
        await _until(_synced(ctl), "the controller's cache to sync")
        proxy.fail("ledgerentries", methods=WRITES)
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER,
                                             message="worker exited (exitcode: 1)")

        async def failed() -> list[Obj]:
            return await _events(cluster, "KcoverRecoveryFailed")
        (event,) = await _until(failed, "KcoverRecoveryFailed", within=OUTAGE_SECONDS)
        given_up = ctl.metrics_.registry.get_sample_value("kcover_faults_given_up_total")  # type: ignore[attr-defined]
        proxy.heal()
        await asyncio.sleep(SETTLE * 2)  # the fault was given up: nothing acts on it after the outage
        restarts = await _events(cluster, "KcoverRestartedWorkload")
        pods = await _pods(cluster)
    assert "could not act on ContainerError" in event["message"]
    assert event["involvedObject"]["name"] == "train-worker-1"
    assert given_up == 1
    assert restarts == []
    assert {p["metadata"]["uid"] for p in pods} == old, "no pod was taken away"
    assert job["metadata"]["uid"]


def _synced(ctl: running.Controller) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        states = ctl.supervisor.health()
        return ctl.cache.synced and bool(states) and all(s == "running" for s in states.values())
    return probe
