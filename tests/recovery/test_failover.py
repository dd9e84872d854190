"""Restart intents and failover, on virtual time: what a leader records before it takes pods away, and a
successor finishing (or forgetting, or giving up) what a dead leader recorded.

Each replica has its own client, cache, ledger and engine over one simulated API server (in-process);
the assertions are on the pods, Events and LedgerEntry objects the server holds and the writes made.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from harness import engines
from harness import objects as o

from kcover import errors, kinds, model
from kcover.aio import clock as clock_
from kcover.kube import projections as proj
from kcover.kube import retrying
from kcover.recovery import engine, ledgerentries, recoveries
from kcover.recovery import steps as st

pytestmark = pytest.mark.looptime

OPT = {proj.OPT_IN_LABEL: "true"}
LABELS = {kinds.KUBEFLOW_JOB_NAME: "train", kinds.KUBEFLOW_OPERATOR_NAME: "pytorchjob-controller"}
WRITES = ("CREATE", "UPDATE", "PATCH", "DELETE")


def world() -> list[o.Obj]:
    out: list[o.Obj] = [o.node(f"gpu-{i}") for i in range(3)]
    for job in ("train", "eval"):
        w = o.workload("kubeflow.org/v1", "PyTorchJob", job, uid=f"{job}-uid", labels=OPT)
        labels = {**LABELS, kinds.KUBEFLOW_JOB_NAME: job}
        out += [w, *(o.pod(f"{job}-worker-{i}", uid=f"{job}-{i}", node=f"gpu-{i}", labels=labels, owner=w)
                     for i in range(3))]
    return out


def fault(uid: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit code 1", observed_at=engines.START,
                                target=model.Target(kind=model.TargetKind.POD, namespace="ml", name=uid, uid=uid))


def entries(r: engines.Rig) -> dict[str, dict[str, Any]]:
    out = {}
    for obj in r.store.iter_objects("ledgerentries.kcover.io"):
        for key, raw in (obj.get("data") or {}).items():
            if key != ledgerentries.SIGNALS:
                out[key] = orjson.loads(raw)
    return out


def pending(r: engines.Rig) -> dict[str, dict[str, Any]]:
    return {k: v["p"] for k, v in entries(r).items() if "p" in v}


def writes(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()
            if v != before.get(k, 0) and k.split()[0] in WRITES and not k.startswith("CREATE recoveries")
            and not k.startswith("PATCH recoveries")}


def live(r: engines.Rig, job: str) -> set[str]:
    return {p["metadata"]["uid"] for p in r.store.iter_objects("pods")
            if p["metadata"]["name"].startswith(f"{job}-") and not p["metadata"].get("deletionTimestamp")}


def restarts(r: engines.Rig, job: str = "train") -> list[dict[str, Any]]:
    return r.events("KcoverRestartedWorkload", name=job)


class Term:
    """A leader's fence that ends once `ends()` says so."""

    def __init__(self, ends: Any) -> None:
        self._ends = ends

    def write_seconds_left(self) -> float:
        return 0.0 if self._ends() else 10.0


def recreate(r: engines.Rig, job: str) -> None:
    """The kubelet and the operator's part: the old pods go, new ones of the same names come."""
    w = r.store.get("pytorchjobs.kubeflow.org", "ml", job)
    for pod in [p for p in r.store.iter_objects("pods") if p["metadata"]["name"].startswith(f"{job}-")]:
        r.store.delete("pods", "ml", pod["metadata"]["name"], grace_seconds=0)
    for i in range(3):
        r.store.create("pods", o.pod(f"{job}-worker-{i}", node=f"gpu-{i}", labels={**LABELS, kinds.KUBEFLOW_JOB_NAME: job},
                                     owner=w))


