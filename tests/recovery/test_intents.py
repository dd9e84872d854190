"""Restart intents in the ledger, and a successor finishing what a dead leader recorded but did not do.

The pure half is table-tested on `ledger.State`; the failover half runs replicas (each its own client,
cache, ledger and executor) against the simulated API server over HTTP, and asserts what the server ends
up holding: pods, core/v1 Events, the ledger ConfigMap, and the requests each replica made.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from kcover import metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import caching, retrying
from kcover.kube import client as client_
from kcover.kube import projections as proj
from kcover.recovery import adapters, engine, executing, ledger
from kcover.sim import server as simserver

NS = "ml"
LEDGER = "kcover-ledger"
WRITES = ("CREATE", "UPDATE", "PATCH", "DELETE", "DELETECOLLECTION")


# ------------------------------------------------------------------------------------------ pure: State

def _intent(key_uid: str = "w1", *, at: float = 100.0, ident: str = "i1", leader: str = "a") -> ledger.Intent:
    return ledger.Intent(id=ident, fault="f1", leader=leader, epoch=3, at=at,
                         workload=("PyTorchJob", "kubeflow.org/v1", NS, "train", key_uid),
                         selector="training.kubeflow.org/job-name=train", pod=(NS, "train-worker-0", "p0"),
                         uids=("p0", "p1"), message="PyTorchJob ml/train after ContainerError", unit="")


def test_an_intent_survives_the_configmap_round_trip() -> None:
    state = ledger.State(restarts={"w.w1": [100.0]}, notes={"w.w1": "PyTorchJob ml/train"},
                         intents={"w.w1": _intent()})
    data = state.encode()
    assert orjson.loads(data["w.w1"])["p"]["l"] == "a"
    assert ledger.State.decode(data).intents == {"w.w1": _intent()}
    pods = ledger.Intent(**{**_intent().__dict__, "selector": "", "pods": ((NS, "x", "u1"),), "pod": None})
    assert ledger.State.decode(ledger.State(restarts={"w.w1": [1.0]}, intents={"w.w1": pods}).encode()).intents[
        "w.w1"] == pods


@pytest.mark.parametrize(("raw", "kept"), [
    ({"t": [1.0], "d": ""}, False),  # an entry written before intents existed
    ({"t": [1.0], "p": {"i": "x"}}, False),  # malformed: ignored, the restart time kept
    ({"t": [1.0], "p": "nonsense"}, False),
    ({"t": [1.0], "p": _intent().encode()}, True),
])
def test_decoding_tolerates_old_and_malformed_intents(raw: dict[str, Any], kept: bool) -> None:
    state = ledger.State.decode({"w.w1": orjson.dumps(raw).decode()})
    assert state.restarts == {"w.w1": [1.0]}
    assert ("w.w1" in state.intents) is kept


@pytest.mark.parametrize(("completed", "left"), [
    ({"w.w1": "i1"}, set()),
    ({"w.w1": "other"}, {"w.w1"}),  # a newer intent on the same key is not dropped by an old completion
    ({}, {"w.w1"}),
])
def test_finish_drops_only_the_completed_intent(completed: dict[str, str], left: set[str]) -> None:
    state = ledger.State(restarts={"w.w1": [100.0]}, intents={"w.w1": _intent()})
    state.finish(completed)
    assert set(state.intents) == left


def test_prune_drops_intents_older_than_the_retention() -> None:
    state = ledger.State(restarts={"w.w1": [100.0], "w.w2": [200.0]},
                         intents={"w.w1": _intent(at=100.0), "w.w2": _intent("w2", at=200.0)})
    state.prune(150.0)
    assert set(state.intents) == {"w.w2"}


def test_the_dry_run_overlay_adds_to_the_history_only_when_asked() -> None:
    real = ledger.State(restarts={"w.w1": [100.0]}, cordons={"n1": 50.0})
    dry = ledger.State(restarts={"w.w1": [120.0], "w.w2": [130.0]}, cordons={"n1": 60.0, "n2": 70.0})
    merged = real.merged(dry)
    assert merged.restarts == {"w.w1": [100.0, 120.0], "w.w2": [130.0]}
    assert merged.cordons == {"n1": 60.0, "n2": 70.0}
    assert real.restarts == {"w.w1": [100.0]}


# ------------------------------------------------------------------------------------------ against the sim

@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer() as server:
        _seed(server)
        yield server


def _seed(srv: simserver.SimServer) -> None:
    store = srv.store
    store.create("namespaces", {"metadata": {"name": NS}})
    for i in range(3):
        store.create("nodes", {"metadata": {"name": f"gpu-{i}"}, "spec": {},
                               "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    for job in ("train", "eval"):
        obj = store.create("pytorchjobs.kubeflow.org", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": job, "namespace": NS, "labels": {proj.OPT_IN_LABEL: "true"}},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3, "restartPolicy": "OnFailure"}}}})
        for i in range(3):
            _pod(srv, job, obj["metadata"]["uid"], i)


def _pod(srv: simserver.SimServer, job: str, job_uid: str, i: int) -> dict[str, Any]:
    return srv.store.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job}-worker-{i}", "namespace": NS,
                     "labels": {adapters.KUBEFLOW_JOB_NAME: job,
                                adapters.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"},
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job,
                                          "uid": job_uid, "controller": True}]},
        "spec": {"nodeName": f"gpu-{i}", "restartPolicy": "OnFailure",
                 "containers": [{"name": "pytorch", "image": "trainer"}]},
        "status": {"phase": "Running"}})


def _job_pods(srv: simserver.SimServer, job: str) -> list[dict[str, Any]]:
    return [p for p in srv.store.iter_objects("pods")
            if (p["metadata"].get("labels") or {}).get(adapters.KUBEFLOW_JOB_NAME) == job]


def _restart_events(srv: simserver.SimServer, job: str = "train") -> list[dict[str, Any]]:
    return [e for e in srv.store.iter_objects("events")
            if e.get("reason") == "KcoverRestartedWorkload" and e["involvedObject"]["name"] == job]


def _ledger_entries(srv: simserver.SimServer) -> dict[str, dict[str, Any]]:
    found = [c for c in srv.store.iter_objects("configmaps") if c["metadata"]["name"] == LEDGER]
    if not found:
        return {}
    return {k: orjson.loads(v) for k, v in (found[0].get("data") or {}).items()}


def _pending(srv: simserver.SimServer) -> dict[str, dict[str, Any]]:
    return {k: v["p"] for k, v in _ledger_entries(srv).items() if "p" in v}


def _writes(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()
            if v != before.get(k, 0) and k.split()[0] in WRITES}


class Clock:
    def __init__(self) -> None:
        self.moment = clock_.utcnow()

    def now(self) -> dt.datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.moment.timestamp()


class Replica:
    """One controller replica's recovery half: its own client, cache, ledger, executor and engine."""

    def __init__(self, srv: simserver.SimServer, identity: str, *, leading: Callable[[], bool] = lambda: True,
                 clock: Clock | None = None, fence: retrying.Fence | None = None,
                 retry: retrying.Policy = retrying.DEFAULT, **recovery: Any) -> None:
        self.identity = identity
        self.kube = client_.from_configuration(srv.kube_configuration(), retry=retry)
        self.cache = caching.ClusterCache(self.kube, watch_events=False,
                                          workload_kinds=caching.workload_kinds(["pytorchjobs.kubeflow.org"]))
        snap = self.cache
        self.clock = clock or Clock()
        self.recovery = settings.RecoverySettings(ledger_namespace=NS, ledger_name=LEDGER,
                                                  **{"save_logs": {"enabled": False}, **recovery})
        self.ledger = ledger.Ledger(self.kube, namespace=NS, name=LEDGER, is_leader=leading,
                                    retention_seconds=lambda: 3600.0, fence=fence)
        self.executor = executing.Executor(self.kube, snap, self.ledger, recovery=self.recovery,
                                           metrics_=metrics.Metrics(), clock=self.clock, identity=identity,
                                           is_leader=leading, epoch=lambda: 1, fence=fence)
        self.engine = engine.RecoveryEngine(None, snap, self.ledger, self.executor, recovery=self.recovery,
                                            clock=self.clock, is_leader=leading)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.cache.run(self.stop), name=f"cache:{identity}")

    async def __aenter__(self) -> Replica:
        await self.cache.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task
        await self.kube.close()

    def fault(self, pod: str) -> model.CollectorEvent:
        found = self.cache.pod_by_name(NS, pod)
        assert found is not None
        return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                    message="exit code 1",
                                    target=model.Target(kind=model.TargetKind.POD, namespace=NS, name=pod,
                                                        uid=found.uid, node=found.node))

    async def caught_up(self, srv: simserver.SimServer, job: str) -> None:
        """Wait until this replica's cache shows the job's pods as the server holds them."""
        want = {(p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in _job_pods(srv, job)}
        async with asyncio.timeout(5):
            while self._seen(job) != want:  # noqa: ASYNC110  (polling in-process state)
                await asyncio.sleep(0.01)

    def _seen(self, job: str) -> set[tuple[str, bool]]:
        return {(p.uid, bool(p.deletion_timestamp)) for p in self.cache.pods.values()
                if p.namespace == NS and p.name.startswith(f"{job}-")}


async def test_a_restart_costs_three_writes_and_its_completion_rides_on_the_next_ledger_write(
        srv: simserver.SimServer) -> None:
    async with Replica(srv, "a") as a:
        before = dict(srv.request_counts)
        [result] = await a.engine.handle_event(a.fault("train-worker-1"))
        assert result.outcome is executing.Outcome.DONE
        # a Kubeflow job carries no uid label: its pods are deleted one by one with uid preconditions
        assert _writes(before, srv.request_counts) == {"CREATE configmaps": 1, "DELETE pods": 3,
                                                       "CREATE events": 1}
        assert not any(k.startswith("LIST") for k in _writes(before, srv.request_counts))
        assert all(p["metadata"].get("deletionTimestamp") for p in _job_pods(srv, "train"))
        [(key, intent)] = _pending(srv).items()
        assert (intent["l"], intent["e"], len(intent["u"])) == ("a", 1, 3)
        assert intent["u"][0] == a.fault("train-worker-1").target.uid

        before = dict(srv.request_counts)
        await a.engine.handle_event(a.fault("eval-worker-0"))
        assert _writes(before, srv.request_counts) == {"UPDATE configmaps": 1, "DELETE pods": 3,
                                                       "CREATE events": 1}
        pending = _pending(srv)
        assert key not in pending, "the first restart's completion was folded into the second's write"
        assert len(pending) == 1
        assert _ledger_entries(srv)[key]["t"], "the restart time stays for the cooldown"


async def test_a_successor_finishes_the_restart_a_leader_recorded_but_died_before_deleting(
        srv: simserver.SimServer) -> None:
    # a leads until its intent is in the ledger: the fence before the DeleteCollection then refuses,
    # as it would for a leader killed (or partitioned away) right after the ledger write
    async with Replica(srv, "a", leading=lambda: not _pending(srv)) as a:
        fault = a.fault("train-worker-1")
        old = {p["metadata"]["uid"] for p in _job_pods(srv, "train")}
        await a.engine.handle([fault])
    assert a.engine.counts["not_leader"] == 1
    assert srv.request_counts.get("DELETE pods", 0) == 0
    assert not _restart_events(srv)
    [intent] = _pending(srv).values()
    assert intent["l"] == "a"

    async with Replica(srv, "b") as b:
        before = dict(srv.request_counts)
        [done] = await b.engine.resume()
        assert done.outcome is executing.Outcome.DONE
        assert done.deleted == 3
        assert _writes(before, srv.request_counts) == {"UPDATE configmaps": 1, "DELETE pods": 3,
                                                       "CREATE events": 1}
        assert {p["metadata"]["uid"] for p in _job_pods(srv, "train")} == old
        assert all(p["metadata"].get("deletionTimestamp") for p in _job_pods(srv, "train"))
        assert not any(p["metadata"].get("deletionTimestamp") for p in _job_pods(srv, "eval"))
        [event] = _restart_events(srv)
        assert event["reportingInstance"] == "b"
        assert "finishing the restart a recorded" in event["message"]
        assert _pending(srv)[next(iter(_pending(srv)))]["l"] == "b", "claimed (fenced) before the delete"

        # the fault replayed to the successor (held events) is within the cooldown: nothing more
        await b.caught_up(srv, "train")
        before = dict(srv.request_counts)
        [skip] = await b.engine.handle_event(fault)
        assert skip.outcome is executing.Outcome.SKIPPED
        assert await b.engine.resume() == []
        assert _writes(before, srv.request_counts) == {}

    # a third leader sees the intent still marked pending (its completion rides on the next write), but
    # the pods it names are terminating: it does not restart the job again, and writes nothing
    async with Replica(srv, "c") as c:
        before = dict(srv.request_counts)
        [seen] = await c.engine.resume()
        assert seen.outcome is executing.Outcome.SKIPPED
        assert _writes(before, srv.request_counts) == {}
    assert len(_restart_events(srv)) == 1
    assert srv.request_counts["DELETE pods"] == 3


async def test_a_pending_intent_whose_pods_were_replaced_is_not_carried_out_again(
        srv: simserver.SimServer) -> None:
    async with Replica(srv, "a") as a:
        [result] = await a.engine.handle_event(a.fault("train-worker-0"))
        assert result.outcome is executing.Outcome.DONE
    assert _pending(srv), "a died before its next ledger write: the intent still reads pending"
    # the kubelet finished the deletions and the operator recreated the pods (same names, new uids)
    job_uid = next(p for p in srv.store.iter_objects("pytorchjobs.kubeflow.org")
                   if p["metadata"]["name"] == "train")["metadata"]["uid"]
    for pod in _job_pods(srv, "train"):
        srv.store.delete("pods", NS, pod["metadata"]["name"], grace_seconds=0)
    for i in range(3):
        _pod(srv, "train", job_uid, i)

    async with Replica(srv, "b") as b:
        before = dict(srv.request_counts)
        [seen] = await b.engine.resume()
        assert seen.outcome is executing.Outcome.SKIPPED
        assert "gone or replaced" in seen.detail
        assert _writes(before, srv.request_counts) == {}
        assert not any(p["metadata"].get("deletionTimestamp") for p in _job_pods(srv, "train"))
        # and the next ledger write forgets it
        await b.engine.handle_event(b.fault("eval-worker-2"))
        assert [v["w"][3] for v in _pending(srv).values()] == ["eval"]
    assert len(_restart_events(srv)) == 1


async def test_an_intent_older_than_the_cooldown_is_given_up_refunded_and_reported(srv: simserver.SimServer) -> None:
    clock = Clock()
    async with Replica(srv, "a", leading=lambda: not _pending(srv), clock=clock) as a:
        await a.engine.handle([a.fault("train-worker-1")])
    assert _pending(srv)
    (entry,) = _ledger_entries(srv).values()
    assert len(entry["t"]) == 1  # the restart was counted when it was recorded
    clock.moment += dt.timedelta(seconds=61)  # default workload cooldown: 60 s
    async with Replica(srv, "b", clock=clock) as b:
        (result,) = await b.engine.resume()
        assert result.outcome is executing.Outcome.SKIPPED
    assert srv.request_counts.get("DELETE pods", 0) == 0
    assert not _pending(srv)
    assert all(not v.get("t") for v in _ledger_entries(srv).values())  # a restart that never happened: refunded
    failed = [e for e in srv.store.iter_objects("events") if e.get("reason") == "KcoverRecoveryFailed"]
    assert len(failed) == 1
    assert failed[0]["involvedObject"]["name"] == "train"
    assert "not counted against its budget" in failed[0]["message"]


async def test_dry_run_acts_once_per_cooldown_and_writes_no_ledger(srv: simserver.SimServer) -> None:
    clock = Clock()
    async with Replica(srv, "a", clock=clock, dry_run=True, workload_cooldown_seconds=30.0) as a:
        fault = a.fault("train-worker-1")
        outcomes = []
        for _ in range(3):
            outcomes += [r.outcome for r in await a.engine.handle_event(fault)]
            clock.moment += dt.timedelta(seconds=5)
        assert outcomes == [executing.Outcome.DRY_RUN, executing.Outcome.SKIPPED, executing.Outcome.SKIPPED]
        assert a.engine.counts["skip:Cooldown"] == 2
        dry = [e for e in srv.store.iter_objects("events") if e.get("action") == "DryRunRestart"]
        assert len(dry) == 1
        assert "would restart PyTorchJob ml/train" in dry[0]["message"]

        clock.moment += dt.timedelta(seconds=30)  # past the cooldown: the real run would act again
        assert [r.outcome for r in await a.engine.handle_event(fault)] == [executing.Outcome.DRY_RUN]
        assert len([e for e in srv.store.iter_objects("events") if e.get("action") == "DryRunRestart"]) == 2
        assert _ledger_entries(srv) == {}
        assert not any(k.split()[1] == "configmaps" for k in srv.request_counts if k.split()[0] in WRITES)
        assert srv.request_counts.get("DELETE pods", 0) == 0

        # dry run switched off: what it remembered does not hold the real run back
        live = a.recovery.model_copy(update={"dry_run": False})
        a.engine.reconfigure(live)
        clock.moment += dt.timedelta(seconds=1)
        assert [r.outcome for r in await a.engine.handle_event(fault)] == [executing.Outcome.DONE]
        assert srv.request_counts["DELETE pods"] == 3


async def test_dry_run_cordons_once_per_node_cooldown(srv: simserver.SimServer) -> None:
    clock = Clock()
    async with Replica(srv, "a", clock=clock, dry_run=True, max_cordoned_fraction=0.5) as a:
        node_fault = model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR,
                                          reason="GPUUnhealthy", target=model.Target(
                                              kind=model.TargetKind.NODE, name="gpu-2", node="gpu-2"))
        for _ in range(3):
            await a.engine.handle_event(node_fault)
            clock.moment += dt.timedelta(seconds=5)
        events = list(srv.store.iter_objects("events"))
        assert len([e for e in events if e.get("action") == "DryRunCordon"]) == 1
        # the node sweep restarts each job with a pod there once as well
        assert sorted(e["involvedObject"]["name"] for e in events if e.get("action") == "DryRunRestart") == [
            "eval", "train"]
        node = next(n for n in srv.store.iter_objects("nodes") if n["metadata"]["name"] == "gpu-2")
        assert not node["spec"].get("unschedulable")
        assert _ledger_entries(srv) == {}


