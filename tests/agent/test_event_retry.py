"""The agent's Events that ask for recovery are retried, not dropped, when the API server refuses them.

The node condition alone recommends a cordon and never the restarts, so a lost `need-recovery` Event would
leave a node's jobs unrestarted. The reporter, against the simulated API server with a manual clock: a
refused Event asking for recovery is written once the API server takes Events again (after its backoff),
one still refused after `agent.event_retry_seconds` is dropped, one carrying evidence (an RDMA link-down)
is retried as well, and an Event that asks for nothing is not retried.
"""

from __future__ import annotations

from typing import Any

import test_devicehealth as dh
from test_devicehealth import World, world  # noqa: F401  (the fixture)

from kcover import codec, model, settings
from kcover.agent import reporting
from kcover.detectors import event_watcher

NODE = dh.NODE


def _xid(xid: int = 79, action: model.Action = model.Action.CORDON_NODE_AND_RESTART,
         severity: model.Severity = model.Severity.ERROR) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="nvml", target=model.Target(kind=model.TargetKind.DEVICE, node=NODE, device_id="GPU-0"),
        severity=severity, reason=f"XID{xid}", message="on GPU 0", recommended=action,
        fault=model.Fault(xid=xid, gpu_index=0, gpu_uuid="GPU-0"))


async def _events(w: World) -> list[dict[str, Any]]:
    return list((await w.kube.request("GET", f"/api/v1/namespaces/{dh.NS}/events"))["items"])


def _refuse_events(w: World) -> None:
    w.srv.faults.resources = frozenset({"events"})
    w.srv.faults.error_rate, w.srv.faults.error_code = 1.0, 403  # not retried by the client: at once


async def test_a_refused_event_asking_for_recovery_is_written_later(world: World) -> None:  # noqa: F811
    reporter = world.reporter()
    _refuse_events(world)
    await reporter.handle([_xid()])
    assert [e.reason for _, e in reporter.recovery_pending] == ["XID79"]
    world.srv.faults.reset()
    assert await _events(world) == []
    await reporter.retry_events()  # within the backoff: not yet
    assert await _events(world) == []
    world.clock.advance(1.0)
    await reporter.retry_events()
    [event] = await _events(world)
    assert event["reason"] == "XID79"
    assert event["metadata"]["annotations"][codec.NEED_RECOVERY] == "true"
    assert reporter.recovery_pending == []
    await reporter.retry_events()
    assert len(await _events(world)) == 1, "written once"


async def test_one_still_refused_after_the_retry_time_is_dropped(world: World) -> None:  # noqa: F811
    reporter = world.reporter(event_retry_seconds=30)
    _refuse_events(world)
    await reporter.handle([_xid()])
    for _ in range(20):  # the backoff grows (to 15 s at most, jittered); the API server keeps refusing
        world.clock.advance(5.0)
        await reporter.retry_events()
    assert reporter.recovery_pending == []
    world.srv.faults.reset()
    world.clock.advance(60.0)
    await reporter.retry_events()
    assert await _events(world) == []


async def test_an_event_that_asks_for_nothing_is_not_retried(world: World) -> None:  # noqa: F811
    reporter = world.reporter()
    _refuse_events(world)
    await reporter.handle([_xid(43, model.Action.REPORT, model.Severity.INFO)])
    assert reporter.recovery_pending == []
    world.srv.faults.reset()
    world.clock.advance(5.0)
    await reporter.retry_events()
    assert await _events(world) == []


async def test_a_refused_link_down_is_written_later_too(world: World) -> None:  # noqa: F811
    """The agent's one link-down asks for nothing but is the judgement's evidence: lost, a job that hangs on
    the link would come back to it; so it waits for the API server like a request for recovery."""
    reporter = world.reporter()
    _refuse_events(world)
    down = model.CollectorEvent(
        detector="rdma-link", target=model.Target(kind=model.TargetKind.NODE, node=NODE, name=NODE),
        severity=model.Severity.WARNING, reason="RdmaLinkFlapped", message="RDMA port mlx5_0 port 1 went down",
        recommended=model.Action.REPORT, evidence=model.Evidence.LINK_DOWN)
    await reporter.handle([down])
    assert [e.reason for _, e in reporter.recovery_pending] == ["RdmaLinkFlapped"]
    world.srv.faults.reset()
    world.clock.advance(1.0)
    await reporter.retry_events()
    [event] = await _events(world)
    assert event["metadata"]["annotations"][codec.EVIDENCE] == "link-down"
    assert codec.NEED_RECOVERY not in event["metadata"]["annotations"]


async def test_the_waiting_events_are_bounded_the_oldest_going_first(world: World) -> None:  # noqa: F811
    reporter = world.reporter(event_dedupe_seconds=0, max_events_per_minute=10_000)
    _refuse_events(world)
    await reporter.handle([_xid(xid) for xid in range(reporting.MAX_PENDING_EVENTS + 2)])
    waiting = [e.fault.xid for _, e in reporter.recovery_pending]
    assert waiting == list(range(2, reporting.MAX_PENDING_EVENTS + 2)), "the two oldest were dropped"


def test_the_default_retry_time_ends_before_the_controller_calls_an_event_stale() -> None:
    """docs/detectors.md: retried for 120 s, under the event-watcher's 180 s staleness (a later write would
    reach a controller that ignores it)."""
    assert settings.AgentSettings().event_retry_seconds == 120.0
    assert event_watcher.EventWatcherConfig().staleness_seconds == 180.0
    assert settings.AgentSettings().event_retry_seconds < event_watcher.EventWatcherConfig().staleness_seconds
