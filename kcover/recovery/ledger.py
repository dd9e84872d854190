"""The recovery ledger: restart times, restart intents and cordons, kept in one ConfigMap so a new leader honours them.

Owns the ConfigMap `recovery.ledger_namespace/ledger_name`: one data key per restart unit
(`w.<workload uid>` or `w.<uid>.g<group>` for a LeaderWorkerSet group) holding compact JSON
`{"t": [epoch seconds...], "d": "<what>", "p": {<intent>}}`, and one per node (`n.<node>`) holding
`{"c": epoch, "r": reason}`.

Intents: a restart is written as a *pending* `Intent` (who leads, its epoch, the fault, the selector,
the faulting pod and a sample of the pod uids to delete) in the same write that records its time.
Its completion is not a write of its own: once the DeleteCollection succeeded the executor calls
`complete()`, and the next write of this ledger (by anyone holding this object) drops the intent. So a
restart costs one ledger write, and a leader killed between that write and the delete leaves an
intent a successor can finish (`executing.Executor.resume`) instead of a cooldown that blocks it.
An intent left pending by a leader that did delete is recognised by its pods being gone.

Signals: the outside signals acted on (`CollectorEvent.signal`, an annotated Event's uid and count),
each with the unit it moved (`<signal>|w.<uid>`, `<signal>|n.<node>`), live in one data key
(`signals`) as `{key: epoch seconds}`, written in the same fencing write as the restart or cordon they
caused. A new leader, a restarted controller or a replay therefore never acts twice on one signal.
They are pruned with everything else (the retention covers the event watcher's staleness window
many times over) and bounded to `MAX_SIGNALS`, oldest dropped.

Dry run: `dry_update()` records in memory only (`history(dry_run=True)` sees it), so a dry run
honours cooldowns and budgets as the real run would, without writing anything.

Layouts (`recovery.ledger_layout`): `per-unit`, the default, keeps each key (with the signals that moved
that unit) in an object of its own, a `LedgerEntry` (`sharding`): a write sends only the units that changed,
each with its own resourceVersion as the fencing precondition, no object grows with the number of
workloads, and entries past retention are pruned at most every `PER_UNIT_PRUNE_SECONDS`. `single` keeps
everything in the one ConfigMap described below, which `per-unit` takes over on its first write.
tests/recovery/probe_ledger_scale.py measures both at 100, 1,000 and 10,000 workloads.

Why a ConfigMap rather than annotations on each workload: one object to read at start (no LIST of
every workload kind), no write permission on users' custom resources, node and workload state in one
place, and the write is a plain PUT with the resourceVersion as precondition. That precondition is
also the fencing: a restart or cordon is recorded here *before* the delete or node write, so if two
replicas both believe they lead, only one record succeeds; the other gets 409, re-reads, re-checks
cooldown and budget against what the winner wrote, and refuses.

Reads happen once (`load()`) and after each 409; a steady-state restart costs one write here (its
intent; the completion rides on the next write).
Size: entries older than the longest window are pruned on every write; with the default budget of
five restarts an entry is under 150 bytes (a pending intent adds under 1 KiB until the next write), so the 1 MiB ConfigMap limit holds about 7,000 workloads
restarted within one window. Past ~900 KiB the oldest entries are dropped and `ledger_full` is logged.

Fails with `errors.NotLeaderError` when asked to write while not leading, `errors.KubeError` when the
API keeps refusing (after `MAX_ATTEMPTS` conflicts, or on other errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import structlog

from kcover import errors
from kcover.kube import client as kube_client
from kcover.kube import retrying
from kcover.recovery import policy, sharding

log = structlog.get_logger()

MAX_INTENT_UIDS = 16
"""Pod uids an intent keeps (the faulting pod first): enough to tell whether the delete happened."""
MAX_ATTEMPTS = 5
"""Read-modify-write attempts before giving up on a contended ledger."""
MAX_SIGNALS = 2000
"""Signals remembered at most (about 150 bytes each): far more than cooldowns and breakers let kcover act on
within an Event's staleness window."""
PER_UNIT_PRUNE_SECONDS = 60.0
"""With the per-unit layout, entries past retention are pruned at most this often (pruning reads every entry;
an entry a minute past its retention is harmless: every check compares times with its window)."""
PER_UNIT_MAX_SIGNALS = 1_000_000
"""Signals remembered with the per-unit layout, where each lives with its unit: bounded by the retention and
the budgets, not by the size of one object."""
SIGNALS_KEY = "signals"
SIZE_LIMIT = 900 * 1024
"""Bytes of data kept; the API server refuses ConfigMaps past 1 MiB in all."""