# ------------------------------------------------------------------------------------------ retries and fencing

QUICK = retrying.Policy(deadline_seconds=0.3, initial_seconds=0.01, max_delay_seconds=0.05)


async def test_a_restart_whose_delete_keeps_failing_stays_pending_and_is_retried_without_using_budget(
        srv: simserver.SimServer) -> None:
    async with Replica(srv, "a", retry=QUICK) as a:
        old = {p["metadata"]["uid"] for p in _job_pods(srv, "train")}
        srv.faults.resources = frozenset({"pods"})
        srv.faults.error_rate = 1.0  # every pods request answers 500 past the retry deadline
        await a.engine.handle([a.fault("train-worker-1")])
        assert a.engine.counts["errors"] == 1
        assert srv.request_counts["DELETE pods"] >= 1
        assert a.kube.retry_stats.retries["server_error"] > 0, "retried before giving up"
        assert not _restart_events(srv)
        [(key, intent)] = _pending(srv).items()
        assert intent["l"] == "a"
        assert len(_ledger_entries(srv)[key]["t"]) == 1

        srv.faults.reset()  # the API server recovers: the leader's next pass finishes its own pending restart
        [done] = await a.engine.resume()
        assert done.outcome is executing.Outcome.DONE
        assert len(_restart_events(srv)) == 1
        assert not {p["metadata"]["uid"] for p in _job_pods(srv, "train")
                    if not p["metadata"].get("deletionTimestamp")} & old
        await a.caught_up(srv, "train")
        await a.engine.handle_event(a.fault("eval-worker-0"))  # any later write drops the completed intent
        entry = _ledger_entries(srv)[key]
        assert "p" not in entry
        assert len(entry["t"]) == 1, "one restart, one budget slot, however many attempts it took"


