"""The reflector: keeps one resource's slim store in step with the API server by list, then watch.

Owns the list/watch protocol of one collection: a consistent paginated list (`limit`/`continue`),
a watch from the list's resourceVersion with bookmarks and a server-side timeout, re-listing on 410
(an ERROR event with code 410 or a `GoneError`), backoff with jitter on errors, `Retry-After` on 429,
and an inactivity timeout (no line for that long restarts the watch). Lines are decoded and projected
at once; raw dicts are never kept.

A re-list never loses or repeats a change: the new list is diffed against the store and only the
differences are delivered (an object whose resourceVersion is unchanged keeps its record, not projected
again, so a re-list holds at most the changed objects twice), as synthetic ADDED / MODIFIED / DELETED (objects keyed by uid, compared by
resourceVersion). Every change goes to `sink(old, new)` synchronously after the store was updated
(`old` None on add, `new` None on delete). `load(objects)` runs the same projection and diff on
objects handed in (an offline reflector, with no client, gets its contents only that way).

Bodies and lines are decoded by `decoding`: an object that cannot be decoded (nested too deep outside
its managedFields) is left out of its list page or skipped in the watch, logged and counted in the
client's `skips`; it never fails the list or ends the watch.

A reflector given `locate` (see `capabilities.locator`) asks it for its collection's path before its
first list and again each time the collection was missing: None (the server serves no version kcover
reads) means nothing is listed or watched; the reflector counts as listed and synced, empty, logs
`watch_kind_unserved` once and asks again after `missing_retry_seconds`.

While any reflector lists (`ReflectorOptions.pause_gc`), Python's cyclic GC is held off (`GcPause`): each
page decodes into 60,000 to 80,000 short-lived dicts and lists, and the collections they trigger rescan the
store the list is filling; at 60,000 pods on a real kube-apiserver they were half of the controller's CPU
over its first sync (7.95 to 9.35 s of 12.2 to 13.8 s; 4.2 to 4.9 s of 8.3 to 9.6 s with it held off). A cache that freezes
after its first sync (`caching.ClusterCache.freeze_gc`) has `GcPause.then` collect and freeze as the last
list ends, before the collector runs again: the lists' objects, all still in its youngest generation, are
then traversed once, as before the pause, not twice.

`listed` is set once the first list finished; `synced` while the store is in step: it is set by every
list and cleared once the reflector has kept failing (no list finished and no watch opened) for
`stall_seconds`, until it lists or watches again. It does not index or fan out (see `indexing.py`, which
`caching.py` keeps with its reflectors).
Failures never escape `run()` except cancellation: errors are logged and retried; a 404 on list (CRD
not installed) is logged once and retried slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
import structlog

from kcover import errors
from kcover.aio import backoff as backoff_
from kcover.aio import waiting
from kcover.kube import client as client_
from kcover.kube import decoding

log = structlog.get_logger()


class Record(Protocol):
    @property
    def uid(self) -> str: ...

    @property
    def rv(self) -> str: ...


T = TypeVar("T", bound=Record)
Sink = Callable[[T | None, T | None], None]


@dataclass(frozen=True)
class ReflectorOptions:
    page_size: int = 500
    """Objects per list page."""
    watch_timeout_seconds: int = 300
    """`timeoutSeconds` asked of each watch."""
    inactivity_timeout_seconds: float = 120.0
    """No line at all (not even a bookmark) for this long restarts the watch."""
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    missing_retry_seconds: float = 300.0
    """Retry interval while the collection answers 404 (its CRD is not installed) or is not served."""
    request_timeout_seconds: float = 60.0
    """Seconds one list page may take."""
    stall_seconds: float = 60.0
    """Failing for this long without a list finished or a watch opened clears `synced`."""
    pause_gc: bool = True
    """Hold off the cyclic GC while this reflector lists (`GcPause`)."""


class GcPause:
    """Python's cyclic GC held off while one or more lists run, as it was before the first once the last ends.

    Process-wide, as the collector is: a list's pages are garbage freed by reference counting (JSON holds
    no cycles), and the few cycles other tasks leave meanwhile wait for the collector until the last list
    ends. Nested and concurrent lists count; an error or a cancellation ends a list's share as its end does."""

    def __init__(self) -> None:
        self.depth = 0
        self._was_enabled = False
        self._then: Callable[[], None] | None = None

    def then(self, work: Callable[[], None]) -> None:
        """Run `work` once, when the outermost list now running (or the next one) ends, before the collector
        runs again: the cache's `gc.collect()` and `gc.freeze()` after its first sync, so that the objects the
        lists made are traversed once, by that collection, and not first by the youngest generation's."""
        self._then = work

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self.depth == 0:
            self._was_enabled = gc.isenabled()
            gc.disable()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                work, self._then = self._then, None
                try:
                    if work is not None:
                        work()
                finally:
                    if self._was_enabled:
                        gc.enable()


