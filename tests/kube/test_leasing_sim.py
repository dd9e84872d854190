"""Leader election against a real HTTP API server (the simulated cluster): what the Lease ends up holding.

Real time with short durations (2 s leases): looptime cannot fast-forward sockets. A TCP proxy
between one elector and the server simulates a network partition for that elector alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from kcover import errors, settings
from kcover import metrics as metrics_
from kcover.kube import client as client_
from kcover.kube import leasing
from kcover.sim import server as simserver

NS = "kcover-system"
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
TIMINGS = settings.LeaseSettings(namespace=NS, name="kcover-test", lease_duration_seconds=2.0,
                                 renew_deadline_seconds=1.5, retry_period_seconds=0.2)


class Proxy:
    """Forwards TCP to the API server until `partition()`; then swallows bytes in both directions."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.partitioned = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst), name="proxy-pump")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                if not self.partitioned:
                    dst.write(data)
                    await dst.drain()
        dst.close()

    def partition(self) -> None:
        self.partitioned = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._server is not None:
            await self._server.wait_closed()


@pytest.fixture
async def cluster() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer() as srv:
        async with client_.from_configuration(srv.kube_configuration()) as kube:
            with contextlib.suppress(errors.ConflictError):
                await kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                                       "metadata": {"name": NS}})
        yield srv


@pytest.fixture
async def connect(cluster: simserver.SimServer) -> AsyncIterator[Callable[..., client_.KubeClient]]:
    clients: list[client_.KubeClient] = []

    def make(host: str | None = None) -> client_.KubeClient:
        cfg = copy.copy(cluster.kube_configuration())
        if host is not None:
            cfg.host = host
        kube = client_.from_configuration(cfg, request_timeout=5.0)
        clients.append(kube)
        return kube

    yield make
    for kube in clients:
        await kube.close()


