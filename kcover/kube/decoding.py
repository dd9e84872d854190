"""JSON from the API server to Python objects, such that no one object can break a list or a watch.

Owns the decoding of every response body and watch line kcover reads. orjson refuses documents nested
deeper than 1,024 levels; kube-apiserver accepts and stores objects nested far deeper (its decoder
allows 10,000 levels), and anyone who may write an object may nest its `metadata.managedFields[].fieldsV1`
so: a tenant who may only create Events, or patch its own pods. kcover never reads managedFields. So a
body is decoded in steps, each taken only when the one before failed:

1. orjson, as it is: the fast path, and the only cost on every body that decodes (nearly all);
2. the same bytes with every `managedFields` value replaced by `null` (`without_managed_fields`: a scan
   that knows JSON strings finds them; it costs a few times the parse, on the rare body that needs it);
3. for a list (`page`), its items decoded one by one: an item that still fails is left out and reported
   as `Skipped` (its kind, name and the reason), the others are kept.

A watch line (`event`) that fails after step 2 is reported as skipped too, never raised: one object
never ends a watch. What callers do with a skip (count it in `kcover_objects_skipped_total`, log it) is
theirs; `Skips` is the counter they share.

How it fails: `Unreadable` (a `KubeError`, never retried) for a single document that fails every step,
and for a list whose items cannot even be found.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from kcover import errors

TOO_DEEP = "too_deep"
"""Skip reason: nested deeper than the parser allows, outside managedFields."""
UNREADABLE = "unreadable"
"""Skip reason: not valid JSON for any other reason."""

_KEY = b'"managedFields"'
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
"""A JSON string (escapes included) or a bracket: what matching a container's end has to look at."""
_SPACE = b" \t\r\n"
_NAME = re.compile(rb'"name"\s*:\s*"([^"\\]{0,253})"')
_NAMESPACE = re.compile(rb'"namespace"\s*:\s*"([^"\\]{0,63})"')
_KIND = re.compile(rb'"kind"\s*:\s*"([^"\\]{0,63})"')


class Unreadable(errors.KubeError):
    """A response body that is not a JSON document kcover can read, even without its managedFields."""


@dataclass(frozen=True)
class Skipped:
    """One object left out of a list or a watch."""

    kind: str
    namespace: str
    name: str
    reason: str
    """`TOO_DEEP` or `UNREADABLE`."""
    error: str


@dataclass
class Skips:
    """Objects skipped, by (kind, reason): what `kcover_objects_skipped_total` exports."""

    counts: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    def add(self, skipped: Skipped) -> None:
        self.counts[(skipped.kind, skipped.reason)] += 1

    def metrics(self) -> Iterable[Metric]:
        """`kcover_objects_skipped_total{kind,reason}`, as a collector yields it."""
        family = CounterMetricFamily("kcover_objects_skipped", "Objects left out of a list or a watch because "
                                     "they could not be decoded, by kind and reason (too_deep, unreadable).",
                                     labels=["kind", "reason"])
        for (kind, reason), count in sorted(self.counts.items()):
            family.add_metric([kind, reason], count)
        yield family


class SkipsCollector(Collector):
    """Exports a client's `Skips` when scraped."""

    def __init__(self, skips: Skips) -> None:
        self._skips = skips

    def collect(self) -> Iterable[Metric]:
        return self._skips.metrics()


def loads(data: bytes) -> Any:
    """One document (steps 1 and 2). Raises `Unreadable`."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        first = exc
    stripped = without_managed_fields(data)
    if stripped is not None:
        try:
            return orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            first = exc
    raise Unreadable(f"the response is not readable JSON: {first}", status=200) from first


def page(data: bytes, *, kind: str = "") -> tuple[Any, list[Skipped]]:
    """A response body that may be a list: (the document, the items left out of it). A list whose items
    fail steps 1 and 2 has them decoded one by one (step 3); `kind` names them when they do not. Raises
    `Unreadable` for a document that is not a list and fails, or a list whose items cannot be found."""
    try:
        return loads(data), []
    except Unreadable as exc:
        error = exc
    spans = _items(data)
    if spans is None:
        raise error
    start, end, items = spans
    try:
        doc = orjson.loads(data[:start] + b"[]" + data[end:])
    except orjson.JSONDecodeError:
        raise error from None
    if not isinstance(doc, dict):
        raise error
    item_kind = kind or _item_kind(doc)
    kept: list[Any] = []
    skipped: list[Skipped] = []
    for a, b in items:
        raw = data[a:b]
        try:
            kept.append(loads(raw))
        except Unreadable as exc:
            skipped.append(describe(raw, kind=item_kind, error=exc))
    doc["items"] = kept
    return doc, skipped


def event(line: bytes, *, kind: str = "") -> tuple[Any, Skipped | None]:
    """A watch line: (the event, None), or (None, what was skipped) when it fails steps 1 and 2."""
    try:
        return loads(line), None
    except Unreadable as exc:
        return None, describe(line, kind=kind, error=exc)


def describe(raw: bytes, *, kind: str, error: Exception) -> Skipped:
    """What a skipped object was, as far as its first bytes tell (for the log line and the count)."""
    head = raw[:4096]
    found = _KIND.search(head)
    what = kind or (found.group(1).decode("utf-8", "replace") if found else "") or "unknown"
    name = _NAME.search(head)
    namespace = _NAMESPACE.search(head)
    text = str(error)
    reason = TOO_DEEP if "depth" in text or "recursion" in text.lower() else UNREADABLE
    return Skipped(kind=what, namespace=namespace.group(1).decode("utf-8", "replace") if namespace else "",
                   name=name.group(1).decode("utf-8", "replace") if name else "", reason=reason, error=text[:200])


def without_managed_fields(data: bytes) -> bytes | None:
    """`data` with the value of every `"managedFields"` key replaced by `null`; None when there is none
    to replace or a value's end cannot be found (the document is malformed)."""
    spans = managed_fields_spans(data)
    if not spans:
        return None
    out: list[bytes] = []
    pos = 0
    for a, b in spans:
        out.append(data[pos:a])
        out.append(b"null")
        pos = b
    out.append(data[pos:])
    return b"".join(out)


