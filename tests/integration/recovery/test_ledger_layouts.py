"""The per-unit ledger (`recovery.ledger_layout: per-unit`) on every cluster backend: what the API server holds
after restarts, cordons and failovers, and the fencing, cooldowns, budgets and intents a successor honours.

Two `Ledger`s over separate clients stand for two replicas (one the old leader, one its successor, or two
that both believe they lead). On `apiserver` the LedgerEntry CRD comes with the session's test CRDs
(tests/controlplane/crds/kcover-ledgerentries.yaml, the chart's file).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from kcover import settings
from kcover.recovery import ledger, policy, sharding

Cluster = Any
NAME = "kcover-ledger"
RETENTION = 3600.0
RS = settings.RecoverySettings(workload_cooldown_seconds=60, max_restarts_per_window=2)


def _ledger(cluster: Cluster, kube: Any = None) -> ledger.Ledger:
    return ledger.Ledger(kube or cluster.client, namespace=cluster.namespace, name=NAME, is_leader=lambda: True,
                         retention_seconds=lambda: RETENTION, layout="per-unit")


async def _entries(cluster: Cluster) -> dict[str, dict[str, str]]:
    listed = await cluster.client.request("GET", f"/apis/{sharding.API_VERSION}/namespaces/{cluster.namespace}/"
                                          f"{sharding.PLURAL}")
    return {i["metadata"]["name"]: i.get("data") or {} for i in listed["items"]}


def _intent(uid: str, at: float) -> ledger.Intent:
    return ledger.Intent(id=f"i-{uid}", fault="f1", leader="a", epoch=1, at=at,
                         workload=("PyTorchJob", "kubeflow.org/v1", "ml", "train", uid),
                         selector="training.kubeflow.org/job-name=train", uids=("p0", "p1"), message="restart")


def _restart(key: str, now: float, *, intent: ledger.Intent | None = None, signal: str = "") -> Any:
    """The executor's restart record: refused (cooldown, budget) from what the ledger holds, else recorded."""
    def record(state: ledger.State) -> tuple[Any, str, bool] | None:
        refusal = policy.restart_refusal(key, state.history(), RS, now, what=key)
        if refusal is None:
            state.restarts.setdefault(key, []).append(now)
            state.notes[key] = "PyTorchJob ml/train"
            if intent is not None:
                state.intents[key] = intent
            state.remember(signal, key, now)
        return refusal
    return record


async def test_a_restart_writes_one_small_object_that_a_successor_honours(cluster: Cluster) -> None:
    now = time.time()
    old = _ledger(cluster)
    await old.load()
    assert await old.update(_restart("w.u1", now, intent=_intent("u1", now), signal="ev-1:1"), now=now) is None
    assert old._store is not None
    assert old._store.requests == 1  # one object written: the unit's
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
        refusal = await successor.update(_restart("w.u1", now + 1), now=now + 1)  # within the cooldown
        assert refusal is not None
        assert refusal[0].value == "Cooldown"
        assert await successor.update(_restart("w.u1", now + 61), now=now + 61) is None
        refusal = await successor.update(_restart("w.u1", now + 122), now=now + 122)  # past the budget of 2
        assert refusal is not None
        assert refusal[0].value == "BudgetExhausted"
        history = successor.history()
    assert history.restarts["w.u1"] == (round(now, 3), now + 61)


async def test_two_replicas_recording_one_unit_conflict_and_the_second_refuses(cluster: Cluster) -> None:
    now = time.time()
    async with cluster.new_client() as kube:
        a, b = _ledger(cluster), _ledger(cluster, kube)
        await a.load()
        await b.load()  # both read the empty ledger, both believe they lead
        assert await a.update(_restart("w.u1", now), now=now) is None
        refusal = await b.update(_restart("w.u1", now + 0.5), now=now + 0.5)
        assert b.conflicts == 1  # its create met a's object: it re-read that object only, and refused
        assert refusal is not None
        assert refusal[0].value == "Cooldown"
        assert await b.update(_restart("w.u2", now + 0.5), now=now + 0.5) is None  # another unit: no conflict
        assert b.conflicts == 1
    entries = await _entries(cluster)
    assert sorted(entries) == [f"{NAME}.w.u1", f"{NAME}.w.u2"]
    assert orjson.loads(entries[f"{NAME}.w.u1"]["w.u1"])["t"] == [round(now, 3)]


async def test_an_earlier_versions_configmap_ledger_is_taken_over(cluster: Cluster) -> None:
    now = time.time()
    old = ledger.State(restarts={"w.u1": [now - 10], "w.u2": [now - 20]}, notes={"w.u1": "a", "w.u2": "b"},
                       intents={"w.u1": _intent("u1", now - 10)}, cordons={"gpu-1": now - 30},
                       cordon_reasons={"gpu-1": "XID79"})
    old.remember("ev-9:1", "w.u2", now - 20)
    await cluster.client.request("POST", f"/api/v1/namespaces/{cluster.namespace}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME}, "data": old.encode()})
    led = _ledger(cluster)
    await led.load()
    assert led.pending()["w.u1"].id == "i-u1"
    assert set(led.history().restarts) == {"w.u1", "w.u2"}
    assert led.history().cordons == {"gpu-1": round(old.cordons["gpu-1"], 3)}
    assert await led.update(_restart("w.u3", now), now=now) is None
    cm = await cluster.client.request("GET", f"/api/v1/namespaces/{cluster.namespace}/configmaps/{NAME}")
    assert not cm.get("data")
    entries = await _entries(cluster)
    assert sorted(entries) == [f"{NAME}.n.gpu-1", f"{NAME}.w.u1", f"{NAME}.w.u2", f"{NAME}.w.u3"]
    assert "ev-9:1|w.u2" in orjson.loads(entries[f"{NAME}.w.u2"]["signals"])
    fresh = _ledger(cluster)
    await fresh.load()
    assert fresh.pending()["w.u1"].id == "i-u1"
    assert set(fresh.history().restarts) == {"w.u1", "w.u2", "w.u3"}


async def test_units_past_retention_are_deleted_a_few_per_write(cluster: Cluster) -> None:
    now = time.time()
    led = _ledger(cluster)
    await led.load()
    count = sharding.DELETES_PER_WRITE + 4

    def old_restarts(state: ledger.State) -> None:
        for i in range(count):
            state.restarts[f"w.old{i}"] = [now - RETENTION - 10]
    assert await led.update(old_restarts, now=now - RETENTION - 10) is None
    assert len(await _entries(cluster)) == count
    assert await led.update(_restart("w.new", now), now=now) is None  # prunes: the first deletes
    assert len(await _entries(cluster)) == 1 + count - sharding.DELETES_PER_WRITE
    assert await led.update(_restart("w.other", now), now=now) is None  # the rest
    assert sorted(await _entries(cluster)) == [f"{NAME}.w.new", f"{NAME}.w.other"]