async def test_a_restart_costs_one_ledger_write_and_its_completion_rides_on_the_units_next_write() -> None:
    async with engines.rig(world(), overrides={"recovery": {"workload_cooldown_seconds": 5.0}}) as r:
        before = dict(r.requests)
        await r.handle(fault("train-1"))
        assert writes(before, r.requests) == {"CREATE ledgerentries.kcover.io": 1, "DELETE pods": 3,
                                              "CREATE events": 1}
        [(key, intent)] = pending(r).items()
        assert (intent["l"], intent["e"], intent["u"][0], intent.get("a")) == ("kcover-test", 1, "train-1", True)
        recreate(r, "train")
        await r.settle(10.0)  # past the cooldown
        new = next(iter(live(r, "train")))
        before = dict(r.requests)
        await r.handle(fault(new))
        assert writes(before, r.requests) == {"UPDATE ledgerentries.kcover.io": 1, "DELETE pods": 3,
                                              "CREATE events": 1}
        assert pending(r)[key]["i"] != intent["i"], "the first intent was dropped by the unit's next write"
        assert len(entries(r)[key]["t"]) == 2


async def test_a_successor_finishes_the_restart_a_leader_recorded_but_died_before_taking_pods_away() -> None:
    async with engines.rig(world()) as r:
        old = live(r, "train")
        async with r.replica("a", fence=Term(lambda: bool(pending(r))), epoch=1) as a:
            with pytest.raises(errors.NotLeaderError):
                await a.handle([fault("train-1")])
        assert r.requests.get("DELETE pods", 0) == 0
        assert not restarts(r)
        [intent] = pending(r).values()
        assert intent["l"] == "a"

        async with r.replica("b", epoch=2) as b:
            before = dict(r.requests)
            await b.resume()
            await r.settle()
            assert writes(before, r.requests) == {"UPDATE ledgerentries.kcover.io": 1, "DELETE pods": 3,
                                                  "CREATE events": 1}
            assert live(r, "train") == set()
            assert live(r, "eval") == {"eval-0", "eval-1", "eval-2"}
            [event] = restarts(r)
            assert event["reportingInstance"] == "b"
            assert "finishing the restart a recorded" in event["message"]
            assert next(iter(pending(r).values()))["l"] == "b", "claimed (fenced) before the removals"
            # the fault replayed to the successor (events held while it followed) finds the restart done
            before = dict(r.requests)
            await b.handle([fault("train-1")])
            await b.resume()
            assert writes(before, r.requests) == {}
        assert old == {"train-0", "train-1", "train-2"}

        # a third leader sees the intent still pending (its completion rides on the next write), but its
        # pods are gone: it restarts nothing and writes nothing
        async with r.replica("c", epoch=3) as c:
            before = dict(r.requests)
            await c.resume()
            assert writes(before, r.requests) == {}
        assert len(restarts(r)) == 1
        assert r.requests["DELETE pods"] == 3


async def test_a_pending_intent_whose_pods_were_replaced_is_not_carried_out_again() -> None:
    async with engines.rig(world()) as r:
        async with r.replica("a", epoch=1) as a:
            await a.handle([fault("train-0")])
        assert pending(r), "a died before its next ledger write: the intent still reads pending"
        recreate(r, "train")
        fresh = live(r, "train")
        async with r.replica("b", epoch=2) as b:
            before = dict(r.requests)
            await b.resume()
            assert writes(before, r.requests) == {}
            assert live(r, "train") == fresh, "the recreated pods are not taken away"
        assert len(restarts(r)) == 1


async def test_an_intent_older_than_the_cooldown_is_given_up_refunded_and_reported() -> None:
    async with engines.rig(world()) as r:
        async with r.replica("a", fence=Term(lambda: bool(pending(r))), epoch=1) as a:
            with pytest.raises(errors.NotLeaderError):
                await a.handle([fault("train-1")])
        (entry,) = entries(r).values()
        assert len(entry["t"]) == 1, "the restart was counted when it was recorded"
        await asyncio.sleep(61.0)  # default workload cooldown: 60 s
        async with r.replica("b", epoch=2) as b:
            await b.resume()
            await r.settle()
        assert r.requests.get("DELETE pods", 0) == 0
        assert not pending(r)
        assert all(not v.get("t") for v in entries(r).values()), "a restart that never happened is refunded"
        (failed,) = r.events("KcoverRecoveryFailed")
        assert failed["involvedObject"]["name"] == "train"
        assert "not counted against its budget" in failed["message"]


