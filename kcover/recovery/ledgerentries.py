"""The recovery ledger's entries and their encoding: what one LedgerEntry object holds, both directions.

Owns the entry types and the content of their objects. One `LedgerEntry` object (kcover.io/v1alpha1,
helm/kcover/files/ledgerentry-crd.yaml) per key, named `<ledger>.<key>` (a hash where the key is not a
valid name), labelled `kcover.io/ledger=<ledger>`:

* a restart unit, `w.<workload uid>` or `w.<uid>.g<group>` (a LeaderWorkerSet group): its restart times
  (cooldown and budget) with where each fault was (the evidence a node's blame reads), a note, the pending
  restart `Intent`, a held restart (`HeldRestart`);
* a node, `n.<node>`: when kcover last cordoned it and why, and which of its DRA devices kcover holds
  tainted since when (`TaintedDevice`: the caps on device taints and their bounded life read these);
* the breaker, `breaker`: whether it is latched, why, since when, and when it was last reset;

each with the outside signals that moved it (`<signal>|<key>` -> epoch seconds), so a replay never acts
twice. Data: `{<key>: compact JSON, "signals": compact JSON}`: `entry_body` writes it, `parse_body` reads it.

Does not own storing them (loading, the fenced writes, the cluster-wide counts, expiry: `ledger`); it does
no I/O.

How it fails: an object's content is untrusted input (anyone allowed to write a LedgerEntry could have
written it), and reading it never raises: an entry that cannot be read is None (`decode_entry`,
`parse_body`; logged as `ledger_entry_unreadable`), an intent that cannot be read is absent (logged as
`ledger_intent_unreadable`), and a field that cannot be read takes its default.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson
import structlog

from kcover import model
from kcover.kube import gateway

log = structlog.get_logger()

MAX_INTENT_UIDS = 512
"""Pod uids an intent keeps (the faulting pod first; about 19 KiB at most): every member of a unit of up to
511 pods, so a successor takes away exactly those; past it a sample, and the creation times decide."""
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
    workload: str = ""
    """`Kind/namespace/name` of the workload held: what names its Recovery, for a leader that did not hold it
    (`recoveries.held_ref`); "" in entries written before it was kept."""

    def encode(self) -> dict[str, Any]:
        out = {"c": self.code, "x": self.text, "t": round(self.at, 3), "u": round(self.until, 3), "e": self.cause}
        if self.workload:
            out["w"] = self.workload
        return out

    @classmethod
    def decode(cls, raw: Any) -> HeldRestart | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(code=str(raw["c"]), text=str(raw.get("x", "")), at=float(raw["t"]), until=float(raw["u"]),
                       cause=str(raw["e"]), workload=str(raw.get("w", ""))[:400])
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
    """Where each restart's fault was, as `<node>` or `<node>/<device>` ("" unknown, or answered by a verdict on
    the node: `steps.Restart.judged`), parallel to `restarts`:
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
    request: str = ""
    """The id of the validation asked with that suspicion: its answer (the Node condition naming it) settles it,
    whichever leader reads it."""
    judged_at: float | None = None
    """When that suspicion was settled; restarts before it no longer count against the node."""
    verdict: Verdict | None = None
    devices: dict[str, TaintedDevice] = field(default_factory=dict)
    link_downs: tuple[float, ...] = ()
    """When the node's agent saw one of its RDMA ports go down (`model.Evidence.LINK_DOWN`), the newest
    `LINK_DOWNS_MAX`, oldest first."""

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"r": self.reason}
        if self.cordoned_at is not None:
            out["c"] = round(self.cordoned_at, 3)
        if self.suspect_at is not None:
            out["s"], out["e"] = round(self.suspect_at, 3), self.suspicion
            if self.request:
                out["q"] = self.request
        if self.judged_at is not None and self.verdict is not None:
            out["j"], out["v"] = round(self.judged_at, 3), self.verdict.value
        if self.devices:
            out["d"] = [t.encode() for _, t in sorted(self.devices.items())]
        if self.link_downs:
            out["l"] = [round(t, 3) for t in self.link_downs]
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
        links = raw.get("l")
        link_downs = sorted(float(t) for t in links if _number(t)) if isinstance(links, list) else []
        return cls(cordoned_at=float(at) if _number(at) else None, reason=str(raw.get("r", "")),
                   suspect_at=suspect_at, suspicion=str(raw.get("e", ""))[:600] if suspect_at is not None else "",
                   request=_request_id(raw.get("q")) if suspect_at is not None else "",
                   judged_at=float(judged) if _number(judged) and verdict is not None else None,
                   verdict=verdict if _number(judged) else None,
                   devices={t.device.resource_id: t for t in devices if t is not None},
                   link_downs=tuple(link_downs[-LINK_DOWNS_MAX:]))

    def newest(self) -> float:
        times = [t for t in (self.cordoned_at, self.suspect_at, self.judged_at) if t is not None]
        times += [t.at for t in self.devices.values()]
        times += self.link_downs
        return max(times, default=float("-inf"))

    def note_link_down(self, at: float) -> bool:
        """Record a link-down at `at`; False when it is recorded already (the same report, replayed)."""
        if at in self.link_downs:
            return False
        self.link_downs = tuple(sorted((*self.link_downs, at))[-LINK_DOWNS_MAX:])
        return True

    def link_downs_within(self, since: float, until: float) -> list[float]:
        return [t for t in self.link_downs if since <= t <= until]

    def pending_suspicion(self) -> bool:
        """Suspect, and not settled since."""
        return self.suspect_at is not None and (self.judged_at is None or self.judged_at < self.suspect_at)


_REQUEST_ID = re.compile(r"[0-9a-f]{1,32}")


def _request_id(raw: Any) -> str:
    """A validation request's id as kcover writes it (hex), or "" for anything else: the id goes into a Node
    annotation when a leader asks it again."""
    return raw if isinstance(raw, str) and _REQUEST_ID.fullmatch(raw) else ""


LINK_DOWNS_MAX = 8
"""Link-downs a node's entry keeps: more within the judgement's window is a flapping link, the agent's own
fault (`rdma-link`'s `flaps`)."""


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


# ------------------------------------------------------------------------------------------ objects

@dataclass
class Stored:
    """One entry as its object holds it: the object's name and resourceVersion, the entry, its signals."""

    name: str
    rv: str
    entry: Entry
    signals: dict[str, float]


def parse_body(item: gateway.DataBody) -> tuple[str, Stored] | None:
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
        return key, Stored(name, meta.get("resourceVersion", ""), entry, signals)
    return None


def entry_body(ledger_name: str, namespace: str, key: str, entry: Entry, signals: Mapping[str, float], *,
               name: str = "") -> gateway.DataBody:
    """The LedgerEntry object holding `key`'s entry and signals (named `object_name` unless `name` is given)."""
    data = {key: orjson.dumps(entry.encode()).decode()}
    if signals:
        data[SIGNALS] = orjson.dumps({k: round(v, 3) for k, v in sorted(signals.items())}).decode()
    meta: gateway.Meta = {"name": name or object_name(ledger_name, key), "namespace": namespace,
                          "labels": {gateway.LEDGER_LABEL: ledger_name, "app.kubernetes.io/managed-by": "kcover"}}
    return {"apiVersion": gateway.LEDGER_GROUP_VERSION, "kind": "LedgerEntry", "metadata": meta, "data": data}


def restarts_within(unit: Unit | None, since: float) -> list[float]:
    return [t for t in (unit.restarts if unit is not None else ()) if t > since]
