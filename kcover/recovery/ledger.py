"""The recovery ledger: what kcover did and intends, in the cluster, so a new leader honours it.

Owns the ledger's state and its storage. One `LedgerEntry` object (kcover.io/v1alpha1,
helm/kcover/files/ledgerentry-crd.yaml) per key, named `<ledger>.<key>` (a hash where the key is not a
valid name), labelled `kcover.io/ledger=<ledger>`, in `recovery.ledger_namespace`:

* a restart unit, `w.<workload uid>` or `w.<uid>.g<group>` (a LeaderWorkerSet group): its restart times
  (cooldown and budget) with where each fault was (the evidence a node's blame reads), a note, the pending
  restart `Intent`, a held restart (`HeldRestart`);
* a node, `n.<node>`: when kcover last cordoned it and why, and which of its DRA devices kcover holds
  tainted since when (`TaintedDevice`: the caps on device taints and their bounded life read these);
* the breaker, `breaker`: whether it is latched, why, since when, and when it was last reset;

each with the outside signals that moved it (`<signal>|<key>` -> epoch seconds), so a replay never acts
twice. Data: `{<key>: compact JSON, "signals": compact JSON}`.

Writes: `update(key, mutate)` runs `mutate` on a copy of that key's entry and writes that one object with
its resourceVersion as precondition (a POST for a new key), the fencing write: two replicas that both
believe they lead cannot both record a restart of one unit; the loser gets 409, re-reads only that
object and runs `mutate` again on what the winner wrote (`admission` then refuses). A write costs the same
whatever the number of units, and one round trip. Entries past retention are deleted a few per write.
A restart's intent is recorded in the same write as its time; its completion is not a write of its own
(`complete()`; the unit's next write drops it), so a restart costs one ledger write, and a leader killed
between that write and the pod removals leaves an intent a successor finishes (`restarting.Resumer`).

Reads: `load()` lists every entry once per term. Cluster-wide counts (restarts and cordons within a
window) are kept up to date as entries change, so no check reads every entry.

How it fails: `errors.LedgerUnavailable` when the LedgerEntry kind is not served (its CRD is missing):
kcover then refuses to act rather than act without memory; `errors.NotLeaderError` from the gateway's
fence; `errors.KubeError` when the API keeps refusing (after `MAX_ATTEMPTS` conflicts, or other errors).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import copy
import enum
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard, TypeVar

import orjson
import structlog

from kcover import errors, model
from kcover.kube import gateway

log = structlog.get_logger()

T = TypeVar("T")

MAX_INTENT_UIDS = 512
"""Pod uids an intent keeps (the faulting pod first; about 19 KiB at most): every member of a unit of up to
511 pods, so a successor takes away exactly those; past it a sample, and the creation times decide."""
MAX_ATTEMPTS = 5
"""Read-modify-write attempts of one entry before giving up on a contended ledger."""
DELETES_PER_WRITE = 8
"""Expired entries deleted per write at most; the others go at later writes (harmless meanwhile)."""
EXPIRY_SCAN_SECONDS = 60.0
"""Entries past retention are looked for at most once a minute of ledger time: the look reads every entry
(tens of milliseconds at 10,000 units), and an entry lingering a minute past an hour's retention is harmless."""
SIGNALS = "signals"
BREAKER_KEY = "breaker"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def object_name(ledger_name: str, key: str) -> str:
    """`<ledger>.<key>` when that is a valid object name, else `<ledger>.h.<hash of key>`."""
    name = f"{ledger_name}.{key}"
    if len(name) <= 253 and _NAME.match(name):
        return name
    return f"{ledger_name}.h.{hashlib.sha256(key.encode()).hexdigest()[:32]}"


# ------------------------------------------------------------------------------------------ entries

