"""Fast to lead: the Lease campaign runs while the cache syncs; acting waits for the sync (simulated API server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from test_resume import NS, Engine, srv  # noqa: F401  (the recording engine and the server fixture)

from kcover import metrics, serving, settings
from kcover.controller import recovering, running
from kcover.detectors import registry
from kcover.kube import caching, leasing
from kcover.kube import client as client_
from kcover.sim import server as simserver


def _settings(identity: str) -> settings.Settings:
    return settings.Settings.model_validate({
        "lease": {"identity": identity, "namespace": NS, "lease_duration_seconds": 2.0,
                  "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2},
        "detectors": {"entries": {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}},
        "kube": {"workload_kinds": [], "watch_events": False},
    })


class LateCache(caching.ClusterCache):
    """The product's cache, whose first list starts only once `gate` is set (a slow API server)."""

    def __init__(self, *args: Any, gate: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate

    async def run(self, stop: asyncio.Event) -> None:
        await self.gate.wait()
        await super().run(stop)


async def _until(predicate: Callable[[], Any], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (polling in-process state)
            await asyncio.sleep(0.01)


async def test_the_lease_is_won_during_the_sync_and_the_engine_acts_only_after_it(srv: simserver.SimServer) -> None:  # noqa: F811
    engines: list[Engine] = []

    def factory(deps: recovering.EngineDeps) -> Engine:
        engines.append(Engine(deps))
        return engines[-1]

    gate = asyncio.Event()
    async with client_.from_configuration(srv.kube_configuration()) as kube:
        cfg = _settings("a")
        cache = LateCache(kube, workload_kinds=[], watch_events=False, gate=gate)
        ctl = running.Controller(cfg, client=kube, metrics=metrics.Metrics(), health=serving.Health(),
                                 detector_registry=registry.discover(), engine_factory=factory, cache=cache)
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop), name="controller")
        try:
            assert ctl.elector is not None
            await _until(ctl.elector.leading.is_set)
            assert not cache.synced
            await asyncio.sleep(0.3)
            assert engines[0].calls == []  # leading, but nothing is acted on before the sync
            gate.set()
            await _until(lambda: engines[0].calls)
            assert engines[0].calls == ["resume:1"]
        finally:
            stop.set()
            gate.set()
            await task
    lease = srv.store.get("leases.coordination.k8s.io", NS, cfg.lease.name)
    assert lease["spec"].get("holderIdentity", "") == ""  # released on the way out


async def test_a_lease_won_before_the_controller_was_built_is_acted_on_once_synced(srv: simserver.SimServer) -> None:  # noqa: F811
    """`kcover controller` campaigns before it imports and builds the controller: the controller takes the
    running campaign, resumes its term once synced, and leaves the campaign (and the Lease) to its caller."""
    engines: list[Engine] = []

    def factory(deps: recovering.EngineDeps) -> Engine:
        engines.append(Engine(deps))
        return engines[-1]

    async with client_.from_configuration(srv.kube_configuration()) as kube:
        cfg = _settings("early")
        elector = leasing.LeaderElector(kube, cfg.lease, identity="early")
        campaign_stop = asyncio.Event()
        campaign = asyncio.create_task(elector.run(campaign_stop), name="campaign")
        try:
            await _until(elector.leading.is_set)
            ctl = running.Controller(cfg, client=kube, metrics=metrics.Metrics(), health=serving.Health(),
                                     detector_registry=registry.discover(), engine_factory=factory, elector=elector)
            assert ctl.identity == "early"
            stop = asyncio.Event()
            task = asyncio.create_task(ctl.run(stop), name="controller")
            await _until(lambda: engines[0].calls)
            assert engines[0].calls == ["resume:1"]
            stop.set()
            await task
            assert elector.leading.is_set()  # the controller stopped; the campaign is its caller's to end
        finally:
            campaign_stop.set()
            await campaign
    lease = srv.store.get("leases.coordination.k8s.io", NS, cfg.lease.name)
    assert lease["spec"].get("holderIdentity", "") == ""  # released when the caller ended the campaign
