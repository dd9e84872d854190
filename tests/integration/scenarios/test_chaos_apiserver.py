"""Chaos on a real kube-apiserver: faults while the API server process is stopped and started under running
controllers mid-recovery and etcd is compacted (watches then get 410 Expired and re-list).

Counts as `kcover.sim.chaos` does, from what the cluster holds: a fault is injected only into a job at rest
(both pods Running, none failed, its last restart older than the cooldown, no fault pending on it); a
restart is seen when none of the job's pods remains (sampled continuously). A fault is recovered when its
job restarted after it, refused when kcover left a KcoverRecoverySkipped or KcoverRecoveryFailed Event on
the job, and lost otherwise; a restart with no fault waiting for it is a duplicate. The test asserts 0 lost
and 0 duplicated.

It runs its own control plane (the session's is shared with other tests and is not stopped). Requests
are not throttled here: the sim's chaos run covers 429s and 500s; this one covers what only the real
server does (its own restart, an etcd compaction, real watch semantics).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import backends
import pytest
import test_recovery_scenarios as base
from harness import playing
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from kcover import errors
from kcover.aio import clock as clock_
from kcover.kube import client as client_

FAULTS = 8
JOBS = 3
COOLDOWN = 4.0
RESTART_APISERVER_AT = (2, 6)
"""Faults after which kube-apiserver is stopped (for 2 s) while the leader is restarting the job."""
COMPACT_AT = (4,)
RESOLVE = 60.0


@pytest.fixture
def own_controlplane() -> Any:
    bin_dir = backends.controlplane_binaries()
    if bin_dir is None or "apiserver" not in backends.selected_backends():
        if backends.in_ci():
            pytest.fail("the real-apiserver chaos test needs kube-apiserver and etcd (KCOVER_CONTROLPLANE_BIN)")
        pytest.skip("kube-apiserver backend not selected or not built (KCOVER_CONTROLPLANE_BIN)")
    module = backends._controlplane_module()
    with module.ControlPlane(bin_dir=bin_dir) as cp:
        yield cp


class Stage:
    """What the scenario helpers of test_recovery_scenarios need of a backend (`cluster`)."""

    def __init__(self, configuration: Any, client: client_.KubeClient, namespace: str) -> None:
        self.configuration = configuration
        self.client = client
        self.namespace = namespace
        self.sim = None
        self.harness = playing.Harness(client, namespace=namespace)

    def new_client(self) -> client_.KubeClient:
        return client_.from_configuration(self.configuration, request_timeout=10.0)


async def _play(stage: Stage, stop: asyncio.Event) -> None:
    """Kubelet and operator: finish deletions, recreate pods, run them; riding out the API server's absence."""
    h = stage.harness
    while not stop.is_set():
        with contextlib.suppress(errors.KubeError, OSError, TimeoutError):
            await h.finish_deletions()
            await h.reconcile_jobs()
            listed = await stage.client.request("GET", f"/api/v1/namespaces/{stage.namespace}/pods")
            for pod in listed.get("items") or []:
                if (pod.get("status") or {}).get("phase") != "Running" and not pod["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(errors.NotFoundError, errors.ConflictError):
                        await h.run_pod(stage.namespace, pod["metadata"]["name"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


class Ledger:
    """Per job, its pods' generations as sampled, and the faults injected."""

    def __init__(self, jobs: list[str]) -> None:
        self.base: dict[str, set[str]] = {j: set() for j in jobs}
        self.restarts: dict[str, list[float]] = {j: [] for j in jobs}
        self.pods: dict[str, list[dict[str, Any]]] = {j: [] for j in jobs}
        self.faults: list[dict[str, Any]] = []

    def sample(self, pods: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for job in self.base:
            mine = [p for p in pods if p["metadata"].get("labels", {}).get(base.JOB_NAME) == job]
            self.pods[job] = mine
            live = {str(p["metadata"]["uid"]) for p in mine if not p["metadata"].get("deletionTimestamp")}
            if not self.base[job]:
                self.base[job] = live
            elif live and not (live & self.base[job]):
                self.restarts[job].append(now)
                self.base[job] = live
            elif live > self.base[job]:
                self.base[job] = live

    def at_rest(self, job: str) -> bool:
        pods = self.pods[job]
        restarts = self.restarts[job]
        return (len(pods) == 2
                and all((p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                        and not any("terminated" in (s.get("state") or {}) or s.get("restartCount")
                                    for s in (p.get("status") or {}).get("containerStatuses") or [])
                        for p in pods)
                and (not restarts or time.monotonic() - restarts[-1] > COOLDOWN + 0.5)
                and not any(f["job"] == job and not f["outcome"] for f in self.faults)
                and {str(p["metadata"]["uid"]) for p in pods} == self.base[job])


async def _sampler(stage: Stage, ledger: Ledger, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(errors.KubeError, OSError, TimeoutError):
            listed = await stage.client.request("GET", f"/api/v1/namespaces/{stage.namespace}/pods")
            ledger.sample(list(listed.get("items") or []))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


@contextlib.asynccontextmanager
async def _background(stage: Stage, ledger: Ledger) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_play(stage, stop), name="chaos:play"),
             asyncio.create_task(_sampler(stage, ledger, stop), name="chaos:sample")]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait(tasks)
        for task in tasks:
            task.result()


async def _refused(stage: Stage, job_uid: str, after: str) -> bool:
    with contextlib.suppress(errors.KubeError, OSError, TimeoutError):
        events = await base._events(stage)  # type: ignore[arg-type]
        return any(e.get("reason") in ("KcoverRecoverySkipped", "KcoverRecoveryFailed")
                   and e["involvedObject"].get("uid") == job_uid
                   and (e.get("eventTime") or e.get("lastTimestamp") or "") >= after for e in events)
    return False


def _restarting(replicas: list[Any]) -> bool:
    """A replica's engine has a restart in flight (planned, its deletes not finished)."""
    return any(r.controller.engine is not None and r.controller.engine.inner.in_flight_restarts for r in replicas)


async def test_chaos_on_a_real_apiserver_loses_nothing_and_duplicates_nothing(own_controlplane: Any,
                                                                               tmp_path: Path) -> None:
    cp = own_controlplane
    rng = random.Random(15)
    configuration = k8s_client.Configuration()
    await k8s_config.load_kube_config(config_file=cp.kubeconfig_path, client_configuration=configuration)
    async with client_.from_configuration(configuration, request_timeout=10.0) as kube:
        ns = f"chaos-{secrets.token_hex(3)}"
        await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": ns}})
        stage = Stage(configuration, kube, ns)
        names = [f"train-{i}" for i in range(JOBS)]
        uids: dict[str, str] = {}
        for i, name in enumerate(names):
            node = f"chaos-{secrets.token_hex(3)}-{i}"
            await base._node(kube, node)
            job = await base._job(stage, name, node)  # type: ignore[arg-type]
            uids[name] = job["metadata"]["uid"]
        ledger = Ledger(names)
        tally = {"apiserver_restarts": 0, "compactions": 0, "mid_recovery": 0}
        async with _background(stage, ledger), base._controllers(  # type: ignore[arg-type]
                stage, tmp_path, ("a", "b"), workload_cooldown_seconds=COOLDOWN, max_restarts_per_window=10_000) as replicas:
            n = 0
            deadline = time.monotonic() + 240
            while n < FAULTS and time.monotonic() < deadline:
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                for fault in ledger.faults:
                    if not fault["outcome"] and any(t > fault["at"] for t in ledger.restarts[fault["job"]]):
                        fault["outcome"] = "recovered"
                ready = [j for j in names if ledger.at_rest(j)]
                if not ready:
                    continue
                job = rng.choice(ready)
                pod = rng.choice(ledger.pods[job])["metadata"]["name"]
                ledger.faults.append({"job": job, "pod": pod, "at": time.monotonic(), "outcome": "",
                                      "wall": clock_.rfc3339(clock_.utcnow())})
                await stage.harness.fail_container(ns, pod, base.CONTAINER, message="chaos: worker exited")
                n += 1
                if n in RESTART_APISERVER_AT:
                    # stop the API server while the leader is restarting the job (its restart in flight)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(3.0):
                            while not _restarting(replicas):  # noqa: ASYNC110  (polling the engine)
                                await asyncio.sleep(0.005)
                            tally["mid_recovery"] += 1
                    await asyncio.to_thread(cp.restart_apiserver, 2.0)
                    tally["apiserver_restarts"] += 1
                if n in COMPACT_AT:
                    await asyncio.to_thread(cp.compact)
                    tally["compactions"] += 1
            assert n == FAULTS, f"only {n} faults injected: jobs never came back to rest"
            resolve_by = time.monotonic() + RESOLVE
            while time.monotonic() < resolve_by:
                for fault in ledger.faults:
                    if fault["outcome"]:
                        continue
                    if any(t > fault["at"] for t in ledger.restarts[fault["job"]]):
                        fault["outcome"] = "recovered"
                    elif await _refused(stage, uids[fault["job"]], fault["wall"]):
                        fault["outcome"] = "refused"
                if all(f["outcome"] for f in ledger.faults):
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(2 * COOLDOWN)  # room for a second restart of any fault to show
        lost = [f for f in ledger.faults if not f["outcome"]]
        duplicates = []
        for job, times in ledger.restarts.items():
            injected = sorted(f["at"] for f in ledger.faults if f["job"] == job)
            previous = -1e9
            for at in times:
                if not [t for t in injected if previous < t < at]:
                    duplicates.append((job, round(at - previous, 1)))
                previous = at
        recovered = sum(1 for f in ledger.faults if f["outcome"] == "recovered")
        print(f"chaos on kube-apiserver: {n} faults, {recovered} recovered, "
              f"{sum(1 for f in ledger.faults if f['outcome'] == 'refused')} refused, {len(lost)} lost, "
              f"{len(duplicates)} duplicates; {tally}")
        assert tally["apiserver_restarts"] == len(RESTART_APISERVER_AT)
        assert tally["mid_recovery"] >= 1, "the API server went down at least once with a restart in flight"
        assert tally["compactions"] == len(COMPACT_AT)
        assert lost == [], lost
        assert duplicates == [], duplicates