@dataclass(frozen=True)
class Intent:
    """A restart recorded before its removals: what a successor needs to tell whether it happened, and finish it."""

    id: str
    fault: str
    """The `CollectorEvent.id` that caused it."""
    leader: str
    epoch: int
    at: float
    """Epoch seconds it was recorded (the restart time in the unit's `restarts`)."""
    workload: tuple[str, str, str, str, str]
    """(kind, apiVersion, namespace, name, uid) of the workload."""
    selector: str = ""
    pod: tuple[str, str, str] | None = None
    """(namespace, name, uid) of the faulting pod."""
    uids: tuple[str, ...] = ()
    """Uids of pods the restart removes (the faulting pod first, at most `MAX_INTENT_UIDS`)."""
    message: str = ""
    unit: str = ""
    complete: bool = False
    """`uids` lists every member (not a sample)."""

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"i": self.id, "f": self.fault, "l": self.leader, "e": self.epoch,
                               "t": round(self.at, 3), "w": list(self.workload), "u": list(self.uids),
                               "m": self.message}
        if self.selector:
            out["s"] = self.selector
        if self.pod is not None:
            out["p"] = list(self.pod)
        if self.unit:
            out["n"] = self.unit
        if self.complete:
            out["a"] = True
        return out

    @classmethod
    def decode(cls, raw: Any) -> Intent | None:
        """None for anything malformed (an unreadable intent is treated as absent, and logged)."""
        if not isinstance(raw, dict):
            return None
        try:
            workload = tuple(str(x) for x in raw["w"])
            pod = raw.get("p")
            if len(workload) != 5 or (pod is not None and len(pod) != 3):
                return None
            return cls(id=str(raw["i"]), fault=str(raw.get("f", "")), leader=str(raw["l"]), epoch=int(raw["e"]),
                       at=float(raw["t"]), workload=(workload[0], workload[1], workload[2], workload[3], workload[4]),
                       selector=str(raw.get("s", "")),
                       pod=None if pod is None else (str(pod[0]), str(pod[1]), str(pod[2])),
                       uids=tuple(str(u) for u in raw.get("u") or ())[:MAX_INTENT_UIDS],
                       message=str(raw.get("m", "")), unit=str(raw.get("n", "")), complete=raw.get("a") is True)
        except (KeyError, TypeError, ValueError, IndexError):
            return None


@dataclass(frozen=True)
class HeldRestart:
    """A restart refused for a blocker that lifts, waiting to be planned again (`steps.Hold`)."""

    code: str
    """The refusal code that holds it (`Paused`, `Cooldown`, `BudgetExhausted`, `BreakerOpen`, ...)."""
    text: str
    at: float
    until: float
    cause: str
    """The cause `CollectorEvent`, as JSON: what is planned again."""

    def encode(self) -> dict[str, Any]:
        return {"c": self.code, "x": self.text, "t": round(self.at, 3), "u": round(self.until, 3), "e": self.cause}

    @classmethod
    def decode(cls, raw: Any) -> HeldRestart | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(code=str(raw["c"]), text=str(raw.get("x", "")), at=float(raw["t"]), until=float(raw["u"]),
                       cause=str(raw["e"]))
        except (KeyError, TypeError, ValueError):
            return None

    def event(self) -> model.CollectorEvent | None:
        """The held cause, or None if the entry's JSON cannot be read (the entry is untrusted input)."""
        try:
            return model.CollectorEvent.model_validate_json(self.cause)
        except ValueError:
            return None