async def test_a_forged_intent_naming_another_workload_is_dropped_and_reported() -> None:
    """A LedgerEntry is data, not a command: one that names a workload the key is not its own is refused."""
    async with engines.rig(world()) as r:
        forged = ledgerentries.Intent(id="forged", fault="x", leader="mallory", epoch=9, at=engines.START.timestamp(),
                                      workload=("PyTorchJob", "kubeflow.org/v1", "ml", "eval", "train-uid"),
                                      selector="x=y", uids=("eval-0",), complete=True)
        r.create({"apiVersion": "kcover.io/v1alpha1", "kind": "LedgerEntry", "metadata": {
            "name": "kcover-ledger.w.train-uid", "namespace": "kcover-system",
            "labels": {"kcover.io/ledger": "kcover-ledger"}},
            "data": {"w.train-uid": orjson.dumps(ledgerentries.Unit(restarts=[forged.at], intent=forged).encode()).decode()}})
        await r.tick()
        assert r.requests.get("DELETE pods", 0) == 0
        (refused,) = r.events("KcoverIntentRefused")
        assert "mallory" in refused["message"]
        assert (refused["involvedObject"]["kind"], refused["involvedObject"]["name"]) == (
            "LedgerEntry", "kcover-ledger.w.train-uid"), "the Event is on the LedgerEntry a person can look up"
        assert not pending(r)


QUICK = retrying.Policy(deadline_seconds=0.3, initial_seconds=0.01, max_delay_seconds=0.05)


async def test_a_restart_whose_removals_keep_failing_stays_pending_and_is_retried_without_using_budget() -> None:
    async with engines.rig(world(), overrides={"kube": {"retry_deadline_seconds": 0.3}}) as r:
        old = live(r, "train")
        r.srv.faults.resources = frozenset({"pods"})
        r.srv.faults.error_rate = 1.0  # every pods request answers 500 past the retry deadline
        await r.handle(fault("train-1"))
        assert r.requests["DELETE pods"] >= 3
        assert not restarts(r)
        [key] = pending(r)
        assert len(entries(r)[key]["t"]) == 1
        r.srv.faults.reset()  # the API server recovers: the leader's next pass finishes its own restart
        await r.tick()
        assert len(restarts(r)) == 1
        assert not live(r, "train") & old
        assert len(entries(r)[key]["t"]) == 1, "one restart, one budget slot, however many attempts it took"


async def test_a_deposed_leaders_delayed_removals_cannot_restart_twice() -> None:
    """a loses its term while the server holds its deletes; b finishes the restart and the operator
    recreates the pods; a's late deletes carry the old pods' uids and touch none of the new ones."""
    deposed = False
    async with engines.rig(world()) as r:
        async with r.replica("a", fence=Term(lambda: deposed), epoch=1, retry=QUICK) as a:
            r.srv.faults.resources = frozenset({"pods"})
            r.srv.faults.latency_seconds = 1.0

            async def depose() -> None:
                nonlocal deposed
                await asyncio.sleep(0.5)
                deposed = True

            task = asyncio.create_task(depose())
            held = asyncio.create_task(a.handle([fault("train-1")]))
            await task
            r.srv.faults.reset()
            async with r.replica("b", epoch=2) as b:
                await b.resume()
                await r.settle()
                recreate(r, "train")
                new = live(r, "train")
                await asyncio.sleep(2.0)  # past the moment a's held requests are served
            with pytest.raises(errors.NotLeaderError):
                await held
        assert live(r, "train") == new, "the new pods were not deleted"
        assert len(restarts(r)) == 1


