"""Watch streams of the simulated API server.

Owns the watch query options (resourceVersion, allowWatchBookmarks, timeoutSeconds,
sendInitialEvents with resourceVersionMatch) and the stream itself: HTTP 200, then one JSON event
per line, written as soon as it exists; initial ADDEDs, then changes with selector transitions,
BOOKMARKs when asked for, a 410 ERROR event for a resourceVersion that is too old, objects as
meta.k8s.io/v1 Tables when the Accept header asks for them (`kubectl get -w`), and a clean end
at `timeoutSeconds` or when the store closes the watcher (fault injection, slow consumer). A client
that goes away ends the stream at the next write or periodic check (`Request.connected`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kcover.sim import exchange, printing, status, tables

if TYPE_CHECKING:
    from kcover.sim import apiserver, requesting

BATCH = 1000
DEFAULT_TIMEOUT_RANGE = (1800.0, 3600.0)


@dataclass(frozen=True)
class WatchOptions:
    resource_version: str | None
    bookmarks: bool
    timeout_seconds: float | None
    send_initial_events: bool | None
    match: str


def parse_options(query: Any, parse_bool: Callable[[Any, str], bool],
                  parse_int: Callable[[Any, str], int | None]) -> WatchOptions:
    """Read and check the watch parameters (422 for combinations the API server forbids)."""
    sie_text = query.get("sendInitialEvents")
    sie = None if sie_text in (None, "") else parse_bool(query, "sendInitialEvents")
    bookmarks = parse_bool(query, "allowWatchBookmarks")
    match = query.get("resourceVersionMatch") or ""
    causes: list[tuple[str, str, str]] = []
    if sie is not None:
        if match != "NotOlderThan":
            causes.append(("FieldValueForbidden", "resourceVersionMatch",
                           "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
        if not bookmarks:
            causes.append(("FieldValueForbidden", "allowWatchBookmarks",
                           "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true"))
    elif match:
        causes.append(("FieldValueForbidden", "resourceVersionMatch",
                       "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                       "provided"))
    if causes:
        raise status.invalid("ListOptions", "meta.k8s.io", "", causes)
    timeout = parse_int(query, "timeoutSeconds")
    return WatchOptions(query.get("resourceVersion"), bookmarks, None if timeout is None else float(timeout),
                        sie, match)


def _line(kind: str, raw: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


class _Encoder:
    """Each event's object as the client asked: as stored, or (`as=Table`) a meta.k8s.io/v1 Table of that one
    object, as kube-apiserver's watchEmbeddedEncoder writes it: the Table's resourceVersion the object's,
    column definitions on the first event only (null after), bookmarks converted like objects."""

    def __init__(self, request: exchange.Request, server: apiserver.ApiServer, t: requesting.Target) -> None:
        self._server, self._t = server, t
        self._table = printing.wants_table(request.headers.get("Accept", ""), t.resource)
        self._include = request.query.get("includeObject", "")
        if self._table and self._include not in ("", "None", "Metadata", "Object"):
            raise status.bad_request(f'includeObject: unsupported value "{self._include}"')
        self._headers = True

    def line(self, kind: str, raw: bytes) -> bytes:
        raw = self._server._render(self._t, raw)
        if not self._table:
            return _line(kind, raw)
        obj = orjson.loads(raw)
        table = printing.table(self._t.resource, [obj], include=self._include, now=self._server.store.clock.now())
        table["metadata"] = {"resourceVersion": str((obj.get("metadata") or {}).get("resourceVersion") or "")}
        if not self._headers:
            table["columnDefinitions"] = None
        self._headers = False
        return _line(kind, orjson.dumps(table))

    def bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return self.line("BOOKMARK", orjson.dumps({"kind": self._t.resource.kind,
                                                   "apiVersion": self._t.resource.api_version, "metadata": meta}))


async def serve(request: exchange.Request, server: apiserver.ApiServer, t: requesting.Target, flt: tables.Filter,
                options: WatchOptions) -> exchange.Stream:
    """Open a watch: a refusal raises `status.ApiError` before anything is streamed; otherwise the
    stream's chunks are the watch events, from the first (initial ADDEDs or a 410 ERROR) to its end."""
    store = server.store
    key = t.resource.key
    rv_text = options.resource_version
    try:
        since = int(rv_text) if rv_text not in (None, "") else None
    except ValueError:
        raise status.bad_request(f'invalid resource version "{rv_text}"') from None
    if options.send_initial_events:
        since_for_store = None  # initial events, then changes: state "not older than" the given RV
        if since and since > store.resource_version:
            raise status.too_large_rv(since, store.resource_version)
    elif options.send_initial_events is False:
        since_for_store = since or store.resource_version
    else:
        since_for_store = since
    expired: status.ApiError | None = None
    watcher: tables.Watcher | None = None
    if since_for_store and server.faults.take_expiry(key):
        expired = status.too_old(since_for_store, store.resource_version)
    else:
        try:
            watcher = store.watch(key, flt, since_for_store)
        except status.ApiError as err:
            if err.status != 410:
                raise
            expired = err
    try:
        encoder = _Encoder(request, server, t)
    except status.ApiError:
        if watcher is not None:
            watcher.close()
        raise
    if watcher is None:
        assert expired is not None
        return exchange.Stream(_one(_line("ERROR", orjson.dumps(expired.status_obj))))
    return exchange.Stream(_events(request, server, t, watcher, options, encoder))