@dataclass
class Unit:
    """A restart unit's entry."""

    restarts: list[float] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    """Where each restart's fault was, as `<node>` or `<node>/<device>` ("" unknown), parallel to `restarts`:
    the evidence that tells a node's fault from a workload's (different workloads failing on one node)."""
    ranks: list[str] = field(default_factory=list)
    """Which pod of the unit faulted, per restart (its index labels, else its name; "" unknown): one pod
    failing wherever it runs is the workload's bug, different pods failing on one node the node's."""
    note: str = ""
    intent: Intent | None = None
    held: HeldRestart | None = None

    def record(self, at: float, place: str, rank: str = "") -> None:
        self.places = [*self.placed(), place]
        self.ranks = [*self.ranked(), rank]
        self.restarts.append(at)

    def trim(self, before: float) -> None:
        """Drop restarts older than `before` (the longest window any check reads)."""
        rows = [r for r in zip(self.restarts, self.placed(), self.ranked(), strict=True) if r[0] >= before]
        self.restarts, self.places, self.ranks = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

    def drop(self, at: float) -> None:
        """Take the restart recorded at `at` off (a refund)."""
        if at in self.restarts:
            i = self.restarts.index(at)
            places, ranks = self.placed(), self.ranked()
            del self.restarts[i], places[i], ranks[i]
            self.places, self.ranks = places, ranks

    def placed(self) -> list[str]:
        """`places`, one per restart ("" where an older entry recorded none)."""
        return (self.places + [""] * len(self.restarts))[:len(self.restarts)]

    def ranked(self) -> list[str]:
        return (self.ranks + [""] * len(self.restarts))[:len(self.restarts)]

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": [round(t, 3) for t in self.restarts], "d": self.note}
        if any(self.places):
            out["w"] = self.placed()
        if any(self.ranks):
            out["r"] = self.ranked()
        if self.intent is not None:
            out["p"] = self.intent.encode()
        if self.held is not None:
            out["h"] = self.held.encode()
        return out

    @classmethod
    def decode(cls, raw: Mapping[str, Any], key: str) -> Unit:
        times = [float(t) if _number(t) else None for t in raw.get("t") or ()]
        places = [str(p)[:600] for p in raw.get("w") or ()] if isinstance(raw.get("w"), list) else []
        ranks = [str(r)[:300] for r in raw.get("r") or ()] if isinstance(raw.get("r"), list) else []
        rows = sorted((t, places[i] if i < len(places) else "", ranks[i] if i < len(ranks) else "")
                      for i, t in enumerate(times) if t is not None)
        unit = cls(restarts=[r[0] for r in rows], places=[r[1] for r in rows], ranks=[r[2] for r in rows],
                   note=str(raw.get("d", "")))
        if "p" in raw:
            unit.intent = Intent.decode(raw["p"])
            if unit.intent is None:
                log.warning("ledger_intent_unreadable", key=key)
        if "h" in raw:
            unit.held = HeldRestart.decode(raw["h"])
        return unit

    def newest(self) -> float:
        times = [*self.restarts, *((self.held.until,) if self.held is not None else ())]
        return max(times, default=float("-inf"))


@dataclass(frozen=True)
class TaintedDevice:
    """One of the node's DRA devices kcover holds tainted (its DeviceTaintRule), since when."""

    device: model.DraDevice
    at: float

    def encode(self) -> list[Any]:
        return [self.device.driver, self.device.pool, self.device.device, round(self.at, 3)]

    @classmethod
    def decode(cls, raw: Any) -> TaintedDevice | None:
        if not isinstance(raw, list) or len(raw) != 4 or not _number(raw[3]):
            return None
        try:
            return cls(model.DraDevice(driver=str(raw[0]), pool=str(raw[1]), device=str(raw[2])), float(raw[3]))
        except ValueError:
            return None


class Verdict(enum.StrEnum):
    """What a suspect node's validation found."""

    HEALTHY = "healthy"
    """It passed: the evidence before it no longer counts against the node."""
    FAULTY = "faulty"
    """It failed: the node was cordoned (or would have been, past the breaker)."""
    UNVALIDATED = "unvalidated"
    """It could not run or was not answered, and the node showed no hardware signal: left schedulable."""


