"""Retries of API requests: what is retried, how long it waits, the fence, and against the simulated server."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from kcover import errors
from kcover.kube import client as client_
from kcover.kube import retrying
from kcover.sim import server as simserver

FAST = retrying.Policy(deadline_seconds=5.0, initial_seconds=0.001, max_delay_seconds=0.01,
                       max_retry_after_seconds=0.05)


class Script:
    """An attempt that fails with the given errors in turn, then answers "ok"."""

    def __init__(self, *failures: errors.KubeError) -> None:
        self.failures = list(failures)
        self.timeouts: list[float] = []

    async def __call__(self, timeout: float) -> str:
        self.timeouts.append(timeout)
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


@pytest.mark.parametrize(("status", "retried"), [
    (429, True), (500, True), (502, True), (503, True), (504, True), (0, True),
    (400, False), (403, False), (404, False), (409, False), (410, False), (422, False),
])
async def test_which_statuses_are_retried(status: int, retried: bool) -> None:
    script = Script(errors.KubeError("x", status=status))
    stats = retrying.Stats()
    if retried:
        assert await retrying.call(script, policy=FAST, timeout=1.0, what="GET pods", stats=stats) == "ok"
        assert sum(stats.retries.values()) == 1
    else:
        with pytest.raises(errors.KubeError):
            await retrying.call(script, policy=FAST, timeout=1.0, what="GET pods", stats=stats)
        assert not stats.retries
    assert len(script.timeouts) == (2 if retried else 1)


async def test_a_failure_the_caller_reads_as_an_answer_is_raised_at_once() -> None:
    budget = errors.TooManyRequestsError("budget", status=429, reason="TooManyRequests", retry_after=10.0)
    stats = retrying.Stats()
    with pytest.raises(errors.TooManyRequestsError, match="budget"):
        await retrying.call(Script(budget), policy=FAST, timeout=1.0, what="CREATE pods/eviction", stats=stats,
                            answer=lambda exc: str(exc) == "budget")
    assert not stats.retries
    throttled = errors.TooManyRequestsError("slow down", status=429, retry_after=0.01)
    script = Script(throttled)
    assert await retrying.call(script, policy=FAST, timeout=1.0, what="CREATE pods/eviction", stats=stats,
                               answer=lambda exc: str(exc) == "budget") == "ok"
    assert stats.retries["throttled"] == 1
    assert len(script.timeouts) == 2


def test_retry_after_is_honoured_capped_and_jittered() -> None:
    policy = retrying.Policy(max_retry_after_seconds=3.0)
    back = retrying.backoff.Backoff(initial=0.1, maximum=1.0)
    rng = random.Random(1)
    said = errors.TooManyRequestsError("slow down", status=429, retry_after=2.0)
    delays = [retrying.delay_for(said, back, policy, rng) for _ in range(50)]
    assert all(2.0 <= d <= 2.0 * (1 + retrying.RETRY_AFTER_JITTER) for d in delays)
    assert len(set(delays)) > 1  # jittered: throttled clients do not come back in step
    too_long = errors.TooManyRequestsError("slow down", status=429, retry_after=60.0)
    assert retrying.delay_for(too_long, back, policy, rng) <= 3.0 * (1 + retrying.RETRY_AFTER_JITTER)


async def test_gives_up_with_the_last_error_at_the_deadline() -> None:
    script = Script(*[errors.KubeError("down", status=503) for _ in range(1000)])
    stats = retrying.Stats()
    policy = retrying.Policy(deadline_seconds=0.2, initial_seconds=0.01, max_delay_seconds=0.02)
    with pytest.raises(errors.KubeError, match="down"):
        await retrying.call(script, policy=policy, timeout=0.05, what="PUT configmaps", stats=stats)
    assert stats.exhausted == 1
    assert 2 <= len(script.timeouts) < 100


class Term:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def write_seconds_left(self) -> float:
        return self.seconds


async def test_the_fence_bounds_each_attempt_and_refuses_once_the_term_is_over() -> None:
    script = Script(errors.KubeError("x", status=500))
    term = Term(0.3)
    assert await retrying.call(script, policy=FAST, timeout=30.0, what="DELETECOLLECTION pods", fence=term) == "ok"
    assert script.timeouts == [0.3, 0.3]  # never the 30 s request timeout: an attempt cannot outlive the term
    term.seconds = 0.0
    with pytest.raises(errors.NotLeaderError):
        await retrying.call(Script(), policy=FAST, timeout=30.0, what="DELETECOLLECTION pods", fence=term)


@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer(seed=7) as server:
        server.store.create("namespaces", {"metadata": {"name": "ml"}})
        yield server


async def test_the_client_rides_out_throttling_and_server_errors(srv: simserver.SimServer) -> None:
    srv.faults.throttle_rate = 0.3
    srv.faults.error_rate = 0.3
    srv.faults.retry_after_seconds = 0  # plain-text 429 without a useful Retry-After: backoff decides
    async with client_.from_configuration(srv.kube_configuration(), retry=FAST) as kube:
        for i in range(20):
            await kube.request("POST", "/api/v1/namespaces/ml/configmaps",
                               body={"metadata": {"name": f"c{i}"}, "data": {"i": str(i)}})
        assert sum(kube.retry_stats.retries.values()) > 0
        assert set(kube.retry_stats.retries) <= {"throttled", "server_error"}
    assert len([c for c in srv.store.iter_objects("configmaps")]) == 20


async def test_no_retry_makes_one_attempt(srv: simserver.SimServer) -> None:
    srv.faults.error_rate = 1.0
    async with client_.from_configuration(srv.kube_configuration(), retry=FAST) as kube:
        with pytest.raises(errors.KubeError) as caught:
            await kube.request("GET", "/api/v1/namespaces/ml/configmaps", retry=False)
        assert caught.value.status == 500
        assert kube.request_counts["LIST configmaps"] == 1