def managed_fields_spans(data: bytes) -> list[tuple[int, int]] | None:
    """The (start, end) of the array or object value of every `"managedFields"` key in `data`, in order;
    None when a value's end cannot be found.

    A `"managedFields"` that is a key is found by its bytes alone: inside a JSON string every quote is
    escaped, so an occurrence whose quote follows a backslash is text, and one followed by anything but
    a colon is a string value."""
    spans: list[tuple[int, int]] = []
    at = data.find(_KEY)
    while at != -1:
        after = at + len(_KEY)
        colon = _skip_space(data, after)
        if (at == 0 or data[at - 1] != 0x5C) and colon < len(data) and data[colon] == 0x3A:  # not escaped; ':'
            value = _skip_space(data, colon + 1)
            if value < len(data) and data[value] in b"[{":
                end = _container_end(data, value)
                if end is None:
                    return None
                spans.append((value, end))
                after = end
        at = data.find(_KEY, after)
    return spans


def spans_at_depth(data: bytes, depth: int) -> list[tuple[int, int]] | None:
    """The (start, end) of every array or object that opens `depth` levels down (the outermost value is
    level 1), in order; None when the brackets do not balance. Whatever lies deeper is inside one of them."""
    spans: list[tuple[int, int]] = []
    level = 0
    start = -1
    for match in _TOKEN.finditer(data):
        token = match.group()
        if token[0] == 0x22:
            continue
        if token in (b"[", b"{"):
            level += 1
            if level == depth:
                start = match.start()
            continue
        if level == depth:
            spans.append((start, match.end()))
        level -= 1
        if level < 0:
            return None
    return spans if level == 0 else None


def _skip_space(data: bytes, at: int) -> int:
    while at < len(data) and data[at] in _SPACE:
        at += 1
    return at


def _container_end(data: bytes, start: int) -> int | None:
    """The index just past the array or object that opens at `start`; None if it never closes."""
    depth = 0
    for match in _TOKEN.finditer(data, start):
        c = data[match.start()]
        if c == 0x22:  # a string: brackets inside it do not count
            continue
        depth += 1 if c == 0x5B or c == 0x7B else -1  # '[' '{'
        if depth == 0:
            return match.end()
    return None


def _items(data: bytes) -> tuple[int, int, list[tuple[int, int]]] | None:
    """The span of a list's top-level `items` array and the spans of its elements, or None."""
    depth = 0
    start = -1
    items: list[tuple[int, int]] = []
    item_start = -1
    for match in _TOKEN.finditer(data):
        token = match.group()
        if token[0] == 0x22:
            if depth == 1 and start < 0 and token == b'"items"':
                colon = _skip_space(data, match.end())
                if colon < len(data) and data[colon] == 0x3A:
                    value = _skip_space(data, colon + 1)
                    if value < len(data) and data[value] == 0x5B:  # '['
                        start = value
            continue
        if token in (b"[", b"{"):
            depth += 1
            if start >= 0 and depth == 3 and item_start < 0 and match.start() > start:
                item_start = match.start()
            continue
        depth -= 1
        if start >= 0 and depth == 2 and item_start >= 0:
            items.append((item_start, match.end()))
            item_start = -1
        elif start >= 0 and depth == 1 and match.start() > start:
            return start, match.end(), items
        if depth < 0:
            return None
    return None


def _item_kind(doc: dict[str, Any]) -> str:
    kind = str(doc.get("kind") or "")
    return kind[:-4] if kind.endswith("List") else kind