class Term:
    """A leader's fence that the test deposes at will."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def write_seconds_left(self) -> float:
        return self.seconds


async def test_a_deposed_leaders_delayed_delete_cannot_restart_twice(srv: simserver.SimServer) -> None:
    term = Term(0.3)  # what is left of a's term when it starts the restart
    async with Replica(srv, "a", leading=lambda: term.seconds > 0, fence=term, retry=QUICK) as a:
        srv.faults.resources = frozenset({"pods"})
        srv.faults.latency_seconds = 1.0  # the API server holds a's DeleteCollection past a's term
        original = a.kube._once

        async def deposed_during_the_first_delete(method: str, path: str, **kwargs: Any) -> Any:
            try:
                return await original(method, path, **kwargs)
            finally:
                if method == "DELETE":
                    term.seconds = 0.0  # a loses the Lease while its delete is held

        vars(a.kube)["_once"] = deposed_during_the_first_delete
        await a.engine.handle([a.fault("train-worker-1")])
    assert a.engine.counts["not_leader"] + a.engine.counts["errors"] == 1
    srv.faults.reset()
    assert not _restart_events(srv)

    async with Replica(srv, "b") as b:  # the successor finishes a's restart
        [done] = await b.engine.resume()
        assert done.outcome is executing.Outcome.DONE
        uid = next(p["metadata"]["uid"] for p in srv.store.iter_objects("pytorchjobs.kubeflow.org")
                   if p["metadata"]["name"] == "train")
        for p in _job_pods(srv, "train"):  # the operator's part: the old pods go, new ones come
            srv.store.delete("pods", NS, p["metadata"]["name"], grace_seconds=0)
        for i in range(3):
            _pod(srv, "train", uid, i)
        new = {p["metadata"]["uid"] for p in _job_pods(srv, "train")}
        await asyncio.sleep(1.5)  # past the moment a's held request would have been served
    assert {p["metadata"]["uid"] for p in _job_pods(srv, "train")
            if not p["metadata"].get("deletionTimestamp")} == new, "the new pods were not deleted"
    # a's three deletes (sent at once, abandoned after 0.3 s) and b's three: each carries its pod's uid as
    # precondition, so even one applied late could not touch a recreated pod
    assert srv.request_counts["DELETE pods"] == 6
    assert len(_restart_events(srv)) == 1
