"""The reflector against the simulated API server: list, watch, re-list, throttling, pagination.

What is asserted is what a consumer of the store sees: every change delivered exactly once, in order,
and a store equal to what the API server holds, whatever the connection did in between. Each test runs
twice: over loopback HTTP in real time, and through the in-process front on virtual time (looptime),
where every wait is exact (`[inprocess]`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kcover.kube import client, projecting, watching
from kcover.kube import projections as proj

simserver = pytest.importorskip("kcover.sim.server")  # lands with the simulated cluster

FAST = watching.ReflectorOptions(page_size=2, watch_timeout_seconds=30, inactivity_timeout_seconds=30,
                                 backoff_initial_seconds=0.05, backoff_max_seconds=0.2, missing_retry_seconds=0.2)


@pytest.fixture(params=["http", pytest.param("inprocess", marks=pytest.mark.looptime)])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, client.KubeClient]]:
    inprocess = request.param == "inprocess"
    async with simserver.SimServer(listen=not inprocess) as srv:
        kube = srv.client() if inprocess else client.from_configuration(srv.kube_configuration())
        try:
            yield srv, kube
        finally:
            await kube.close()


def raw_pod(name: str, *, node: str = "n1", restarts: int = 0) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "x"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "restartCount": restarts}]}}


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str, str]] = []

    def __call__(self, old: proj.Pod | None, new: proj.Pod | None) -> None:
        kind = "ADDED" if old is None else "DELETED" if new is None else "MODIFIED"
        obj = new if new is not None else old
        assert obj is not None
        self.changes.append((kind, obj.name, obj.rv))


async def until(predicate: Any, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def server_pods(srv: Any) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in srv.store.iter_objects("pods")}


def store_pods(reflector: watching.Reflector[proj.Pod]) -> dict[str, str]:
    return {p.name: p.rv for p in reflector.store.values()}


async def start(kube: client.KubeClient, rec: Recorder, options: watching.ReflectorOptions = FAST,
                path: str = "/api/v1/pods") -> tuple[watching.Reflector[proj.Pod], asyncio.Event, asyncio.Task[None]]:
    reflector = watching.Reflector(kube, path, projecting.pod, sink=rec, name="pods", options=options)
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop), name="reflector")
    await asyncio.wait_for(reflector.synced.wait(), 10)
    return reflector, stop, task


async def finish(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_lists_paginated_then_watches_every_change_once(served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    for i in range(5):
        srv.store.create("pods", raw_pod(f"p{i}"))
    rec = Recorder()
    reflector, stop, task = await start(kube, rec)
    try:
        assert kube.request_counts["LIST pods"] == 3  # 5 pods, pages of 2
        assert sorted(c[1] for c in rec.changes) == [f"p{i}" for i in range(5)]
        srv.store.create("pods", raw_pod("new"))
        srv.store.mutate("pods", "default", "p0", lambda o: o["status"].update(phase="Failed"))
        srv.store.delete("pods", "default", "p1", grace_seconds=0)
        await until(lambda: len(rec.changes) == 8)
        assert [c[:2] for c in rec.changes[5:]] == [("ADDED", "new"), ("MODIFIED", "p0"), ("DELETED", "p1")]
        assert store_pods(reflector) == server_pods(srv)
        assert reflector.store[next(u for u, p in reflector.store.items() if p.name == "p0")].phase == "Failed"
    finally:
        await finish(stop, task)


async def test_forced_410_relists_without_missing_or_repeating_changes(served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    for i in range(4):
        srv.store.create("pods", raw_pod(f"p{i}"))
    rec = Recorder()
    reflector, stop, task = await start(kube, rec)
    try:
        await until(lambda: kube.request_counts["WATCH pods"] == 1)
        await asyncio.sleep(0.1)
        srv.faults.expire_next_watch("pods")
        srv.faults.drop_watches("pods")
        # changes the dropped watch never carries: only the re-list can find them
        srv.store.mutate("pods", "default", "p0", lambda o: o["status"].update(phase="Failed"))
        srv.store.delete("pods", "default", "p1", grace_seconds=0)
        srv.store.create("pods", raw_pod("p9"))
        await until(lambda: reflector.lists == 2 and store_pods(reflector) == server_pods(srv))
        await asyncio.sleep(0.2)
        after = sorted(c[:2] for c in rec.changes[4:])
        assert after == [("ADDED", "p9"), ("DELETED", "p1"), ("MODIFIED", "p0")]
        srv.store.create("pods", raw_pod("p10"))  # and the watch after the re-list works
        await until(lambda: any(c[1] == "p10" for c in rec.changes))
        assert len(rec.changes) == 8
    finally:
        await finish(stop, task)


async def test_dropped_watch_resumes_from_its_resource_version(served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    srv.store.create("pods", raw_pod("p0"))
    rec = Recorder()
    reflector, stop, task = await start(kube, rec)
    try:
        await until(lambda: kube.request_counts["WATCH pods"] == 1)
        await asyncio.sleep(0.1)
        srv.faults.drop_watches("pods")
        srv.store.create("pods", raw_pod("p1"))
        srv.store.mutate("pods", "default", "p0", lambda o: o["status"].update(phase="Failed"))
        await until(lambda: len(rec.changes) >= 3)
        await asyncio.sleep(0.2)
        assert [c[:2] for c in rec.changes] == [("ADDED", "p0"), ("ADDED", "p1"), ("MODIFIED", "p0")]
        assert reflector.lists == 1
        assert kube.request_counts["WATCH pods"] >= 2
    finally:
        await finish(stop, task)


async def test_plain_text_429_retry_after_is_honoured(served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    srv.store.create("pods", raw_pod("p0"))
    srv.faults.throttle_rate = 1.0
    srv.faults.throttle_style = "text"
    srv.faults.retry_after_seconds = 1
    rec = Recorder()
    reflector = watching.Reflector(kube, "/api/v1/pods", projecting.pod, sink=rec, name="pods", options=FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop), name="reflector")
    try:
        await until(lambda: kube.request_counts["LIST pods"] == 1)
        await asyncio.sleep(0.5)
        assert kube.request_counts["LIST pods"] == 1  # waited as told, not the 0.05 s backoff
        srv.faults.throttle_rate = 0.0
        await asyncio.wait_for(reflector.synced.wait(), 5)
        assert kube.request_counts["LIST pods"] == 2
        assert store_pods(reflector) == server_pods(srv)
    finally:
        await finish(stop, task)


async def test_missing_collection_counts_as_synced_and_is_retried(served: tuple[Any, client.KubeClient]) -> None:
    _, kube = served
    rec = Recorder()
    reflector, stop, task = await start(kube, rec, path="/apis/example.com/v1/widgets")
    try:
        assert reflector.missing
        assert reflector.store == {}
        await until(lambda: kube.request_counts["LIST widgets"] >= 2)
    finally:
        await finish(stop, task)


async def test_inactive_watch_is_restarted(served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    srv.store.create("pods", raw_pod("p0"))
    rec = Recorder()
    options = watching.ReflectorOptions(watch_timeout_seconds=30, inactivity_timeout_seconds=0.3,
                                        backoff_initial_seconds=0.05)
    reflector, stop, task = await start(kube, rec, options)
    try:
        await until(lambda: reflector.watches >= 3)
        assert reflector.lists == 1
        srv.store.create("pods", raw_pod("p1"))
        await until(lambda: len(rec.changes) == 2)
    finally:
        await finish(stop, task)


class Locations:
    """A reflector's `locate`: answers the paths it is given, one per call, the last one from then on."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self) -> str | None:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