@dataclass
class Node:
    """A node's entry: kcover's last cordon of it, its last suspicion and what its validation found, and its
    devices kcover holds tainted (resourceID -> the taint)."""

    cordoned_at: float | None = None
    reason: str = ""
    suspect_at: float | None = None
    """When differential evidence last made the node suspect (a validation was asked)."""
    suspicion: str = ""
    """The evidence, for people."""
    judged_at: float | None = None
    """When that suspicion was settled; restarts before it no longer count against the node."""
    verdict: Verdict | None = None
    devices: dict[str, TaintedDevice] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"r": self.reason}
        if self.cordoned_at is not None:
            out["c"] = round(self.cordoned_at, 3)
        if self.suspect_at is not None:
            out["s"], out["e"] = round(self.suspect_at, 3), self.suspicion
        if self.judged_at is not None and self.verdict is not None:
            out["j"], out["v"] = round(self.judged_at, 3), self.verdict.value
        if self.devices:
            out["d"] = [t.encode() for _, t in sorted(self.devices.items())]
        return out

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> Node:
        at, suspect, judged = raw.get("c"), raw.get("s"), raw.get("j")
        try:
            verdict: Verdict | None = Verdict(str(raw.get("v")))
        except ValueError:
            verdict = None
        devices = [TaintedDevice.decode(t) for t in raw.get("d") or ()] if isinstance(raw.get("d"), list) else []
        suspect_at = float(suspect) if _number(suspect) else None
        return cls(cordoned_at=float(at) if _number(at) else None, reason=str(raw.get("r", "")),
                   suspect_at=suspect_at, suspicion=str(raw.get("e", ""))[:600] if suspect_at is not None else "",
                   judged_at=float(judged) if _number(judged) and verdict is not None else None,
                   verdict=verdict if _number(judged) else None,
                   devices={t.device.resource_id: t for t in devices if t is not None})

    def newest(self) -> float:
        times = [t for t in (self.cordoned_at, self.suspect_at, self.judged_at) if t is not None]
        times += [t.at for t in self.devices.values()]
        return max(times, default=float("-inf"))

    def pending_suspicion(self) -> bool:
        """Suspect, and not settled since."""
        return self.suspect_at is not None and (self.judged_at is None or self.judged_at < self.suspect_at)


@dataclass
class Breaker:
    """The breaker's entry: latched (open) since when and why; the last reset."""

    opened_at: float | None = None
    reason: str = ""
    closed_at: float | None = None
    reset_request: str = ""
    """The last reset request acted on (the controls ConfigMap annotation's value): one request resets once."""

    @property
    def latched(self) -> bool:
        return self.opened_at is not None

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"r": self.reason, "k": self.reset_request}
        if self.opened_at is not None:
            out["o"] = round(self.opened_at, 3)
        if self.closed_at is not None:
            out["x"] = round(self.closed_at, 3)
        return out

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> Breaker:
        opened, closed = raw.get("o"), raw.get("x")
        return cls(opened_at=float(opened) if _number(opened) else None, reason=str(raw.get("r", "")),
                   closed_at=float(closed) if _number(closed) else None, reset_request=str(raw.get("k", "")))


Entry = Unit | Node | Breaker


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def entry_for(key: str) -> Entry:
    if key.startswith("n."):
        return Node()
    if key == BREAKER_KEY:
        return Breaker()
    return Unit()


def decode_entry(key: str, raw: Any) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    if key.startswith("n."):
        return Node.decode(raw)
    if key == BREAKER_KEY:
        return Breaker.decode(raw)
    if key.startswith("w."):
        return Unit.decode(raw, key)
    return None


@dataclass
class _Held:
    """One entry as this replica last read or wrote it."""

    name: str
    rv: str
    entry: Entry
    signals: dict[str, float]


def _parse(item: gateway.DataBody) -> tuple[str, _Held] | None:
    """(key, entry) of one LedgerEntry object; None for one kcover cannot read (logged)."""
    meta = item.get("metadata", {})
    data = item.get("data") or {}
    name = meta.get("name", "")
    for key, raw_text in data.items():
        if key == SIGNALS:
            continue
        try:
            raw = orjson.loads(raw_text)
        except orjson.JSONDecodeError:
            log.warning("ledger_entry_unreadable", key=key, name=name)
            return None
        entry = decode_entry(key, raw)
        if entry is None:
            log.warning("ledger_entry_unreadable", key=key, name=name)
            return None
        signals: dict[str, float] = {}
        try:
            held = orjson.loads(data.get(SIGNALS) or "{}")
        except orjson.JSONDecodeError:
            held = {}
        if isinstance(held, dict):
            signals = {str(k): float(v) for k, v in held.items() if _number(v)}
        return key, _Held(name, meta.get("resourceVersion", ""), entry, signals)
    return None


