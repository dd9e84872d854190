"""The controller's cluster cache: kcover's one cluster model, kept by reflectors and observable.

Owns one reflector per watched collection (pods, nodes, Events, DRA ResourceSlices, each configured
workload kind, and for the controller Namespaces and the controls ConfigMap), which keep the
`indexing.ClusterIndex` it is (the records, their indexes, the reads of `recovery.planinputs.Snapshot`, change
subscriptions), readiness (every reflector finished its first list, and none has kept failing since:
`Reflector.synced`), and building one from the settings. Owner resolution and opt-in are `ownership`'s,
"is this a GPU node" is `gpus`'.

ResourceSlices are read in the `resource.k8s.io` version the server serves (`capabilities`), and not
at all where it serves none (the reflector counts as synced, empty, and asks again later).

`ClusterCache.offline(objects)` builds one from raw API objects without I/O, through the reflectors'
own list path (`Reflector.load`): tests and benchmarks read the product's model, never a copy.

It does not write to the API and keeps no raw objects. Reflectors retry on their own (see
`watching.py`); a kind whose CRD or API group is missing is logged once and counts as synced (empty).
An object that cannot be decoded is left out and counted in the client's `skips` (`skips`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog

from kcover import kinds
from kcover import settings as settings_
from kcover.aio import waiting
from kcover.kube import capabilities, decoding, gpus, indexing, projecting, watching
from kcover.kube import client as client_
from kcover.kube import projections as proj

log = structlog.get_logger()


WorkloadKind = kinds.WorkloadKind
WORKLOAD_KINDS: tuple[WorkloadKind, ...] = kinds.KINDS
"""Every workload kind kcover restarts (`kinds.KINDS`)."""


def _typed(project: Callable[[Mapping[str, Any]], Any], wk: WorkloadKind) -> Callable[[Mapping[str, Any]], Any]:
    """`project`, given the kind and apiVersion a real kube-apiserver leaves out of a built-in kind's list
    items (batch/v1 Jobs listed carry neither; watch events and custom resources do)."""
    def typed(raw: Mapping[str, Any]) -> Any:
        if not raw.get("kind"):
            raw = {**raw, "kind": wk.kind, "apiVersion": wk.api_version}
        return project(raw)
    return typed


DEFAULT_WORKLOAD_KINDS: tuple[str, ...] = kinds.DEFAULT_KEYS

RESOURCE_SLICES_PATH = capabilities.RESOURCE_SLICES.path("resource.k8s.io/v1")
"""Where ResourceSlices are read until discovery answers (`capabilities.locator`)."""


def workload_kinds(keys: Iterable[str]) -> tuple[WorkloadKind, ...]:
    """Resolve `plural.group` keys against the known kinds; unknown keys raise ValueError."""
    return tuple(kinds.by_key(key) for key in keys)


class ClusterCache(indexing.ClusterIndex):
    """Slim, indexed, observable copies of the cluster objects kcover reads."""

    def __init__(self, kube: client_.KubeClient | None, *, workload_kinds: Sequence[WorkloadKind] = WORKLOAD_KINDS,
                 watch_events: bool = True, options: watching.ReflectorOptions | None = None,
                 freeze_gc: bool = False, gpu_rule: gpus.GpuRule = gpus.DEFAULT,
                 controls: tuple[str, str] | None = None) -> None:
        """`kube` None: an offline cache, filled only through `load()` (see `offline()`). `controls`:
        (namespace, name) of the controls ConfigMap to watch (the recovery's pause and reset requests);
        None watches none (the agent's cache, tools)."""
        super().__init__(gpu_rule=gpu_rule, controls=controls)
        self.freeze_gc = freeze_gc
        """After the first full sync, `gc.freeze()` the process: the cyclic GC then never rescans the
        cached objects (they hold no cycles), which at 150,000 pods removes pauses of a second that
        otherwise stall watch delivery. A process-wide effect: the controller opts in by setting."""
        self._skips = kube.skips if kube is not None else decoding.Skips()
        self.reflectors: list[watching.Reflector[Any]] = []
        self._routes: dict[tuple[str, str], watching.Reflector[Any]] = {}
        """(group, kind) -> the reflector of that collection, for `load()`."""
        self.pod_reflector = self._reflect(kube, "/api/v1/pods", projecting.pod, self._on_pod, "pods",
                                           ("", "Pod"), options)
        self.node_reflector = self._reflect(kube, "/api/v1/nodes", projecting.node, self._on_node, "nodes",
                                            ("", "Node"), options)
        if watch_events:
            self._reflect(kube, "/api/v1/events", projecting.recovery_event, self._on_event, "events",
                          ("", "Event"), options)
        if gpu_rule.dra_drivers:
            self._reflect(kube, RESOURCE_SLICES_PATH, projecting.resource_slice, self._on_slice, "resourceslices",
                          ("resource.k8s.io", "ResourceSlice"), options,
                          locate=capabilities.locator(kube, capabilities.RESOURCE_SLICES) if kube else None)
        for wk in workload_kinds:
            self._reflect(kube, wk.path, _typed(projecting.workload, wk), self._on_workload, wk.key,
                          (wk.group, wk.kind), options)
        if controls is not None:
            self._reflect(kube, "/api/v1/namespaces", projecting.namespace, self._on_namespace, "namespaces",
                          ("", "Namespace"), options)
            self._reflect(kube, f"/api/v1/namespaces/{controls[0]}/configmaps", projecting.config_map,
                          self._on_controls, "controls", ("", "ConfigMap"), options,
                          query={"fieldSelector": f"metadata.name={controls[1]}"})

    def _reflect(self, kube: client_.KubeClient | None, path: str, project: Callable[[Mapping[str, Any]], Any],
                 sink: Callable[[Any, Any], None], name: str, route: tuple[str, str],
                 options: watching.ReflectorOptions | None,
                 query: Mapping[str, str] | None = None,
                 locate: Callable[[], Awaitable[str | None]] | None = None) -> watching.Reflector[Any]:
        reflector: watching.Reflector[Any] = watching.Reflector(kube, path, project, sink=sink, name=name,
                                                                options=options, query=query, kind=route[1],
                                                                locate=locate)
        self.reflectors.append(reflector)
        self._routes[route] = reflector
        return reflector

    @classmethod
    def from_settings(cls, kube: client_.KubeClient, kube_settings: settings_.KubeSettings, *,
                      controls: tuple[str, str] | None = None) -> ClusterCache:
        s = kube_settings
        options = watching.ReflectorOptions(
            page_size=s.page_size, watch_timeout_seconds=s.watch_timeout_seconds,
            inactivity_timeout_seconds=s.inactivity_timeout_seconds,
            backoff_initial_seconds=s.backoff_initial_seconds, backoff_max_seconds=s.backoff_max_seconds,
            missing_retry_seconds=s.missing_kind_retry_seconds,
            request_timeout_seconds=max(s.request_timeout_seconds, 60.0), stall_seconds=s.stall_seconds,
            pause_gc=s.gc_pause_during_lists)
        return cls(kube, workload_kinds=workload_kinds(s.workload_kinds), watch_events=s.watch_events,
                   options=options, freeze_gc=s.gc_freeze_after_sync,
                   gpu_rule=gpus.GpuRule.of(s.gpu_resources, s.gpu_dra_drivers), controls=controls)

    @classmethod
    def offline(cls, objects: Iterable[Mapping[str, Any]] = (), *,
                workload_kinds: Sequence[WorkloadKind] = WORKLOAD_KINDS,
                gpu_rule: gpus.GpuRule = gpus.DEFAULT,
                controls: tuple[str, str] | None = ("kcover-system", "kcover-controls")) -> ClusterCache:
        """A synced cache holding `objects` (raw API dicts), built without I/O: see `load()`."""
        cache = cls(None, workload_kinds=workload_kinds, gpu_rule=gpu_rule, controls=controls)
        cache.load(objects)
        return cache

    @property
    def skips(self) -> decoding.Skips:
        """Objects the cache's client left out because they could not be decoded (empty offline)."""
        return self._skips

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace every collection's contents with `objects`, as a re-list would (`Reflector.load`):
        subscribers see only the differences. Each object needs `kind` (and `apiVersion` for other
        groups than core); an object of a kind this cache does not keep raises ValueError."""
        grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {route: [] for route in self._routes}
        for obj in objects:
            route = (proj.group_of(str(obj.get("apiVersion") or "v1")), str(obj.get("kind") or ""))
            if route not in grouped:
                raise ValueError(f"this cache keeps no {route[1] or 'kind-less object'} ({obj.get('apiVersion')})")
            grouped[route].append(obj)
        for route, reflector in self._routes.items():
            reflector.load(grouped[route])

    # --------------------------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run every reflector until `stop` is set."""
        if self.freeze_gc and any(r.options.pause_gc for r in self.reflectors):
            # the first lists' objects go straight from the paused collector to the frozen generation
            watching.LISTING.then(_collect_and_freeze)
        async with asyncio.TaskGroup() as tg:
            for reflector in self.reflectors:
                tg.create_task(reflector.run(stop), name=f"reflector:{reflector.name}")
            started = asyncio.get_running_loop().time()
            if await self.wait_synced(stop):
                log.info("cache_synced", pods=len(self.pods), nodes=len(self.nodes), workloads=len(self.workloads),
                         seconds=round(asyncio.get_running_loop().time() - started, 3))
                if self.freeze_gc:
                    _collect_and_freeze()  # what the lists' end left (all of it where the collector was not paused)

    @property
    def synced(self) -> bool:
        """Every reflector is in step now (listed, and not failing for longer than its `stall_seconds`)."""
        return all(r.synced.is_set() for r in self.reflectors)

    def stalled(self) -> list[watching.Reflector[Any]]:
        """The reflectors that listed once and have kept failing since for longer than `stall_seconds`."""
        return [r for r in self.reflectors if r.listed.is_set() and not r.synced.is_set()]

    def readiness(self) -> tuple[bool, str]:
        """The `/readyz` check of the cache: ready when every reflector is in step; the text names those
        still waiting for their first list and those that stopped syncing, with how long and why."""
        waiting = [r.name for r in self.reflectors if not r.listed.is_set()]
        now = asyncio.get_running_loop().time() if self.reflectors and self.stalled() else 0.0
        stalled = [f"{r.name} (failing for {now - (r.failing_since or now):.0f} s: {r.last_error})"
                   for r in self.stalled()]
        parts = ([f"waiting for {', '.join(waiting)}"] if waiting else []) + (
            [f"stopped syncing: {'; '.join(stalled)}"] if stalled else [])
        return not parts, "; ".join(parts) or "synced"

    async def wait_synced(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until every reflector listed once; False if `stop` was set first. (It does not wait for a
        reflector that stalled since: what is cached stays usable while it retries.)"""
        for reflector in self.reflectors:
            if stop is None:
                await reflector.listed.wait()
                continue
            await waiting.first_of(reflector.listed, stop)
            if not reflector.listed.is_set():
                return False
        return True


def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()
