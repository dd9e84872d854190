"""One request and one answer of the simulated API server, independent of how they travel.

Owns the server's view of an HTTP exchange: `Request` (method, path, query, headers, body, and
whether the client is still there) and the two kinds of answer, `Reply` (a whole body) and `Stream`
(a watch: an async iterator of byte chunks, written as they exist). `kcover.sim.apiserver` answers
`Request`s with these; two fronts carry them: aiohttp over loopback sockets (`front_http`, for
kubectl, subprocesses and the real-HTTP tests) and a transport a `KubeClient` uses in the same
event loop with no socket at all (`kcover.sim.inprocess`, so that the whole controller can run on
virtual time). One server implementation decides every answer on both.

It does no I/O itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy, MultiMapping

JSON = "application/json"


@dataclass
class Request:
    """What the server reads of a request (the subset of aiohttp's `web.Request` it uses)."""

    method: str
    path: str
    query: MultiMapping[str]
    headers: Mapping[str, str]
    """Case-insensitive (a `CIMultiDictProxy`)."""
    body: bytes = b""
    connected: Callable[[], bool] = lambda: True
    """False once the client went away (a watch then ends at its next liveness check)."""

    async def read(self) -> bytes:
        return self.body

    @classmethod
    def of(cls, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
           headers: Mapping[str, str] | None = None, body: bytes = b"",
           connected: Callable[[], bool] = lambda: True) -> Request:
        return cls(method, path, MultiDictProxy(MultiDict(query or [])),
                   CIMultiDictProxy(CIMultiDict(headers or {})), body, connected)


@dataclass
class Reply:
    """A whole answer: status, body and content type (plus any other headers)."""

    status: int = 200
    body: bytes = b""
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stream:
    """A streamed answer (a watch): 200 and its chunks, each written as soon as it exists.

    `chunks` is an async generator; the front closes it (`aclose()`) when the client goes away, which
    runs the generator's `finally` (the store's watcher is released there)."""

    chunks: AsyncIterator[bytes]
    status: int = 200
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=lambda: {"Cache-Control": "no-cache, private"})


Answer = Reply | Stream