async def test_an_unserved_collection_is_never_requested_yet_counts_as_synced(
        served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    srv.store.create("pods", raw_pod("p0"))
    locate = Locations(None)
    rec = Recorder()
    reflector = watching.Reflector(kube, "/api/v1/pods", projecting.pod, sink=rec, name="pods", options=FAST,
                                   locate=locate)
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop), name="reflector")
    try:
        await asyncio.wait_for(reflector.synced.wait(), 10)
        await until(lambda: locate.calls >= 3)  # asked again every missing_retry_seconds
        assert reflector.unserved
        assert reflector.missing
        assert reflector.store == {}
        assert rec.changes == []
        assert kube.request_counts["LIST pods"] == 0
        assert kube.request_counts["WATCH pods"] == 0
    finally:
        await finish(stop, task)


async def test_a_collection_served_later_is_listed_at_the_path_located(
        served: tuple[Any, client.KubeClient]) -> None:
    srv, kube = served
    srv.store.create("pods", raw_pod("p0"))
    locate = Locations(None, "/api/v1/pods")  # not served at first; then served (an upgrade, a runtime-config)
    rec = Recorder()
    options = watching.ReflectorOptions(watch_timeout_seconds=30, inactivity_timeout_seconds=0.2,
                                        backoff_initial_seconds=0.05, missing_retry_seconds=0.2)
    reflector = watching.Reflector(kube, "/apis/example.com/v1/widgets", projecting.pod, sink=rec, name="pods",
                                   options=options, locate=locate)
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop), name="reflector")
    try:
        await until(lambda: rec.changes == [("ADDED", "p0", server_pods(srv)["p0"])])
        assert not reflector.unserved
        assert not reflector.missing
        assert reflector.path == "/api/v1/pods"
        srv.store.create("pods", raw_pod("p1"))
        await until(lambda: store_pods(reflector) == server_pods(srv))
        assert kube.request_counts["LIST widgets"] == 0  # the constructor's path was never used
        calls, watches = locate.calls, reflector.watches
        await until(lambda: reflector.watches >= watches + 3)  # idle watches restarted: the loop went round
        assert locate.calls == calls == 2  # found: not asked again while it is served
    finally:
        await finish(stop, task)