LISTING = GcPause()
"""The pause every reflector's list shares."""


class _Expired(Exception):
    """The watch said 410: the resourceVersion is too old; re-list."""


class Reflector(Generic[T]):
    """List+watch of `path` (e.g. `/api/v1/pods`) projected through `project` into `store`."""

    def __init__(self, kube: client_.KubeClient | None, path: str, project: Callable[[Mapping[str, Any]], T | None],
                 *, sink: Sink[T], name: str = "", options: ReflectorOptions | None = None,
                 query: Mapping[str, str] | None = None, kind: str = "",
                 locate: Callable[[], Awaitable[str | None]] | None = None) -> None:
        """`path`: the collection; with `locate`, only the path used until `locate` first answers."""
        self._kube = kube
        self.path = path
        self._locate = locate
        self.name = name or path
        self.kind = kind
        """The kind of the collection's objects, naming those skipped ('' lets each list say)."""
        self._project = project
        self._sink = sink
        self.options = options or ReflectorOptions()
        self._query = dict(query or {})
        self.store: dict[str, T] = {}
        self.resource_version = ""
        self.listed = asyncio.Event()
        """Set once the first list finished (or the collection was found missing)."""
        self.synced = asyncio.Event()
        """Set while the store is in step: by every list; cleared after `stall_seconds` of failures."""
        self.failing_since: float | None = None
        """Loop time of the first failure since the last list or watch that worked; None while working."""
        self.last_error = ""
        self.missing = False
        """True while the collection answers 404 or (with `locate`) is not served."""
        self.unserved = False
        """True while `locate` says the server serves no version of the collection."""
        self.lists = 0
        self.watches = 0
        self.list_seconds = 0.0
        """How long the last complete list took, from its first page asked to the store replaced."""

    # ------------------------------------------------------------------------------------- run loop

    @property
    def kube(self) -> client_.KubeClient:
        if self._kube is None:
            raise errors.KcoverError(f"reflector {self.name} is offline: it has no client to list or watch with")
        return self._kube

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace the store with the projections of `objects`, as a list would; mark it synced."""
        items: dict[str, T] = {}
        for raw in objects:
            record = self._project(raw)
            if record is not None:
                items[record.uid] = record
        self._replace(items)
        self.listed.set()
        self.synced.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.kube  # noqa: B018  (an offline reflector raises here, not in the retry loop)
        opts = self.options
        backoff = backoff_.Backoff(initial=opts.backoff_initial_seconds, maximum=opts.backoff_max_seconds)
        need_list = True
        while not stop.is_set():
            delay = 0.0
            try:
                if need_list and self._locate is not None and (self.lists == 0 or self.missing) \
                        and not await self._located():
                    delay = opts.missing_retry_seconds  # not served: nothing to list; ask again later
                else:
                    if need_list:
                        await self._list()
                        need_list = False
                        backoff.reset()
                    await self._watch(stop)
            except _Expired:
                log.info("watch_expired_relisting", reflector=self.name, resource_version=self.resource_version)
                need_list = True
            except errors.NotFoundError as exc:
                if need_list:
                    if not self.missing:
                        log.warning("watch_kind_missing", reflector=self.name, error=str(exc),
                                    retry_seconds=opts.missing_retry_seconds)
                    self.missing = True
                    self._replace({})
                    self._working()
                    self.listed.set()
                    self.synced.set()
                    delay = opts.missing_retry_seconds
                else:
                    need_list = True
                    delay = backoff.next_delay()
            except errors.GoneError:
                if need_list:  # the list itself was refused: back off before listing again
                    log.info("list_expired_relisting", reflector=self.name)
                    delay = backoff.next_delay()
                else:  # a watch answered HTTP 410 instead of a 410 ERROR event: the same thing
                    log.info("watch_expired_relisting", reflector=self.name,
                             resource_version=self.resource_version)
                need_list = True
            except errors.TooManyRequestsError as exc:
                delay = exc.retry_after if exc.retry_after is not None else backoff.next_delay()
                log.warning("watch_throttled", reflector=self.name, retry_after=delay)
                self._failed(exc)
            except errors.KubeError as exc:
                delay = backoff.next_delay()
                log.warning("watch_failed", reflector=self.name, error=str(exc), retry_in=round(delay, 3))
                self._failed(exc)
            except Exception as exc:  # task boundary: an unexpected bug must not end the cache; start over
                delay = backoff.next_delay()
                need_list = True
                log.exception("reflector_failed", reflector=self.name, retry_in=round(delay, 3))
                self._failed(exc)
            if delay > 0:
                await waiting.sleep_or_stop(stop, delay)

    async def _located(self) -> bool:
        """Ask `locate` for the path; False (store emptied, listed and synced) when nothing is served. Raises
        `errors.KubeError` when the server did not say (the run loop backs off and asks again)."""
        assert self._locate is not None
        path = await self._locate()
        if path is None:
            if not self.unserved:
                log.info("watch_kind_unserved", reflector=self.name, retry_seconds=self.options.missing_retry_seconds)
            self.unserved = self.missing = True
            self._replace({})
            self._working()
            self.listed.set()
            self.synced.set()
            return False
        if self.unserved or path != self.path:
            log.info("watch_kind_located", reflector=self.name, path=path)
        self.unserved = False
        self.path = path
        return True

    def _working(self) -> None:
        """A list finished or a watch opened: the reflector is in step again."""
        if self.failing_since is not None and not self.synced.is_set() and self.listed.is_set():
            log.info("reflector_syncing_again", reflector=self.name)
        self.failing_since = None
        self.last_error = ""

    def _failed(self, exc: BaseException) -> None:
        """A list or watch failed; past `stall_seconds` of nothing but failures, `synced` is cleared."""
        now = asyncio.get_running_loop().time()
        self.last_error = str(exc)[:300] or type(exc).__name__
        if self.failing_since is None:
            self.failing_since = now
        elif now - self.failing_since >= self.options.stall_seconds and self.synced.is_set():
            log.warning("reflector_stalled", reflector=self.name, seconds=round(now - self.failing_since, 1),
                        error=self.last_error)
            self.synced.clear()

    # ----------------------------------------------------------------------------------------- list

    async def _list(self) -> None:
        with LISTING.held() if self.options.pause_gc else contextlib.nullcontext():
            await self._list_pages()

    async def _list_pages(self) -> None:
        started = asyncio.get_running_loop().time()
        items: dict[str, T] = {}
        query: dict[str, str | int] = {**self._query, "limit": self.options.page_size}
        list_rv = ""
        while True:
            page = await self.kube.request("GET", self.path, query=query,
                                            timeout=self.options.request_timeout_seconds)
            if not isinstance(page, dict):
                raise errors.KubeError(f"list {self.path}: not a JSON object")
            meta = page.get("metadata") or {}
            list_rv = str(meta.get("resourceVersion") or list_rv)
            project, known = self._project, self.store
            for raw in page.get("items") or ():
                raw_meta = raw.get("metadata") or {}
                old = known.get(raw_meta.get("uid") or "")
                if old is not None and old.rv == raw_meta.get("resourceVersion"):
                    items[old.uid] = old  # unchanged since we last saw it: no new projection (re-list memory)
                    continue
                record = project(raw)
                if record is not None:
                    items[record.uid] = record
            token = meta.get("continue")
            if not token:
                break
            query = {**self._query, "limit": self.options.page_size, "continue": token}
        self.lists += 1
        if self.missing:
            log.info("watch_kind_found", reflector=self.name)
            self.missing = False
        self.resource_version = list_rv
        self._replace(items)
        self._working()
        self.list_seconds = asyncio.get_running_loop().time() - started
        self.listed.set()
        self.synced.set()
        log.debug("list_synced", reflector=self.name, objects=len(items), resource_version=list_rv)

    def _replace(self, items: dict[str, T]) -> None:
        """Swap the store for `items`, delivering only the differences."""
        old_store = self.store
        self.store = items
        sink = self._sink
        for uid, new in items.items():
            old = old_store.get(uid)
            if old is None:
                sink(None, new)
            elif old.rv != new.rv:
                sink(old, new)
            else:
                items[uid] = old  # keep the identical record the subscribers already know
        for uid, old in old_store.items():
            if uid not in items:
                sink(old, None)

    # ---------------------------------------------------------------------------------------- watch

    async def _watch(self, stop: asyncio.Event) -> None:
        opts = self.options
        query = {**self._query, "watch": "true", "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(opts.watch_timeout_seconds)}
        self.watches += 1
        stopper = asyncio.ensure_future(stop.wait())
        reader: asyncio.Future[bytes] | None = None
        try:
            async with self.kube.stream(self.path, query=query,
                                         read_timeout=opts.inactivity_timeout_seconds) as response:
                if self.failing_since is not None:
                    self._working()
                    self.synced.set()
                pending = b""
                chunks = response.content.iter_any().__aiter__()
                while True:
                    reader = asyncio.ensure_future(anext(chunks, b""))
                    await asyncio.wait((reader, stopper), return_when=asyncio.FIRST_COMPLETED)
                    if not reader.done():
                        return  # stop was set; `finally` cancels the read
                    chunk = reader.result()
                    if not chunk:
                        return  # the server ended the watch (timeoutSeconds): watch again from our RV
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self._handle(line)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
                log.info("watch_inactive_restarting", reflector=self.name,
                         seconds=opts.inactivity_timeout_seconds)
                return
            raise errors.KubeError(f"watch {self.path}: {type(exc).__name__}: {exc}") from exc
        finally:
            stopper.cancel()
            if reader is not None:
                if reader.done():
                    if not reader.cancelled():
                        reader.exception()  # retrieved: it was handled above or is moot now
                else:
                    reader.cancel()
                    reader.add_done_callback(_consume)

    def _handle(self, line: bytes) -> None:
        event, skipped = decoding.event(line, kind=self.kind)
        if skipped is not None:
            if line.lstrip()[:1] == b"{":  # an object that cannot be decoded: skip it, keep watching
                self.kube.skipped(skipped, path=self.path)
                return
            text = line[:200].decode("utf-8", "replace")  # not JSON at all: the stream itself is wrong
            if "too many requests" in text.lower():
                raise errors.TooManyRequestsError(f"watch {self.path}: {text}", status=429)
            raise errors.KubeError(f"watch {self.path}: a line is not JSON: {text!r}")
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise errors.KubeError(f"watch {self.path}: event without object: {line[:200]!r}")
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410 or obj.get("reason") in ("Expired", "Gone"):
                raise _Expired()
            if code == 429:
                raise errors.TooManyRequestsError(f"watch {self.path}: {obj.get('message')}", status=429)
            raise errors.KubeError(f"watch {self.path}: {obj.get('message')}", status=int(code or 0),
                                   reason=str(obj.get("reason") or ""), body=obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return
        record = self._project(obj)
        uid = record.uid if record is not None else str((obj.get("metadata") or {}).get("uid") or "")
        store = self.store
        old = store.get(uid)
        if kind == "DELETED" or record is None:
            if old is not None:
                del store[uid]
                self._sink(old, None)
        elif kind in ("ADDED", "MODIFIED"):
            if old is None or old.rv != record.rv:
                store[uid] = record
                self._sink(old, record)
        else:
            log.warning("watch_event_unknown", reflector=self.name, type=kind)
        if rv:
            self.resource_version = str(rv)


def _consume(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled():
        future.exception()