async def _one(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


async def _events(request: exchange.Request, server: apiserver.ApiServer, t: requesting.Target,
                  watcher: tables.Watcher, options: WatchOptions, encoder: _Encoder) -> AsyncIterator[bytes]:
    store = server.store
    loop = asyncio.get_running_loop()
    timeout = options.timeout_seconds
    if timeout is None:
        timeout = random.uniform(*DEFAULT_TIMEOUT_RANGE)
    deadline = loop.time() + timeout
    snapshot_rv = store.resource_version
    try:
        for chunk in _initial(encoder, watcher):
            yield chunk
        if options.send_initial_events:
            yield encoder.bookmark(snapshot_rv, initial_end=True)
        next_bookmark = loop.time() + server.bookmark_interval
        while True:
            now = loop.time()
            if now >= deadline:
                break
            if not watcher.queue.empty():
                # a change is waiting: take it now. Asked through wait_for with the bookmark already due (a
                # timeout of 0 or less), Python 3.11 cancels the get before it runs: the watch would spin
                # there for ever, delivering nothing (and on virtual time, stop the clock)
                change = watcher.queue.get_nowait()
            else:
                if options.bookmarks and now >= next_bookmark:
                    yield encoder.bookmark(store.resource_version)
                    next_bookmark = now + server.bookmark_interval
                    continue
                wait = min(deadline, next_bookmark) - now if options.bookmarks else deadline - now
                try:
                    change = await asyncio.wait_for(watcher.queue.get(), min(wait, server.liveness_interval))
                except TimeoutError:
                    if not request.connected():
                        break
                    continue
            if change is None:
                break
            lines = []
            while change is not None:
                event = watcher.translate(change)
                if event is not None:
                    lines.append(encoder.line(event[0], event[1].raw))
                if len(lines) >= BATCH or watcher.queue.empty():
                    break
                change = watcher.queue.get_nowait()
            if lines:
                yield b"".join(lines)
            if change is None:
                break
    finally:
        watcher.close()


def _initial(encoder: _Encoder, watcher: tables.Watcher) -> Iterator[bytes]:
    lines: list[bytes] = []
    while watcher.initial:
        change = watcher.initial.popleft()
        event = watcher.translate(change)
        if event is not None:
            lines.append(encoder.line(event[0], event[1].raw))
        if len(lines) >= BATCH:
            yield b"".join(lines)
            lines = []
    if lines:
        yield b"".join(lines)