T = TypeVar("T")


@dataclass(frozen=True)
class Intent:
    """A restart recorded before its delete: what a successor needs to tell whether it happened, and finish it."""

    id: str
    fault: str
    """The `CollectorEvent.id` that caused it."""
    leader: str
    """Identity of the replica that recorded it."""
    epoch: int
    """That replica's leadership epoch when it recorded it."""
    at: float
    """Epoch seconds it was recorded (the restart time in `State.restarts`)."""
    workload: tuple[str, str, str, str, str]
    """(kind, apiVersion, namespace, name, uid) of the workload."""
    selector: str = ""
    """The label selector of the DeleteCollection; empty when `pods` is used instead."""
    pods: tuple[tuple[str, str, str], ...] | None = None
    """(namespace, name, uid) of the pods to delete one by one when the labels were not safe."""
    pod: tuple[str, str, str] | None = None
    """(namespace, name, uid) of the faulting pod, re-checked before the delete."""
    uids: tuple[str, ...] = ()
    """Uids of pods the delete removes (the faulting pod first, at most `MAX_INTENT_UIDS`)."""
    message: str = ""
    """What and why, for the Event of a successor that finishes it."""
    unit: str = ""

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"i": self.id, "f": self.fault, "l": self.leader, "e": self.epoch,
                               "t": round(self.at, 3), "w": list(self.workload), "u": list(self.uids),
                               "m": self.message}
        if self.selector:
            out["s"] = self.selector
        if self.pods is not None:
            out["sp"] = [list(p) for p in self.pods]
        if self.pod is not None:
            out["p"] = list(self.pod)
        if self.unit:
            out["n"] = self.unit
        return out

    @classmethod
    def decode(cls, raw: Any) -> Intent | None:
        """None for anything malformed (an unreadable intent is treated as absent, and logged)."""
        if not isinstance(raw, dict):
            return None
        try:
            workload = tuple(str(x) for x in raw["w"])
            pods = raw.get("sp")
            pod = raw.get("p")
            if len(workload) != 5 or (pod is not None and len(pod) != 3):
                return None
            return cls(id=str(raw["i"]), fault=str(raw.get("f", "")), leader=str(raw["l"]), epoch=int(raw["e"]),
                       at=float(raw["t"]), workload=(workload[0], workload[1], workload[2], workload[3], workload[4]),
                       selector=str(raw.get("s", "")),
                       pods=None if pods is None else tuple((str(p[0]), str(p[1]), str(p[2])) for p in pods),
                       pod=None if pod is None else (str(pod[0]), str(pod[1]), str(pod[2])),
                       uids=tuple(str(u) for u in raw.get("u") or ())[:MAX_INTENT_UIDS],
                       message=str(raw.get("m", "")), unit=str(raw.get("n", "")))
        except (KeyError, TypeError, ValueError, IndexError):
            return None