@dataclass(frozen=True)
class Failure:
    """One restart recorded for a fault at a node: the evidence a node's blame reads."""

    at: float
    key: str
    """The restart unit."""
    device: str
    """The GPU or DRA device, "" when the fault named none."""
    rank: str
    """Which pod of the unit faulted ("" unknown)."""


def _sorted_put(values: list[float], value: float, add: bool) -> None:
    if add:
        bisect.insort(values, value)
        return
    i = bisect.bisect_left(values, value)
    if i < len(values) and values[i] == value:
        del values[i]


# ------------------------------------------------------------------------------------------ the ledger

class Ledger:
    """The ledger of one controller: loaded once per term, written one entry at a time, fenced."""

    def __init__(self, gw: gateway.Gateway, *, namespace: str, name: str,
                 retention_seconds: Callable[[], float]) -> None:
        self._gw = gw
        self.namespace = namespace
        self.name = name
        self._retention = retention_seconds
        self._entries: dict[str, _Held] = {}
        self._loaded = False
        self._load_lock = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._completed: dict[str, str] = {}
        """Unit key -> id of an intent carried out here; the unit's next write drops it."""
        self._restart_times: list[float] = []
        """Every unit's restart times, sorted: the cluster-wide count in a window without reading every entry."""
        self._cordon_times: list[float] = []
        self._device_times: list[float] = []
        """When each device taint the ledger holds was made, sorted (the device taints' window)."""
        self._latest: list[float] = []
        """Each unit's latest restart, sorted: how many different units restarted within a window."""
        self._at_node: collections.defaultdict[str, dict[str, list[Failure]]] = collections.defaultdict(dict)
        """Node -> unit key -> the unit's restarts for faults there: the evidence against a node."""
        self._doomed: list[str] = []
        self._next_scan = float("-inf")
        """Ledger time (`now` of a write) before which no write looks for expired entries again."""
        self.writes = 0
        self.conflicts = 0

    @classmethod
    def offline(cls, entries: Mapping[str, Entry] | None = None, *, signals: Mapping[str, float] | None = None,
                name: str = "kcover-ledger", namespace: str = "kcover-system") -> Ledger:
        """A loaded ledger holding `entries` (key -> entry) and `signals` (`<signal>|<key>` -> time), built
        without I/O: what the plan reads in table tests, through the product's own model. It cannot write."""
        book = cls(_Offline(), namespace=namespace, name=name, retention_seconds=lambda: 3600.0)
        held: dict[str, _Held] = {}
        for key, entry in (entries or {}).items():
            mine = {s: at for s, at in (signals or {}).items() if s.rpartition("|")[2] == key}
            held[key] = _Held(object_name(name, key), "1", entry, mine)
        for signal, at in (signals or {}).items():
            key = signal.rpartition("|")[2]
            if key not in held:
                held[key] = _Held(object_name(name, key), "1", entry_for(key), {signal: at})
        book._entries = held
        book._reindex()
        book._loaded = True
        return book

    # ------------------------------------------------------------------------------------ reads

    @property
    def loaded(self) -> bool:
        return self._loaded

    def unit(self, key: str) -> Unit | None:
        held = self._entries.get(key)
        return held.entry if held is not None and isinstance(held.entry, Unit) else None

    def node(self, name: str) -> Node | None:
        held = self._entries.get(f"n.{name}")
        return held.entry if held is not None and isinstance(held.entry, Node) else None

    def breaker(self) -> Breaker:
        held = self._entries.get(BREAKER_KEY)
        return held.entry if held is not None and isinstance(held.entry, Breaker) else Breaker()

    def acted_on(self, signal: str, key: str) -> float | None:
        """When `signal` moved the entry `key`, or None (also for an empty signal)."""
        if not signal:
            return None
        held = self._entries.get(key)
        return held.signals.get(f"{signal}|{key}") if held is not None else None

    def restarts_since(self, since: float) -> int:
        """Restarts of every unit at or after `since` (epoch seconds)."""
        return len(self._restart_times) - bisect.bisect_left(self._restart_times, since)

    def cordons_since(self, since: float) -> int:
        """Nodes kcover cordoned at or after `since` (each node's latest cordon)."""
        return len(self._cordon_times) - bisect.bisect_left(self._cordon_times, since)

    def device_taints_since(self, since: float) -> int:
        """Device taints kcover holds that it made at or after `since` (epoch seconds)."""
        return len(self._device_times) - bisect.bisect_left(self._device_times, since)

    def tainted_devices(self) -> list[tuple[str, TaintedDevice]]:
        """(node, taint) of every device kcover holds tainted, oldest first."""
        out = [(key[2:], t) for key, h in self._entries.items() if isinstance(h.entry, Node)
               for t in h.entry.devices.values()]
        return sorted(out, key=lambda pair: (pair[1].at, pair[1].device.resource_id))

    def units_restarted_since(self, since: float) -> int:
        """Restart units whose latest restart is at or after `since`: each unit once."""
        return len(self._latest) - bisect.bisect_left(self._latest, since)

    def failures_at(self, node: str, since: float) -> list[Failure]:
        """The restarts recorded for faults on `node` at or after `since`, oldest first."""
        rows = [f for per_unit in self._at_node.get(node, {}).values() for f in per_unit if f.at >= since]
        return sorted(rows, key=lambda f: (f.at, f.key))

    def nodes_of(self, key: str, since: float) -> set[str]:
        """The nodes a unit's restarts at or after `since` were for."""
        unit = self.unit(key)
        if unit is None:
            return set()
        return {p.partition("/")[0] for t, p in zip(unit.restarts, unit.placed(), strict=True) if t >= since}

    def pending(self) -> dict[str, Intent]:
        """Intents held as pending, less those completed here (unit key -> intent)."""
        out = {}
        for key, held in self._entries.items():
            if isinstance(held.entry, Unit) and held.entry.intent is not None \
                    and self._completed.get(key) != held.entry.intent.id:
                out[key] = held.entry.intent
        return out

    def held(self) -> dict[str, HeldRestart]:
        """Restarts held for later (unit key -> the hold)."""
        return {key: h.entry.held for key, h in self._entries.items()
                if isinstance(h.entry, Unit) and h.entry.held is not None}

    def entry_keys(self) -> list[str]:
        return list(self._entries)

    def complete(self, key: str, intent_id: str) -> None:
        """Mark an intent carried out; the unit's next write drops it (no write of its own)."""
        self._completed[key] = intent_id

    # ------------------------------------------------------------------------------------ load

    async def load(self) -> None:
        """List every entry of this ledger; `errors.LedgerUnavailable` when LedgerEntries are not served."""
        try:
            items = await self._gw.list_ledger_entries(self.namespace, self.name)
        except errors.NotFoundError as exc:
            self._loaded = False
            raise errors.LedgerUnavailable(
                f"LedgerEntries (kcover.io/v1alpha1) are not served in namespace {self.namespace}: is the "
                f"LedgerEntry CRD installed? kcover does not act without its ledger ({exc})") from exc
        entries: dict[str, _Held] = {}
        for item in items:
            parsed = _parse(item)
            if parsed is not None:
                entries[parsed[0]] = parsed[1]
        self._entries = entries
        self._completed = {}
        self._reindex()
        self._loaded = True

    async def confirm_served(self) -> None:
        """`errors.LedgerUnavailable` (and loaded no more) when LedgerEntries are no longer served: checked
        before an action whose ledger write comes after it (a cordon), so none is taken without the ledger."""
        await self.ensure_loaded()
        if not await self._gw.ledger_served(self.namespace):
            self._loaded = False
            raise errors.LedgerUnavailable(
                f"LedgerEntries (kcover.io/v1alpha1) are no longer served in namespace {self.namespace}: was the "
                "LedgerEntry CRD deleted? kcover does not act without its ledger")

    async def ensure_loaded(self) -> None:
        async with self._load_lock:
            if not self._loaded:
                await self.load()

    def forget(self) -> None:
        """Drop what was loaded (the next `ensure_loaded` lists again): a new term, or the CRD went away."""
        self._loaded = False

    def _reindex(self) -> None:
        self._restart_times, self._cordon_times, self._latest, self._device_times = [], [], [], []
        self._at_node = collections.defaultdict(dict)
        for key, held in self._entries.items():
            self._index(key, held.entry, add=True)

    def _index(self, key: str, entry: Entry, *, add: bool) -> None:
        """Add `entry` to (or take it off) the cluster-wide counts and the per-node evidence."""
        if isinstance(entry, Unit):
            for t in entry.restarts:
                _sorted_put(self._restart_times, t, add)
            if entry.restarts:
                _sorted_put(self._latest, max(entry.restarts), add)
            for t, place, rank in zip(entry.restarts, entry.placed(), entry.ranked(), strict=True):
                node, _, device = place.partition("/")
                if not node:
                    continue
                rows = self._at_node[node].setdefault(key, [])
                if add:
                    rows.append(Failure(t, key, device, rank))
                else:
                    rows[:] = [f for f in rows if f.at != t]
                    if not rows:
                        del self._at_node[node][key]
                        if not self._at_node[node]:
                            del self._at_node[node]
        elif isinstance(entry, Node):
            if entry.cordoned_at is not None:
                _sorted_put(self._cordon_times, entry.cordoned_at, add)
            for taint in entry.devices.values():
                _sorted_put(self._device_times, taint.at, add)

    def _replace(self, key: str, new: _Held | None) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._index(key, old.entry, add=False)
        if new is not None:
            self._entries[key] = new
            self._index(key, new.entry, add=True)

    # ------------------------------------------------------------------------------------ writes

    async def update(self, key: str, mutate: Callable[[Entry, dict[str, float]], T | None], *, now: float) -> T | None:
        """Run `mutate(entry, signals)` on a copy of `key`'s entry and write it (fenced, preconditioned).

        `mutate` changes the copy in place and returns None to have it written, or a refusal (anything
        else) to write nothing and return it. On a conflict only this entry is read again and `mutate`
        runs on what the other writer left."""
        await self.ensure_loaded()
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            for attempt in range(MAX_ATTEMPTS):
                held = self._entries.get(key)
                entry = copy.deepcopy(held.entry) if held is not None else entry_for(key)
                signals = dict(held.signals) if held is not None else {}
                dropped = self._drop_completed(key, entry)
                refusal = mutate(entry, signals)
                if refusal is not None:
                    return refusal
                self._prune_signals(signals, now)
                try:
                    written = await self._write(key, held, entry, signals)
                except errors.ConflictError:
                    self.conflicts += 1
                    log.info("ledger_conflict", key=key, attempt=attempt + 1)
                    await self._refresh(key)
                    continue
                self._replace(key, written)
                if dropped:
                    self._completed.pop(key, None)
                await self._delete_expired(now)
                return None
            raise errors.KubeError(f"ledger {self.namespace}/{self.name}: entry {key} still conflicting after "
                                   f"{MAX_ATTEMPTS} attempts", status=409)

    def _drop_completed(self, key: str, entry: Entry) -> bool:
        done = self._completed.get(key)
        if isinstance(entry, Unit) and entry.intent is not None and entry.intent.id == done:
            entry.intent = None
            return True
        return False

    def _prune_signals(self, signals: dict[str, float], now: float) -> None:
        before = now - self._retention()
        for signal in [s for s, at in signals.items() if at < before]:
            del signals[signal]

    async def _write(self, key: str, held: _Held | None, entry: Entry, signals: dict[str, float]) -> _Held:
        body = entry_body(self.name, self.namespace, key, entry, signals,
                          name=held.name if held is not None else "")
        meta = body["metadata"]
        name = meta["name"]
        try:
            if held is None:
                result = await self._gw.create_ledger_entry(body)
            else:
                meta["resourceVersion"] = held.rv
                result = await self._gw.replace_ledger_entry(body)
        except errors.NotFoundError as exc:
            if held is None:  # the collection itself is not served: the CRD is missing
                self._loaded = False
                raise errors.LedgerUnavailable(f"LedgerEntries are not served: {exc}") from exc
            raise errors.ConflictError(f"ledger entry {name} was deleted meanwhile", status=409) from exc
        self.writes += 1
        return _Held(name, result.get("metadata", {}).get("resourceVersion", ""), entry, signals)

    async def _refresh(self, key: str) -> None:
        """Read one entry again after a conflict."""
        held = self._entries.get(key)
        name = held.name if held is not None else object_name(self.name, key)
        found = await self._gw.get_ledger_entry(self.namespace, name)
        parsed = _parse(found) if found is not None else None
        self._replace(key, parsed[1] if parsed is not None and parsed[0] == key else None)

    async def _delete_expired(self, now: float) -> None:
        """Delete a few entries past retention (no pending intent, no hold): no object lingers for ever. The
        entries are looked through at most every `EXPIRY_SCAN_SECONDS`, so a write's cost does not grow with
        the ledger."""
        if not self._doomed and now >= self._next_scan:
            self._next_scan = now + EXPIRY_SCAN_SECONDS
            before = now - self._retention()
            self._doomed = [k for k, h in self._entries.items() if _expired(h.entry, before)][:64]
        for key in self._doomed[:DELETES_PER_WRITE]:
            held = self._entries.get(key)
            if held is None or not _expired(held.entry, now - self._retention()):
                continue
            try:
                await self._gw.delete_ledger_entry(self.namespace, held.name, held.rv)
            except errors.ConflictError:
                continue  # written meanwhile: no longer expired
            self._replace(key, None)
        del self._doomed[:DELETES_PER_WRITE]


