"""The recovery ledger: what kcover did and intends, in the cluster, so a new leader honours it.

Owns the ledger's state and its storage: one `LedgerEntry` object per key, in `recovery.ledger_namespace`,
loaded, indexed and written here. Does not own what an entry holds or how its object is encoded
(`ledgerentries`).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from kcover import errors
from kcover.kube import gateway
from kcover.recovery import ledgerentries

log = structlog.get_logger()

T = TypeVar("T")

MAX_ATTEMPTS = 5
"""Read-modify-write attempts of one entry before giving up on a contended ledger."""
DELETES_PER_WRITE = 8
"""Expired entries deleted per write at most; the others go at later writes (harmless meanwhile)."""
EXPIRY_SCAN_SECONDS = 60.0
"""Entries past retention are looked for at most once a minute of ledger time: the look reads every entry
(tens of milliseconds at 10,000 units), and an entry lingering a minute past an hour's retention is harmless."""


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
        self._entries: dict[str, ledgerentries.Stored] = {}
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
    def offline(cls, entries: Mapping[str, ledgerentries.Entry] | None = None, *,
                signals: Mapping[str, float] | None = None, name: str = "kcover-ledger",
                namespace: str = "kcover-system") -> Ledger:
        """A loaded ledger holding `entries` (key -> entry) and `signals` (`<signal>|<key>` -> time), built
        without I/O: what the plan reads in table tests, through the product's own model. It cannot write."""
        book = cls(_Offline(), namespace=namespace, name=name, retention_seconds=lambda: 3600.0)
        held: dict[str, ledgerentries.Stored] = {}
        for key, entry in (entries or {}).items():
            mine = {s: at for s, at in (signals or {}).items() if s.rpartition("|")[2] == key}
            held[key] = ledgerentries.Stored(ledgerentries.object_name(name, key), "1", entry, mine)
        for signal, at in (signals or {}).items():
            key = signal.rpartition("|")[2]
            if key not in held:
                held[key] = ledgerentries.Stored(ledgerentries.object_name(name, key), "1",
                                                 ledgerentries.entry_for(key), {signal: at})
        book._entries = held
        book._reindex()
        book._loaded = True
        return book

    # ------------------------------------------------------------------------------------ reads

    @property
    def loaded(self) -> bool:
        return self._loaded

    def unit(self, key: str) -> ledgerentries.Unit | None:
        held = self._entries.get(key)
        return held.entry if held is not None and isinstance(held.entry, ledgerentries.Unit) else None

    def node(self, name: str) -> ledgerentries.Node | None:
        held = self._entries.get(f"n.{name}")
        return held.entry if held is not None and isinstance(held.entry, ledgerentries.Node) else None

    def breaker(self) -> ledgerentries.Breaker:
        held = self._entries.get(ledgerentries.BREAKER_KEY)
        if held is not None and isinstance(held.entry, ledgerentries.Breaker):
            return held.entry
        return ledgerentries.Breaker()

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

    def tainted_devices(self) -> list[tuple[str, ledgerentries.TaintedDevice]]:
        """(node, taint) of every device kcover holds tainted, oldest first."""
        out = [(key[2:], t) for key, h in self._entries.items() if isinstance(h.entry, ledgerentries.Node)
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

    def pending(self) -> dict[str, ledgerentries.Intent]:
        """Intents held as pending, less those completed here (unit key -> intent)."""
        out = {}
        for key, held in self._entries.items():
            if isinstance(held.entry, ledgerentries.Unit) and held.entry.intent is not None \
                    and self._completed.get(key) != held.entry.intent.id:
                out[key] = held.entry.intent
        return out

    def held(self) -> dict[str, ledgerentries.HeldRestart]:
        """Restarts held for later (unit key -> the hold)."""
        return {key: h.entry.held for key, h in self._entries.items()
                if isinstance(h.entry, ledgerentries.Unit) and h.entry.held is not None}

    def suspects(self) -> dict[str, ledgerentries.Node]:
        """Nodes suspect and not judged since (`Node.pending_suspicion`): node name -> its entry."""
        return {key[2:]: h.entry for key, h in self._entries.items()
                if isinstance(h.entry, ledgerentries.Node) and h.entry.pending_suspicion()}

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
        entries: dict[str, ledgerentries.Stored] = {}
        for item in items:
            parsed = ledgerentries.parse_body(item)
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

    def _index(self, key: str, entry: ledgerentries.Entry, *, add: bool) -> None:
        """Add `entry` to (or take it off) the cluster-wide counts and the per-node evidence."""
        if isinstance(entry, ledgerentries.Unit):
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
        elif isinstance(entry, ledgerentries.Node):
            if entry.cordoned_at is not None:
                _sorted_put(self._cordon_times, entry.cordoned_at, add)
            for taint in entry.devices.values():
                _sorted_put(self._device_times, taint.at, add)

    def _replace(self, key: str, new: ledgerentries.Stored | None) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._index(key, old.entry, add=False)
        if new is not None:
            self._entries[key] = new
            self._index(key, new.entry, add=True)

    # ------------------------------------------------------------------------------------ writes

    async def update(self, key: str, mutate: Callable[[ledgerentries.Entry, dict[str, float]], T | None], *,
                     now: float) -> T | None:
        """Run `mutate(entry, signals)` on a copy of `key`'s entry and write it (fenced, preconditioned).

        `mutate` changes the copy in place and returns None to have it written, or a refusal (anything
        else) to write nothing and return it. On a conflict only this entry is read again and `mutate`
        runs on what the other writer left."""
        await self.ensure_loaded()
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            for attempt in range(MAX_ATTEMPTS):
                held = self._entries.get(key)
                entry = copy.deepcopy(held.entry) if held is not None else ledgerentries.entry_for(key)
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

    def _drop_completed(self, key: str, entry: ledgerentries.Entry) -> bool:
        done = self._completed.get(key)
        if isinstance(entry, ledgerentries.Unit) and entry.intent is not None and entry.intent.id == done:
            entry.intent = None
            return True
        return False

    def _prune_signals(self, signals: dict[str, float], now: float) -> None:
        before = now - self._retention()
        for signal in [s for s, at in signals.items() if at < before]:
            del signals[signal]

    async def _write(self, key: str, held: ledgerentries.Stored | None, entry: ledgerentries.Entry,
                     signals: dict[str, float]) -> ledgerentries.Stored:
        body = ledgerentries.entry_body(self.name, self.namespace, key, entry, signals,
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
        return ledgerentries.Stored(name, result.get("metadata", {}).get("resourceVersion", ""), entry, signals)

    async def _refresh(self, key: str) -> None:
        """Read one entry again after a conflict."""
        held = self._entries.get(key)
        name = held.name if held is not None else ledgerentries.object_name(self.name, key)
        found = await self._gw.get_ledger_entry(self.namespace, name)
        parsed = ledgerentries.parse_body(found) if found is not None else None
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



class _Offline:
    """The gateway of an offline ledger: every call is refused (it holds what it was given)."""

    def __getattr__(self, name: str) -> Any:
        raise errors.KcoverError(f"an offline ledger cannot {name}")


def _expired(entry: ledgerentries.Entry, before: float) -> bool:
    if isinstance(entry, ledgerentries.Unit):
        return entry.intent is None and entry.held is None and entry.newest() < before
    if isinstance(entry, ledgerentries.Node):
        return not entry.devices and entry.newest() < before  # a taint is kept until kcover removed it
    return False