@dataclass
class State:
    """The parsed ledger. Mutated only on copies inside `Ledger.update()`."""

    restarts: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    cordons: dict[str, float] = field(default_factory=dict)
    cordon_reasons: dict[str, str] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    """Ledger key -> the restart of that unit recorded but not known to be done."""
    signals: dict[str, float] = field(default_factory=dict)
    """`<signal>|<unit>` -> when kcover acted on that signal for that unit (a restart unit's ledger key,
    or `n.<node>`)."""

    def copy(self) -> State:
        return State({k: list(v) for k, v in self.restarts.items()}, dict(self.notes), dict(self.cordons),
                     dict(self.cordon_reasons), dict(self.intents), dict(self.signals))

    def acted_on(self, signal: str, unit: str) -> float | None:
        """When kcover acted on `signal` for `unit`, or None (also for an empty signal)."""
        return self.signals.get(f"{signal}|{unit}") if signal else None

    def remember(self, signal: str, unit: str, now: float) -> None:
        """Record that `signal` moved `unit` (nothing for an empty signal)."""
        if signal:
            self.signals[f"{signal}|{unit}"] = now

    def merged(self, other: State) -> State:
        """A copy holding both states' restart times and cordons (for the dry-run overlay); intents of self."""
        out = self.copy()
        for key, times in other.restarts.items():
            out.restarts[key] = sorted(set(out.restarts.get(key, [])) | set(times))
            out.notes.setdefault(key, other.notes.get(key, ""))
        for node, at in other.cordons.items():
            if at > out.cordons.get(node, float("-inf")):
                out.cordons[node] = at
                out.cordon_reasons[node] = other.cordon_reasons.get(node, "")
        for key, at in other.signals.items():
            out.signals[key] = max(at, out.signals.get(key, at))
        return out

    def finish(self, completed: dict[str, str]) -> list[str]:
        """Drop the intents `completed` names (key -> intent id, ids must match); returns the keys dropped."""
        dropped = [k for k, i in completed.items() if k in self.intents and self.intents[k].id == i]
        for key in dropped:
            del self.intents[key]
        return dropped

    def history(self, in_flight_restarts: int = 0) -> policy.History:
        return policy.History(restarts={k: tuple(v) for k, v in self.restarts.items()},
                              cordons=dict(self.cordons), in_flight_restarts=in_flight_restarts)

    def prune(self, before: float, max_signals: int = MAX_SIGNALS) -> None:
        for key in list(self.restarts):
            kept = [t for t in self.restarts[key] if t >= before]
            if kept:
                self.restarts[key] = kept
            else:
                del self.restarts[key]
                self.notes.pop(key, None)
        for key in [k for k, i in self.intents.items() if i.at < before or k not in self.restarts]:
            del self.intents[key]
        for node in [n for n, t in self.cordons.items() if t < before]:
            del self.cordons[node]
            self.cordon_reasons.pop(node, None)
        recent = sorted(((at, key) for key, at in self.signals.items() if at >= before), reverse=True)
        self.signals = {key: at for at, key in recent[:max_signals]}

    def encode(self) -> dict[str, str]:
        data: dict[str, str] = {}
        for key, times in self.restarts.items():
            entry: dict[str, Any] = {"t": [round(t, 3) for t in times], "d": self.notes.get(key, "")}
            if key in self.intents:
                entry["p"] = self.intents[key].encode()
            data[key] = orjson.dumps(entry).decode()
        for node, at in self.cordons.items():
            data[f"n.{node}"] = orjson.dumps({"c": round(at, 3), "r": self.cordon_reasons.get(node, "")}).decode()
        if self.signals:
            data[SIGNALS_KEY] = orjson.dumps({k: round(t, 3) for k, t in self.signals.items()}).decode()
        return data

    def changed_units(self, old: State) -> set[str]:
        """Ledger keys (`w.*`, `n.*`) whose entry or signals differ from `old`: what a per-unit write sends."""
        keys = {k for k, v in self.restarts.items() if old.restarts.get(k) != v}
        keys |= old.restarts.keys() - self.restarts.keys()
        keys |= {k for k, v in self.notes.items() if old.notes.get(k) != v}
        keys |= {k for k in self.intents.keys() | old.intents.keys() if self.intents.get(k) != old.intents.get(k)}
        keys |= {f"n.{n}" for n in self.cordons.keys() | old.cordons.keys()
                 if (self.cordons.get(n), self.cordon_reasons.get(n)) != (old.cordons.get(n), old.cordon_reasons.get(n))}
        keys |= {k.rpartition("|")[2] for k, _ in self.signals.items() ^ old.signals.items()}
        return keys

    def encode_units(self, keys: set[str]) -> dict[str, dict[str, str]]:
        """`encode()` for some keys only: key -> that unit's data (its entry, its signals as `signals`);
        empty for a unit with nothing left."""
        out: dict[str, dict[str, str]] = {key: {} for key in keys}
        for key in keys:
            if key.startswith("n."):
                node = key[2:]
                if node in self.cordons:
                    out[key][key] = orjson.dumps({"c": round(self.cordons[node], 3),
                                                  "r": self.cordon_reasons.get(node, "")}).decode()
            elif key in self.restarts:
                entry: dict[str, Any] = {"t": [round(t, 3) for t in self.restarts[key]], "d": self.notes.get(key, "")}
                if key in self.intents:
                    entry["p"] = self.intents[key].encode()
                out[key][key] = orjson.dumps(entry).decode()
        held: dict[str, dict[str, float]] = {}
        for signal_key, at in self.signals.items():
            unit = signal_key.rpartition("|")[2]
            if unit in out:
                held.setdefault(unit, {})[signal_key] = round(at, 3)
        for unit, signals in held.items():
            out[unit][SIGNALS_KEY] = orjson.dumps(dict(sorted(signals.items()))).decode()
        return out

    @classmethod
    def decode(cls, data: dict[str, str]) -> State:
        state = cls()
        for key, raw in data.items():
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                log.warning("ledger_entry_unreadable", key=key)
                continue
            if not isinstance(entry, dict):
                continue
            if key == SIGNALS_KEY:
                state.signals = {str(k): float(t) for k, t in entry.items()
                                 if isinstance(t, int | float) and not isinstance(t, bool)}
            elif key.startswith("n.") and isinstance(entry.get("c"), int | float):
                state.cordons[key[2:]] = float(entry["c"])
                state.cordon_reasons[key[2:]] = str(entry.get("r", ""))
            elif key.startswith("w.") and isinstance(entry.get("t"), list):
                state.restarts[key] = sorted(float(t) for t in entry["t"] if isinstance(t, int | float))
                state.notes[key] = str(entry.get("d", ""))
                if "p" in entry:
                    intent = Intent.decode(entry["p"])
                    if intent is None:
                        log.warning("ledger_intent_unreadable", key=key)
                    else:
                        state.intents[key] = intent
        return state