@pytest.mark.parametrize("pause", [True, False])
async def test_the_cyclic_gc_is_held_off_while_a_list_runs_and_only_then(served: tuple[Any, client.KubeClient],
                                                                        pause: bool) -> None:
    """The list's changes are delivered inside its pause, a watched change after it: the collector runs again
    once the list ended (and never stops where `pause_gc` is off)."""
    srv, kube = served
    for i in range(5):
        srv.store.create("pods", raw_pod(f"p{i}"))
    seen: list[tuple[str, bool]] = []
    rec = Recorder()

    def sink(old: proj.Pod | None, new: proj.Pod | None) -> None:
        rec(old, new)
        seen.append((rec.changes[-1][1], gc.isenabled()))

    assert gc.isenabled()
    reflector = watching.Reflector(kube, "/api/v1/pods", projecting.pod, sink=sink, name="pods",
                                   options=dataclasses.replace(FAST, pause_gc=pause))
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop), name="reflector")
    try:
        await asyncio.wait_for(reflector.synced.wait(), 10)
        assert gc.isenabled()
        srv.store.create("pods", raw_pod("new"))
        await until(lambda: len(seen) == 6)
        assert seen == [*((f"p{i}", not pause) for i in range(5)), ("new", True)]
        assert watching.LISTING.depth == 0
    finally:
        await finish(stop, task)


def test_a_gc_pause_counts_nested_lists_and_restores_the_state_it_found() -> None:
    pause = watching.GcPause()
    assert gc.isenabled()
    with pause.held():
        with pause.held():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the outer list still runs"
    assert gc.isenabled()
    with pytest.raises(RuntimeError), pause.held():
        raise RuntimeError("a failed page")
    assert gc.isenabled()
    assert pause.depth == 0
    gc.disable()  # someone else's choice: kept
    try:
        with pause.held():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_gc_pause_runs_its_one_shot_work_when_the_outermost_list_ends_before_the_collector_runs() -> None:
    pause = watching.GcPause()
    ran: list[bool] = []
    pause.then(lambda: ran.append(gc.isenabled()))
    with pause.held():
        with pause.held():
            pass
        assert ran == [], "an inner list's end is not the outermost's"
    assert ran == [False], "run while the collector was still held off"
    assert gc.isenabled()
    with pause.held():
        pass
    assert ran == [False], "once"

    def failing() -> None:
        raise RuntimeError("work failed")

    pause.then(failing)
    with pytest.raises(RuntimeError, match="work failed"), pause.held():
        pass
    assert gc.isenabled(), "the collector runs again whatever the work did"
