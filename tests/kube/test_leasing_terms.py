"""When a term begins, the last time another leader was seen: what the controller ages held faults from.

Real time with short durations (2 s leases) against the simulated API server over HTTP, its Lease requests
slowed or failed by the server's fault injection. A replica whose Lease is cut off by an outage, that wins it back once only to
lose it at once (the API server answering slowly as it comes back: the win took longer than the renew
deadline), and wins it again, began its last term with no other leader seen since before the outage. Its
own flapped term acted on nothing, so it must not count as a leader seen alive: the controller drops held
faults observed more than twice the Lease duration before that moment, and counting the flap dropped a
fault held across the outage (a real kube-apiserver restarted under two controllers lost one so).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from kcover import settings
from kcover.aio import clock as clock_
from kcover.kube import client as client_
from kcover.kube import leasing
from kcover.sim import server as simserver

NS = "kcover-system"
TIMINGS = settings.LeaseSettings(namespace=NS, name="kcover-test", lease_duration_seconds=2.0,
                                 renew_deadline_seconds=1.5, retry_period_seconds=0.2)
LEASES = frozenset({"leases.coordination.k8s.io"})


async def _until(predicate: Callable[[], bool], within: float) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (polling the elector's state)
            await asyncio.sleep(0.05)


async def test_a_term_of_this_replica_that_flapped_is_no_leader_seen_alive() -> None:
    clock = clock_.SystemClock()
    async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube:
        epochs: list[tuple[int, bool, float]] = []
        elector = leasing.LeaderElector(kube, TIMINGS, identity="a", clock=clock)
        elector.on_change = lambda leading: epochs.append((elector.leadership_epoch, leading, clock.monotonic()))
        stop = asyncio.Event()
        task = asyncio.create_task(elector.run(stop), name="elector:a")
        try:
            await _until(elector.is_leader, 5.0)
            assert elector.leadership_epoch == 1
            assert elector.leader_seen_before_term == -math.inf, "nobody else ever held the Lease"
            outage = clock.monotonic()
            srv.faults.resources, srv.faults.error_rate = LEASES, 1.0  # the API server goes away
            await _until(lambda: not elector.leading.is_set(), 5.0)
            srv.faults.error_rate, srv.faults.latency_seconds = 0.0, 0.7  # back, answering slowly
            await _until(lambda: (2, False) in [(epoch, leading) for epoch, leading, _ in epochs], 10.0)
            won = [at for epoch, leading, at in epochs if epoch == 2 and leading]
            lost = [at for epoch, leading, at in epochs if epoch == 2 and not leading]
            assert lost[0] - won[0] < TIMINGS.renew_deadline_seconds, "term 2 was won and lost at once"
            srv.faults.latency_seconds = 0.0
            await _until(elector.is_leader, 5.0)
            await asyncio.sleep(3.0)
            assert elector.is_leader(), "a term that holds"
            assert elector.leadership_epoch >= 3
            assert elector.leader_seen_before_term < outage, (
                f"term {elector.leadership_epoch} began with a leader seen at {elector.leader_seen_before_term:.1f}: "
                f"its own flapped terms counted (term 2 won at {won[0]:.1f}), though no other replica led after the "
                f"outage at {outage:.1f}")
        finally:
            stop.set()
            srv.faults.reset()
            await asyncio.wait_for(task, 10)


async def test_another_replicas_renewals_are_a_leader_seen_alive() -> None:
    clock = clock_.SystemClock()
    async with simserver.SimServer() as srv, client_.from_configuration(srv.kube_configuration()) as kube_a, \
            client_.from_configuration(srv.kube_configuration()) as kube_b:
        a = leasing.LeaderElector(kube_a, TIMINGS, identity="a", clock=clock, release_on_exit=False)
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        task_a = asyncio.create_task(a.run(stop_a), name="elector:a")
        b = leasing.LeaderElector(kube_b, TIMINGS, identity="b", clock=clock)
        task_b: asyncio.Task[None] | None = None
        try:
            await _until(a.is_leader, 5.0)
            task_b = asyncio.create_task(b.run(stop_b), name="elector:b")
            await asyncio.sleep(3.0)  # b follows, watching a renew
            task_a.cancel()  # a dies without releasing
            died = clock.monotonic()
            await _until(b.is_leader, 10.0)
            seen = b.leader_seen_before_term
            assert died - TIMINGS.lease_duration_seconds < seen < died + TIMINGS.lease_duration_seconds, (
                f"b's term began with a's last renewal it saw ({seen:.1f}; a died at {died:.1f})")
        finally:
            stop_a.set()
            stop_b.set()
            await asyncio.wait([t for t in (task_a, task_b) if t is not None], timeout=10)