def xid_on(node: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU fell off the bus", recommended=model.Action.CORDON_NODE_AND_RESTART,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                                observed_at=engines.START)


def cordoned(r: engines.Rig, node: str) -> bool:
    return r.store.get("nodes", "", node)["spec"].get("unschedulable") is True


async def test_a_cordon_cut_short_by_the_end_of_a_term_is_finished_by_the_successor() -> None:
    """A cordon is two writes, the Node and the node's ledger entry (which starts its cooldown); the term ends
    as soon as the first lands. The successor, replaying the fault, leaves the node cordoned and restarts its
    jobs. Written the other way round (the entry first, as once), the replay was refused by the cooldown of
    a cordon that never happened, as a routine refusal with no Event: a chaos run lost a node fault so."""
    async with engines.rig(world()) as r:
        old = live(r, "train") | live(r, "eval")

        def landed() -> bool:
            return cordoned(r, "gpu-1") or "c" in entries(r).get("n.gpu-1", {})

        async with r.replica("a", fence=Term(landed), epoch=1) as a:
            with pytest.raises(errors.NotLeaderError):
                await a.handle([xid_on("gpu-1")])
        assert r.requests.get("DELETE pods", 0) == 0, "the term ended before any restart"
        async with r.replica("b", epoch=2) as b:
            await b.resume()
            await b.handle([xid_on("gpu-1")])
            await r.settle()
        assert cordoned(r, "gpu-1")
        assert not (live(r, "train") | live(r, "eval")) & old, "both jobs on the node restarted"


async def test_a_cordon_landed_without_its_ledger_entry_is_entered_by_the_successor() -> None:
    """The term ends as soon as the Node write lands, before the node's ledger entry. The successor's first
    load of the ledger finds kcover's cordon on the node and enters it (its cooldown and the breaker's
    window count it); a replayed fault then writes nothing more. Before, the replay met "already cordoned"
    at plan time and the cordon was never entered."""
    async with engines.rig(world()) as r:
        async with r.replica("a", fence=Term(lambda: cordoned(r, "gpu-1")), epoch=1) as a:
            with pytest.raises(errors.NotLeaderError):
                await a.handle([xid_on("gpu-1")])
        assert cordoned(r, "gpu-1")
        assert "c" not in entries(r).get("n.gpu-1", {}), "the term ended before the entry"
        landed = r.store.get("nodes", "", "gpu-1")["metadata"]["annotations"][proj.CORDONED_AT]
        async with r.replica("b", epoch=2) as b:
            await b.resume()
            assert entries(r)["n.gpu-1"]["c"] == clock_.parse_time(landed).timestamp()
            await asyncio.sleep(engine.ENTRY_SETTLE_SECONDS + 1)
            await b.resume()  # the periodic pass looks again: the entry holds the cordon
            await b.handle([xid_on("gpu-1")])
            await r.settle()
            entered = [x for x in b.inner.outcomes if isinstance(x.step, st.EnterCordon)]
            assert [(x.step.node, type(x)) for x in entered] == [("gpu-1", st.Done)], "entered once"
        assert cordoned(r, "gpu-1")


async def test_a_cordon_found_on_a_node_with_its_entry_written_is_not_entered_again() -> None:
    """A complete cordon (the Node and its entry both written): the successor's load writes nothing."""
    async with engines.rig(world()) as r:
        async with r.replica("a", epoch=1) as a:
            await a.handle([xid_on("gpu-1")])
            await r.settle()
        assert cordoned(r, "gpu-1")
        assert "c" in entries(r)["n.gpu-1"]
        before = dict(r.requests)
        async with r.replica("b", epoch=2) as b:
            await b.resume()
            await r.settle()
        assert not {k for k in writes(before, r.requests) if "ledgerentries" in k}


def test_a_held_entry_keeps_its_workload_and_one_written_without_it_still_reads() -> None:
    """The held entry names its workload, so a successor can name the Recovery the hold left; an entry
    written before it was kept reads with none, and names no Recovery."""
    held = ledgerentries.HeldRestart(code="Paused", text="paused", at=1.0, until=2.0,
                                     cause=fault("train-0").model_dump_json(), workload="PyTorchJob/ml/train")
    assert ledgerentries.HeldRestart.decode(orjson.loads(orjson.dumps(held.encode()))) == held
    namespace, name = recoveries.held_ref("w.train-uid", held) or ("", "")
    assert namespace == "ml"
    assert name.startswith("pytorchjob-train-")
    older = ledgerentries.HeldRestart.decode({k: v for k, v in held.encode().items() if k != "w"})
    assert older is not None
    assert older.workload == ""
    assert recoveries.held_ref("w.train-uid", older) is None