def entry_body(ledger_name: str, namespace: str, key: str, entry: Entry, signals: Mapping[str, float], *,
               name: str = "") -> gateway.DataBody:
    """The LedgerEntry object holding `key`'s entry and signals (named `object_name` unless `name` is given)."""
    data = {key: orjson.dumps(entry.encode()).decode()}
    if signals:
        data[SIGNALS] = orjson.dumps({k: round(v, 3) for k, v in sorted(signals.items())}).decode()
    meta: gateway.Meta = {"name": name or object_name(ledger_name, key), "namespace": namespace,
                          "labels": {gateway.LEDGER_LABEL: ledger_name, "app.kubernetes.io/managed-by": "kcover"}}
    return {"apiVersion": gateway.LEDGER_GROUP_VERSION, "kind": "LedgerEntry", "metadata": meta, "data": data}


class _Offline:
    """The gateway of an offline ledger: every call is refused (it holds what it was given)."""

    def __getattr__(self, name: str) -> Any:
        raise errors.KcoverError(f"an offline ledger cannot {name}")


def _expired(entry: Entry, before: float) -> bool:
    if isinstance(entry, Unit):
        return entry.intent is None and entry.held is None and entry.newest() < before
    if isinstance(entry, Node):
        return not entry.devices and entry.newest() < before  # a taint is kept until kcover removed it
    return False


def restarts_within(unit: Unit | None, since: float) -> list[float]:
    return [t for t in (unit.restarts if unit is not None else ()) if t > since]
