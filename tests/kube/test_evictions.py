"""The gateway's evictions against the simulated API server: what is retried and what is an answer.

A restart of a Job or a JobSet evicts each of its pods; one of a 2,048-pod restart's evictions answered
by priority and fairness's 429, a 5xx or a lost connection is asked again as every write is, while a
PodDisruptionBudget's refusal (429) and the server's 500 for a pod two budgets select are answers, taken
after one request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kcover import errors
from kcover.kube import client as client_
from kcover.kube import gateway, retrying
from kcover.sim import server as simserver

FAST = retrying.Policy(deadline_seconds=10.0, initial_seconds=0.001, max_delay_seconds=0.01,
                       max_retry_after_seconds=0.01)
EVICTIONS = "CREATE pods/eviction"


@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer(seed=3) as server:
        server.store.create("namespaces", {"metadata": {"name": "ml"}})
        yield server


def _pods(srv: simserver.SimServer, count: int, *, labels: dict[str, str] | None = None) -> list[tuple[str, str]]:
    made = []
    for i in range(count):
        pod = srv.store.create("pods", {
            "metadata": {"name": f"w-{i}", "namespace": "ml", "labels": labels or {"app": "train"}},
            "spec": {"nodeName": "gpu-0", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        made.append((pod["metadata"]["name"], pod["metadata"]["uid"]))
    return made


def _budget(srv: simserver.SimServer, name: str, *, allowed: int) -> None:
    pdb = srv.store.create("poddisruptionbudgets.policy", {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}})
    pdb["status"] = {"observedGeneration": pdb["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
                     "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}
    srv.store.update("poddisruptionbudgets.policy", pdb)


async def test_evictions_ride_out_throttling_and_server_errors(srv: simserver.SimServer) -> None:
    pods = _pods(srv, 12)
    srv.faults.resources = frozenset({"pods"})
    srv.faults.throttle_rate = 0.3
    srv.faults.throttle_style = "status"  # a Status with retryAfterSeconds, as priority and fairness can send
    srv.faults.error_rate = 0.3
    async with client_.from_configuration(srv.kube_configuration(), retry=FAST) as kube:
        gw = gateway.Http(kube)
        got = [await gw.evict_pod("ml", name, uid) for name, uid in pods]
        assert got == [gateway.Removal.REMOVED] * len(pods)
        assert kube.request_counts[EVICTIONS] > len(pods)  # some were asked again
        assert set(kube.retry_stats.retries) == {"throttled", "server_error"}
    assert [p for p in srv.store.iter_objects("pods") if not p["metadata"].get("deletionTimestamp")] == []


async def test_a_disruption_budgets_refusal_is_held_after_one_request(srv: simserver.SimServer) -> None:
    ((name, uid),) = _pods(srv, 1)
    _budget(srv, "train", allowed=0)
    async with client_.from_configuration(srv.kube_configuration(), retry=FAST) as kube:
        assert await gateway.Http(kube).evict_pod("ml", name, uid) is gateway.Removal.HELD
        assert kube.request_counts[EVICTIONS] == 1
        assert not kube.retry_stats.retries


async def test_a_pod_two_budgets_select_fails_after_one_request(srv: simserver.SimServer) -> None:
    ((name, uid),) = _pods(srv, 1)
    _budget(srv, "one", allowed=1)
    _budget(srv, "two", allowed=1)
    async with client_.from_configuration(srv.kube_configuration(), retry=FAST) as kube:
        with pytest.raises(errors.KubeError, match="more than one PodDisruptionBudget") as caught:
            await gateway.Http(kube).evict_pod("ml", name, uid)
        assert caught.value.status == 500
        assert kube.request_counts[EVICTIONS] == 1
    assert srv.store.get("pods", "ml", name)["metadata"].get("deletionTimestamp") is None