class Replica:
    def __init__(self, kube: client_.KubeClient, identity: str, timings: settings.LeaseSettings = TIMINGS,
                 **kwargs: Any) -> None:
        self.changes: list[bool] = []
        self.metrics = metrics_.Metrics()
        self.elector = leasing.LeaderElector(kube, timings, identity=identity, metrics=self.metrics,
                                             on_change=self.changes.append, **kwargs)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.elector.run(self.stop), name=f"elector:{identity}")

    async def shutdown(self) -> None:
        self.stop.set()
        await asyncio.wait({self.task})
        if not self.task.cancelled():
            self.task.result()

    async def kill(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _lease(kube: client_.KubeClient) -> dict[str, Any]:
    lease: dict[str, Any] = await kube.request("GET", leasing.lease_path(NS, TIMINGS.name))
    return lease


async def _until(predicate: Callable[[], bool], within: float) -> float:
    started = time.monotonic()
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (polling a plain predicate)
            await asyncio.sleep(0.01)
    return time.monotonic() - started


async def _first_leader(replicas: list[Replica], within: float = 5.0) -> Replica:
    await _until(lambda: any(r.elector.is_leader() for r in replicas), within)
    leaders = [r for r in replicas if r.elector.is_leader()]
    assert len(leaders) == 1
    return leaders[0]


async def test_two_electors_elect_exactly_one_leader(connect: Callable[..., client_.KubeClient]) -> None:
    a, b = Replica(connect(), "a"), Replica(connect(), "b")
    try:
        leader = await _first_leader([a, b])
        follower = b if leader is a else a
        await asyncio.sleep(TIMINGS.lease_duration_seconds * 1.5)  # several renewals, no flapping
        assert leader.elector.is_leader()
        assert not follower.elector.is_leader()
        assert leader.changes == [True]
        assert follower.changes == []
        assert leader.metrics.is_leader._value.get() == 1
        assert follower.metrics.is_leader._value.get() == 0
        spec = (await _lease(connect()))["spec"]
        assert spec["holderIdentity"] == leader.elector.identity
        assert spec["leaseDurationSeconds"] == 2
        assert spec["leaseTransitions"] == 0
        assert MICRO.match(spec["renewTime"])
        assert MICRO.match(spec["acquireTime"])
        assert spec["renewTime"] > spec["acquireTime"]
        assert follower.elector.observed_holder == leader.elector.identity
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_released_lease_is_taken_over_at_once(connect: Callable[..., client_.KubeClient]) -> None:
    """With client-go's default timings (15/10/2 s) the successor, woken by its watch, leads within 2 s."""
    defaults = settings.LeaseSettings(namespace=NS, name="kcover-test")
    a, b = Replica(connect(), "a", defaults), Replica(connect(), "b", defaults)
    try:
        leader = await _first_leader([a, b])
        follower = b if leader is a else a
        epoch = follower.elector.leadership_epoch
        await asyncio.sleep(0.5)  # steady state: the follower's watch is open
        started = time.monotonic()
        await leader.shutdown()
        spec = (await _lease(connect()))["spec"]
        assert spec["holderIdentity"] in ("", follower.elector.identity)
        await _until(follower.elector.is_leader, 2.0)
        handover = time.monotonic() - started
        assert handover < defaults.retry_period_seconds  # not a poll: the watch saw the release
        print(f"voluntary handover: {handover:.3f} s")
        assert leader.changes == [True, False]
        assert follower.elector.leadership_epoch == epoch + 1
        spec = (await _lease(connect()))["spec"]
        assert spec["holderIdentity"] == follower.elector.identity
        assert spec["leaseTransitions"] == 1
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_killed_leader_is_replaced_within_lease_duration(connect: Callable[..., client_.KubeClient]) -> None:
    a = Replica(connect(), "a", release_on_exit=False)
    b = Replica(connect(), "b", release_on_exit=False)
    try:
        leader = await _first_leader([a, b])
        follower = b if leader is a else a
        await asyncio.sleep(0.5)
        await leader.kill()
        failover = await _until(follower.elector.is_leader,
                                TIMINGS.lease_duration_seconds + TIMINGS.retry_period_seconds * 1.2 + 0.5)
        print(f"failover after kill: {failover:.3f} s")
        assert failover > TIMINGS.lease_duration_seconds - TIMINGS.retry_period_seconds * 2  # waited for expiry
        spec = (await _lease(connect()))["spec"]
        assert spec["holderIdentity"] == follower.elector.identity
        assert spec["leaseTransitions"] == 1
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_partitioned_leader_steps_down_then_campaigns_again(
        cluster: simserver.SimServer, connect: Callable[..., client_.KubeClient]) -> None:
    url = urlsplit(cluster.kube_configuration().host)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 80)
    port = await proxy.start()
    a = Replica(connect(f"{url.scheme}://127.0.0.1:{port}"), "a")
    b: Replica | None = None
    work_started = asyncio.Event()
    work_cancelled = asyncio.Event()

    async def work() -> None:
        work_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            work_cancelled.set()
            raise

    runner = asyncio.create_task(a.elector.run_while_leading(work, a.stop), name="leader-work")
    try:
        await _first_leader([a])
        b = Replica(connect(), "b")
        await asyncio.wait_for(work_started.wait(), 1.0)
        proxy.partition()
        partitioned_at = time.monotonic()
        # writes are refused once the last renewal is older than the renew deadline, even mid-attempt
        refused = await _until(lambda: not a.elector.is_leader(), TIMINGS.renew_deadline_seconds + 0.5)
        assert refused <= TIMINGS.renew_deadline_seconds + 0.1
        await asyncio.wait_for(work_cancelled.wait(), TIMINGS.retry_period_seconds * 2 + 1.0)
        assert a.changes == [True, False]
        await _until(b.elector.is_leader, TIMINGS.lease_duration_seconds + TIMINGS.retry_period_seconds * 2 + 1)
        print(f"failover after partition: {time.monotonic() - partitioned_at:.3f} s")
        assert not a.elector.is_leader()
        spec = (await _lease(connect()))["spec"]
        assert spec["holderIdentity"] == "b"
        assert spec["leaseTransitions"] == 1
        # the network heals: a stays a follower while b renews, and takes over when b leaves
        proxy.partitioned = False
        await asyncio.sleep(TIMINGS.lease_duration_seconds)
        assert not a.elector.is_leader()
        await b.shutdown()
        await _until(a.elector.is_leader, 2.0 + TIMINGS.renew_deadline_seconds)
        assert a.elector.leadership_epoch == 2
        assert (await _lease(connect()))["spec"]["leaseTransitions"] == 2
    finally:
        await a.shutdown()
        await asyncio.wait({runner})
        if b is not None:
            await b.shutdown()
        await proxy.close()
