"""The simulated cluster's per-resource tables: stored entries, change history and live watchers.

Owns the data structures `store` works on: an `Entry` (an object as pre-serialised JSON bytes with its
labels and field-selector values, the latter read on a selector's first use), a `Change` in the bounded history ring, the `Filter` of a list or
watch, and the `Watcher` that turns changes into watch events (with selector transitions). It holds no
rules about writes; `store` does.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kcover.sim import deepjson, registry, selectors

Obj = dict[str, Any]
WATCH_QUEUE_LIMIT = 200_000


@dataclass(slots=True)
class Entry:
    """One stored object: its JSON bytes plus what selectors need."""

    raw: bytes
    namespace: str
    name: str
    labels: dict[str, str]
    fields: Mapping[str, str]
    """Its field-selector values (`FieldValues`: read from `raw` when a field selector first asks)."""

    def obj(self) -> Obj:
        result: Obj = deepjson.loads(self.raw)
        return result


class FieldValues(Mapping[str, str]):
    """The value of every field label a resource supports, of one stored object, read from its JSON the
    first time a field selector asks: most writes are never matched by one (`selectors.field_values`)."""

    __slots__ = ("_raw", "_supported", "_values")

    def __init__(self, raw: bytes, supported: Mapping[str, registry.FieldGetter]) -> None:
        self._raw = raw
        self._supported = supported
        self._values: dict[str, str] | None = None

    def _read(self) -> dict[str, str]:
        if self._values is None:
            self._values = selectors.field_values(deepjson.loads(self._raw), self._supported)
        return self._values

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._supported)


@dataclass(slots=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    new: Entry
    old: Entry | None


@dataclass(slots=True)
class Filter:
    namespace: str | None = None
    labels: selectors.LabelSelector = field(default_factory=selectors.LabelSelector)
    fields: selectors.FieldSelector = field(default_factory=selectors.FieldSelector)

    def matches(self, entry: Entry) -> bool:
        if self.namespace is not None and entry.namespace != self.namespace:
            return False
        return self.labels.matches(entry.labels) and self.fields.matches(entry.fields)


@dataclass
class ListResult:
    entries: list[Entry]
    resource_version: int
    continue_after: str | None
    remaining: int | None


class Watcher:
    """A live watch: initial changes, then whatever the store offers, filtered with selector transitions."""

    def __init__(self, table: _Table, flt: Filter, initial: list[Change]) -> None:
        self._table = table
        self.filter = flt
        self.initial: deque[Change] = deque(initial)
        self.queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self.closed = False

    def offer(self, change: Change) -> None:
        if self.closed:
            return
        if self.queue.qsize() >= WATCH_QUEUE_LIMIT:
            self.close()
            return
        self.queue.put_nowait(change)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._table.watchers.discard(self)
            self.queue.put_nowait(None)

    def translate(self, change: Change) -> tuple[str, Entry] | None:
        """The event this watcher sees for `change`, or None when it does not match before or after."""
        new_ok = self.filter.matches(change.new)
        if change.type == "ADDED":
            return ("ADDED", change.new) if new_ok else None
        if change.type == "DELETED":
            return ("DELETED", change.new) if new_ok else None
        old_ok = change.old is not None and self.filter.matches(change.old)
        if new_ok:
            return ("MODIFIED" if old_ok else "ADDED", change.new)
        if old_ok and change.old is not None:
            obj = change.old.obj()
            obj["metadata"]["resourceVersion"] = str(change.rv)
            return "DELETED", _replace_raw(change.old, deepjson.dumps(obj))
        return None


def _replace_raw(entry: Entry, raw: bytes) -> Entry:
    return Entry(raw, entry.namespace, entry.name, entry.labels, entry.fields)


class _Table:
    """Objects and history of one resource."""

    def __init__(self, resource: registry.Resource, history: int) -> None:
        self.resource = resource
        self.entries: dict[str, Entry] = {}
        self.sorted_keys: list[str] | None = None
        self.history: deque[Change] = deque(maxlen=history)
        self.compacted_rv = 0
        self.watchers: set[Watcher] = set()

    def keys(self) -> list[str]:
        if self.sorted_keys is None:
            self.sorted_keys = sorted(self.entries)
        return self.sorted_keys

    def put(self, key: str, entry: Entry) -> None:
        # The key index is built lazily on the first list, so bulk seeding stays O(n log n).
        if key not in self.entries and self.sorted_keys is not None:
            bisect.insort(self.sorted_keys, key)
        self.entries[key] = entry

    def remove(self, key: str) -> None:
        del self.entries[key]
        if self.sorted_keys is not None:
            idx = bisect.bisect_left(self.sorted_keys, key)
            if idx < len(self.sorted_keys) and self.sorted_keys[idx] == key:
                del self.sorted_keys[idx]

    def record(self, change: Change) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(change)
        for watcher in list(self.watchers):
            watcher.offer(change)
