"""The controller's recovery, built as the product builds it, against the simulated cluster in-process.

`async with rig(objects, overrides) as r:` starts a `SimServer(listen=False)` (no socket), seeds it with
raw objects, runs a real `ClusterCache` over an in-process `KubeClient` and builds the engine with
`controller.recovering.build(EngineDeps(...))` (gateway, dry-run gateway, ledger, coordinator and hooks
as in production). Under `@pytest.mark.looptime` every wait is virtual: `await r.settle()` lets the
watches deliver what the server changed. Enter it inside the test (looptime activates for the test
body, not its fixtures).

`r.handle(event)` hands one event to the engine as the controller does while leading; `r.tick()` runs
the leader's periodic pass; `r.events(reason)`, `r.requests` and `r.store` read what the API server holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcover import metrics, model, settings
from kcover.aio import clock as clock_
from kcover.controller import recovering
from kcover.kube import caching, retrying, watching
from kcover.kube import client as client_
from kcover.sim import server as simserver
from kcover.sim import store as stores

START = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
FAST = watching.ReflectorOptions(watch_timeout_seconds=300, inactivity_timeout_seconds=600,
                                 backoff_initial_seconds=0.05, backoff_max_seconds=0.5, missing_retry_seconds=1.0)
KEYS = {"Pod": "pods", "Node": "nodes", "Namespace": "namespaces", "ConfigMap": "configmaps",
        "PyTorchJob": "pytorchjobs.kubeflow.org", "TFJob": "tfjobs.kubeflow.org", "JobSet": "jobsets.jobset.x-k8s.io",
        "TrainJob": "trainjobs.trainer.kubeflow.org", "LeaderWorkerSet": "leaderworkersets.leaderworkerset.x-k8s.io",
        "ResourceSlice": "resourceslices.resource.k8s.io", "PodDisruptionBudget": "poddisruptionbudgets.policy",
        "LedgerEntry": "ledgerentries.kcover.io"}


def key_of(obj: Mapping[str, Any]) -> str:
    kind, api_version = obj["kind"], obj.get("apiVersion", "v1")
    if kind == "Job":
        return "jobs.batch.volcano.sh" if api_version.startswith("batch.volcano.sh") else "jobs.batch"
    return KEYS[kind]


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class Rig:
    srv: simserver.SimServer
    kube: client_.KubeClient
    cache: caching.ClusterCache
    leader: recovering.LeaderEngine
    clock: clock_.FakeClock
    metrics: metrics.Metrics
    settings: settings.Settings
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def store(self) -> stores.Store:
        return self.srv.store

    @property
    def requests(self) -> dict[str, int]:
        return self.srv.request_counts

    def writes(self) -> dict[str, int]:
        return {k: v for k, v in self.srv.request_counts.items()
                if k.split(" ")[0] in ("CREATE", "UPDATE", "PATCH", "DELETE", "DELETECOLLECTION")}

    async def settle(self, seconds: float = 0.2) -> None:
        """Let watches deliver what the server changed (virtual seconds under looptime)."""
        await asyncio.sleep(seconds)

    async def handle(self, *events: model.CollectorEvent) -> None:
        await self.leader.handle(list(events))
        await self.settle()

    async def tick(self) -> None:
        await self.leader.resume()
        await self.settle()

    async def records(self) -> None:
        """Write the Recovery resources noted so far (the background writer's work)."""
        await self.leader.recorder.flush()

    def events(self, reason: str = "", *, name: str = "") -> list[dict[str, Any]]:
        return [e for e in self.store.iter_objects("events")
                if (not reason or e.get("reason") == reason)
                and (not name or (e.get("involvedObject") or {}).get("name") == name)]

    def create(self, *objects: Mapping[str, Any]) -> None:
        for obj in objects:
            self.store.create(key_of(obj), dict(obj), keep_uid=True)

    @contextlib.asynccontextmanager
    async def replica(self, identity: str, *, fence: retrying.Fence | None = None, epoch: int = 2,
                      overrides: Mapping[str, Any] | None = None,
                      retry: retrying.Policy | None = None) -> AsyncIterator[recovering.LeaderEngine]:
        """Another replica's recovery over the same server: its own client, cache, ledger and engine."""
        cfg = settings_of(_merge(dict(self._overrides), overrides or {}))
        rs = cfg.recovery
        kube = self.srv.client(retry=retry or retrying.policy_from(cfg.kube))
        cache = caching.ClusterCache(kube, workload_kinds=caching.workload_kinds(cfg.kube.workload_kinds),
                                     watch_events=False, options=FAST, controls=(rs.ledger_namespace, rs.controls_name))
        engine = recovering.build(recovering.EngineDeps(
            settings=cfg, client=kube, cache=cache, metrics=metrics.Metrics(), clock=self.clock,
            is_leader=lambda: fence is None or fence.write_seconds_left() > 0, epoch=lambda: epoch,
            identity=identity, fence=fence))
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop), name=f"rig:cache:{identity}")
        try:
            await cache.wait_synced()
            yield engine
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await kube.close()

    def pod_uids(self, namespace: str = "ml") -> set[str]:
        return {p["metadata"]["uid"] for p in self.store.iter_objects("pods")
                if p["metadata"].get("namespace") == namespace and not p["metadata"].get("deletionTimestamp")}


def settings_of(overrides: Mapping[str, Any] | None = None) -> settings.Settings:
    base: dict[str, Any] = {"lease": {"enabled": False}, "kube": {"watch_events": False},
                            "recovery": {"save_logs": {"enabled": False}}}
    return settings.Settings.model_validate(_merge(base, overrides or {}))


@contextlib.asynccontextmanager
async def rig(objects: Sequence[Mapping[str, Any]] = (), *, overrides: Mapping[str, Any] | None = None,
              listen: bool = False) -> AsyncIterator[Rig]:
    """The recovery engine over an in-process simulated cluster seeded with `objects` (see the module docstring)."""
    clock = clock_.FakeClock(START, follow_loop=True)
    cfg = settings_of(overrides)
    rs = cfg.recovery
    async with simserver.SimServer(listen=listen, clock=clock) as srv:
        names = {obj["metadata"].get("namespace") for obj in objects} - {None, ""}
        for namespace in sorted(names - {"default", "kube-system", "kcover-system"}):
            if not any(o["kind"] == "Namespace" and o["metadata"]["name"] == namespace for o in objects):
                srv.store.create("namespaces", {"metadata": {"name": namespace}})
        for obj in objects:
            srv.store.create(key_of(obj), dict(obj), keep_uid=True)
        kube = srv.client(retry=retrying.policy_from(cfg.kube))
        cache = caching.ClusterCache(kube, workload_kinds=caching.workload_kinds(cfg.kube.workload_kinds),
                                     watch_events=False, options=FAST,
                                     controls=(rs.ledger_namespace, rs.controls_name))
        mets = metrics.Metrics()
        leader = recovering.build(recovering.EngineDeps(
            settings=cfg, client=kube, cache=cache, metrics=mets, clock=clock, is_leader=lambda: True,
            epoch=lambda: 1, identity="kcover-test"))
        r = Rig(srv, kube, cache, leader, clock, mets, cfg, _overrides=dict(overrides or {}))
        task = asyncio.create_task(cache.run(r.stop), name="rig:cache")
        try:
            await cache.wait_synced()
            yield r
        finally:
            r.stop.set()
            await asyncio.wait_for(task, 10)
            await kube.close()