class Ledger:
    """In-memory copy of the ledger ConfigMap plus fenced read-modify-write of it."""

    def __init__(self, kube: kube_client.KubeClient, *, namespace: str, name: str,
                 is_leader: Callable[[], bool], retention_seconds: Callable[[], float],
                 fence: retrying.Fence | None = None, layout: str = "single") -> None:
        self._kube = kube
        self._store = (sharding.PerUnitStore(kube, namespace=namespace, name=name, fence=fence)
                       if layout == "per-unit" else None)
        """The per-unit layout (`recovery.ledger_layout`); None: the one ConfigMap."""
        self._max_signals = MAX_SIGNALS if self._store is None else PER_UNIT_MAX_SIGNALS
        self._pruned_at = float("-inf")
        self._fence = fence
        self.namespace = namespace
        self.name = name
        self._is_leader = is_leader
        self._retention = retention_seconds
        self._state = State()
        self._rv: str | None = None
        self._exists = False
        self._loaded = False
        self._lock = asyncio.Lock()
        self._completed: dict[str, str] = {}
        """Ledger key -> id of an intent carried out here; dropped from the ConfigMap by the next write."""
        self._dry = State()
        """What a dry run would have recorded (never written)."""
        self.conflicts = 0
        self.writes = 0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    def history(self, in_flight_restarts: int = 0, *, dry_run: bool = False) -> policy.History:
        """Restarts and cordons the ledger holds; with `dry_run`, plus what dry runs recorded in memory."""
        state = self._state.merged(self._dry) if dry_run else self._state
        return state.history(in_flight_restarts)

    def pending(self) -> dict[str, Intent]:
        """Intents the ConfigMap holds as pending, less those completed here (ledger key -> intent)."""
        return {k: i for k, i in self._state.intents.items() if self._completed.get(k) != i.id}

    def complete(self, key: str, intent_id: str) -> None:
        """Mark an intent carried out; the next write drops it from the ConfigMap (no write of its own)."""
        self._completed[key] = intent_id

    def dry_update(self, mutate: Callable[[State], T | None], *, now: float) -> T | None:
        """`update()` for a dry run: `mutate` sees the ledger plus earlier dry records; kept in memory only."""
        state = self._state.merged(self._dry)
        refusal = mutate(state)
        if refusal is None:
            state.intents.clear()
            state.prune(now - self._retention())
            self._dry = state
        return refusal

    async def load(self) -> None:
        """Read the ConfigMap (absent means empty), or every object of the per-unit layout."""
        if self._store is not None:
            self._state, self._exists, self._loaded = State.decode(await self._store.load()), True, True
            return
        try:
            obj = await self._kube.request("GET", self.path)
        except errors.NotFoundError:
            self._state, self._rv, self._exists = State(), None, False
        else:
            data = obj.get("data") or {}
            self._state = State.decode({str(k): str(v) for k, v in data.items()})
            self._rv = str(obj["metadata"]["resourceVersion"])
            self._exists = True
        self._loaded = True

    async def ensure_loaded(self) -> None:
        """Read the ConfigMap once, however many callers ask at the same time."""
        async with self._lock:
            if not self._loaded:
                await self.load()

    async def update(self, mutate: Callable[[State], T | None], *, now: float) -> T | None:
        """Apply `mutate` to a copy of the current state and write it with the RV as precondition.

        `mutate` returns None to write, or a refusal (anything else) to write nothing and return it.
        On 409 the ledger is re-read and `mutate` runs again on what the other writer left.
        """
        async with self._lock:
            if not self._loaded:
                await self.load()
            for _attempt in range(MAX_ATTEMPTS):
                state = self._state.copy()
                finished = state.finish(self._completed)
                refusal = mutate(state)
                if refusal is not None:
                    return refusal
                pruning = self._store is None or now - self._pruned_at >= PER_UNIT_PRUNE_SECONDS
                if pruning:
                    state.prune(now - self._retention(), self._max_signals)
                try:
                    if self._store is not None and not self._store.taking_over:  # only the units that changed
                        await self._store.write_units(state.encode_units(state.changed_units(self._state)),
                                                      guard=self._guard)
                        self.writes += 1
                    else:
                        await self._write(self._bounded(state))
                    if pruning:
                        self._pruned_at = now
                except errors.ConflictError:
                    self.conflicts += 1
                    log.info("ledger_conflict", name=self.name, attempt=_attempt + 1)
                    if self._store is not None:  # only the objects that conflicted are read again
                        self._state = State.decode(await self._store.refresh())
                    else:
                        await self.load()
                    continue
                except errors.NotFoundError:
                    if not self._exists:
                        raise
                    self._exists = False
                    self._rv = None
                    continue
                self._state = state
                for key in finished:
                    self._completed.pop(key, None)
                return None
            raise errors.KubeError(f"ledger {self.namespace}/{self.name}: still conflicting after "
                                   f"{MAX_ATTEMPTS} attempts", status=409)

    def _bounded(self, state: State) -> dict[str, str]:
        data = state.encode()
        if self._store is not None:
            return data  # per unit: no object grows with the number of workloads
        size = sum(len(k) + len(v) for k, v in data.items())
        if size <= SIZE_LIMIT:
            return data
        log.warning("ledger_full", name=self.name, bytes=size)
        oldest = sorted(state.restarts, key=lambda k: state.restarts[k][-1])
        while oldest and size > SIZE_LIMIT:
            key = oldest.pop(0)
            size -= len(key) + len(data.pop(key))
            del state.restarts[key]
            state.notes.pop(key, None)
            state.intents.pop(key, None)
        return data

    def _guard(self) -> None:
        if not self._is_leader():
            raise errors.NotLeaderError("not leading: ledger not written")

    async def _write(self, data: dict[str, str]) -> None:
        if self._store is not None:
            await self._store.write(data, guard=self._guard)
            self.writes += 1
            return
        self._guard()
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.name, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/managed-by": "kcover"}},
                                "data": data}
        if self._exists:
            body["metadata"]["resourceVersion"] = self._rv
            result = await self._kube.request("PUT", self.path, body=body, fence=self._fence)
        else:
            result = await self._kube.request("POST", f"/api/v1/namespaces/{self.namespace}/configmaps",
                                              body=body, fence=self._fence)
        self.writes += 1
        self._rv = str(result["metadata"]["resourceVersion"])
        self._exists = True
