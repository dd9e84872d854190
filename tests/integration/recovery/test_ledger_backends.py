"""The ledger on every cluster backend: what the API server holds after restarts and failovers, and the
fencing, cooldowns, budgets and intents a successor honours.

Two `Ledger`s over separate clients stand for two replicas (one the old leader, one its successor, or two
that both believe they lead), writing through the product's gateway. On `apiserver` the LedgerEntry CRD
comes with the session's test CRDs (tests/controlplane/crds/kcover-ledgerentries.yaml, the chart's file).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from kcover import settings
from kcover.kube import client as client_
from kcover.kube import gateway
from kcover.recovery import admission, ledger, ledgerentries

Cluster = Any
NAME = "kcover-ledger"
RETENTION = 3600.0
RS = settings.RecoverySettings(max_restarts_per_window=2, workload_cooldown_seconds=60)


def _ledger(cluster: Cluster, kube: client_.KubeClient | None = None) -> ledger.Ledger:
    return ledger.Ledger(gateway.Http(kube or cluster.client), namespace=cluster.namespace, name=NAME,
                         retention_seconds=lambda: RETENTION)


async def _entries(cluster: Cluster) -> dict[str, dict[str, str]]:
    listed = await cluster.client.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{cluster.namespace}/ledgerentries")
    return {i["metadata"]["name"]: i.get("data") or {} for i in listed["items"]}


def _intent(uid: str, at: float) -> ledgerentries.Intent:
    return ledgerentries.Intent(id=f"i-{uid}", fault="f1", leader="a", epoch=1, at=at,
                                workload=("PyTorchJob", "kubeflow.org/v1", "ml", "train", uid),
                                selector="training.kubeflow.org/job-name=train", uids=("p0", "p1"), message="restart")


def _restart(key: str, now: float, *, intent: ledgerentries.Intent | None = None, signal: str = "") -> Any:
    """The restart executor's record: refused by `admission` from what the entry holds, else recorded."""
    def record(entry: ledgerentries.Entry, signals: dict[str, float]) -> admission.Refusal | None:
        assert isinstance(entry, ledgerentries.Unit)
        refused = (admission.replayed(signals.get(f"{signal}|{key}") if signal else None, signal, key)
                   or admission.restart(entry, what=key, rs=RS, now=now, breaker_state=ledgerentries.Breaker(), load=None))
        if refused is None:
            entry.record(now, "gpu-1")
            entry.note = "PyTorchJob ml/train"
            entry.intent = intent
            if signal:
                signals[f"{signal}|{key}"] = now
        return refused
    return record


async def test_a_restart_writes_one_small_object_that_a_successor_honours(cluster: Cluster) -> None:
    now = time.time()
    old = _ledger(cluster)
    await old.load()
    assert await old.update("w.u1", _restart("w.u1", now, intent=_intent("u1", now), signal="ev-1:1"), now=now) is None
    assert old.writes == 1  # one object written: the unit's
    entries = await _entries(cluster)
    assert list(entries) == [f"{NAME}.w.u1"]
    data = entries[f"{NAME}.w.u1"]
    assert sum(len(k) + len(v) for k, v in data.items()) < 2048
    assert orjson.loads(data["w.u1"])["p"]["i"] == "i-u1"
    assert orjson.loads(data["signals"]) == {"ev-1:1|w.u1": round(now, 3)}

    async with cluster.new_client() as kube:
        successor = _ledger(cluster, kube)
        await successor.load()
        assert successor.pending()["w.u1"].id == "i-u1"
        refusal = await successor.update("w.u1", _restart("w.u1", now + 1), now=now + 1)  # within the cooldown
        assert isinstance(refusal, admission.Refusal)
        assert refusal.code.value == "Cooldown"
        replay = await successor.update("w.u1", _restart("w.u1", now + 61, signal="ev-1:1"), now=now + 61)
        assert isinstance(replay, admission.Refusal)
        assert replay.code.value == "AlreadyActedOn"
        assert await successor.update("w.u1", _restart("w.u1", now + 61), now=now + 61) is None
        refusal = await successor.update("w.u1", _restart("w.u1", now + 122), now=now + 122)  # past the budget of 2
        assert isinstance(refusal, admission.Refusal)
        assert refusal.code.value == "BudgetExhausted"
        unit = successor.unit("w.u1")
        assert unit is not None
        assert unit.restarts == [round(now, 3), now + 61]
        assert unit.placed() == ["gpu-1", "gpu-1"]


async def test_two_replicas_recording_one_unit_conflict_and_the_second_refuses(cluster: Cluster) -> None:
    now = time.time()
    async with cluster.new_client() as kube:
        a, b = _ledger(cluster), _ledger(cluster, kube)
        await a.load()
        await b.load()  # both read the empty ledger, both believe they lead
        assert await a.update("w.u1", _restart("w.u1", now), now=now) is None
        refusal = await b.update("w.u1", _restart("w.u1", now + 0.5), now=now + 0.5)
        assert b.conflicts == 1  # its create met a's object: it re-read that object only, and refused
        assert isinstance(refusal, admission.Refusal)
        assert refusal.code.value == "Cooldown"
        assert await b.update("w.u2", _restart("w.u2", now + 0.5), now=now + 0.5) is None  # another unit
        assert b.conflicts == 1
    entries = await _entries(cluster)
    assert sorted(entries) == [f"{NAME}.w.u1", f"{NAME}.w.u2"]
    assert orjson.loads(entries[f"{NAME}.w.u1"]["w.u1"])["t"] == [round(now, 3)]


async def test_units_past_retention_are_deleted_a_few_per_write(cluster: Cluster) -> None:
    now = time.time()
    led = _ledger(cluster)
    await led.load()
    count = ledger.DELETES_PER_WRITE + 4
    for i in range(count):
        assert await led.update(f"w.old{i}", _restart(f"w.old{i}", now - RETENTION - 10),
                                now=now - RETENTION - 10) is None
    assert len(await _entries(cluster)) == count
    assert await led.update("w.new", _restart("w.new", now), now=now) is None  # the first deletes
    assert len(await _entries(cluster)) == 1 + count - ledger.DELETES_PER_WRITE
    assert await led.update("w.other", _restart("w.other", now), now=now) is None  # the rest
    assert sorted(await _entries(cluster)) == [f"{NAME}.w.new", f"{NAME}.w.other"]


async def test_the_breaker_entry_is_one_object_both_replicas_agree_on(cluster: Cluster) -> None:
    now = time.time()
    async with cluster.new_client() as kube:
        a, b = _ledger(cluster), _ledger(cluster, kube)
        await a.load()
        await b.load()

        def latch(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Breaker)
            if entry.latched:
                return "already latched"
            entry.opened_at, entry.reason = now, "2 of 10 GPU nodes cordoned"
            return None

        assert await a.update(ledgerentries.BREAKER_KEY, latch, now=now) is None
        assert await b.update(ledgerentries.BREAKER_KEY, latch, now=now) == "already latched"  # re-read on its 409
        assert b.breaker().latched
    fresh = _ledger(cluster)
    await fresh.load()
    assert fresh.breaker().reason == "2 of 10 GPU nodes cordoned"
