"""The simulated API server in the client's own event loop: a `KubeClient` transport with no socket.

Owns `Front` (the in-process front of one `apiserver.ApiServer`: up or down, and the clients built on
it) and `Transport` (what `kcover.kube.client.KubeClient` sends through: `kcover.kube.transport.Sender`).
A request is encoded as over HTTP (JSON bytes, headers, query pairs), answered by the same
`ApiServer.handle` the loopback HTTP front calls, and read back through the same `KubeClient` code
(status mapping, retries, watch line splitting): only the sockets and the HTTP framing are gone. So
the whole controller, agents and leader election run against the simulated cluster on virtual time
(looptime), as nothing here waits on the operating system.

Timeouts: a float is the whole request's budget, an `aiohttp.ClientTimeout`'s `sock_read` bounds each
wait for the next chunk of a stream (as aiohttp's does), and both raise `TimeoutError`, which the
client maps to a retryable error. While the server is down (`Front.up` False: `SimServer.restart()` or
`stop()`) every request fails with `aiohttp.ClientConnectionError`, as a refused connection would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from kcover import errors
from kcover.sim import exchange

if TYPE_CHECKING:
    from kcover.kube import client as client_
    from kcover.sim import apiserver

HOST = "inprocess://kcover-sim"


class Front:
    """The in-process front of one simulated API server."""

    def __init__(self, api: apiserver.ApiServer) -> None:
        self.api = api
        self.up = True

    def client(self, *, request_timeout: float = 30.0, retry: Any = None) -> client_.KubeClient:
        from kcover.kube import client as client_  # the sim sits above kube; imported here to keep it lazy
        from kcover.kube import retrying

        return client_.KubeClient(Transport(self), request_timeout=request_timeout,
                                  retry=retry if retry is not None else retrying.DEFAULT)


class _Content:
    """A response body read as aiohttp's `StreamReader` is: whole, `read(n)`, `iter_any()`, or by lines."""

    def __init__(self, chunks: AsyncIterator[bytes] | None, body: bytes, read_timeout: float | None) -> None:
        self._chunks = chunks
        self._buffer = bytearray(body)
        self._read_timeout = read_timeout
        self._eof = chunks is None

    async def _more(self) -> bool:
        """Pull the next chunk into the buffer; False at the end of the body."""
        if self._eof or self._chunks is None:
            return False
        try:
            if self._read_timeout is None:
                chunk = await anext(self._chunks)
            else:
                async with asyncio.timeout(self._read_timeout):
                    chunk = await anext(self._chunks)
        except StopAsyncIteration:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    async def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buffer) < n) and await self._more():
            pass
        size = len(self._buffer) if n < 0 else min(n, len(self._buffer))
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    async def iter_any(self) -> AsyncIterator[bytes]:
        while self._buffer or await self._more():
            out = bytes(self._buffer)
            self._buffer.clear()
            yield out

    async def readline(self) -> bytes:
        while b"\n" not in self._buffer and await self._more():
            pass
        end = self._buffer.find(b"\n")
        size = len(self._buffer) if end < 0 else end + 1
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        while line := await self.readline():
            yield line

    async def close(self) -> None:
        if self._chunks is not None and not self._eof:
            self._eof = True
            with contextlib.suppress(Exception):
                await self._chunks.aclose()  # type: ignore[attr-defined]


class Response:
    """What `KubeClient` reads of an answer (the part of `aiohttp.ClientResponse` it uses)."""

    def __init__(self, answer: exchange.Answer, read_timeout: float | None) -> None:
        self.status = answer.status
        self.content_type = answer.content_type
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(
            {"Content-Type": answer.content_type, **answer.headers}))
        if isinstance(answer, exchange.Reply):
            self.content = _Content(None, answer.body, read_timeout)
        else:
            self.content = _Content(answer.chunks, b"", read_timeout)
        self.closed = False

    async def read(self) -> bytes:
        return await self.content.read()

    async def release(self) -> None:
        self.closed = True
        await self.content.close()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()


class Transport:
    """`kcover.kube.transport.Sender` over a `Front`."""

    def __init__(self, front: Front, *, headers: Mapping[str, str] | None = None) -> None:
        self._front = front
        self.host = HOST
        self.headers = dict(headers or {})

    async def close(self) -> None:
        return None

    def fork(self) -> Transport:
        """Never: the front serves the simulated cluster's own event loop only."""
        raise errors.KcoverError("the in-process transport serves the simulated cluster's event loop only")

    async def send(self, method: str, path: str, *, query: Sequence[tuple[str, str]], headers: Mapping[str, str],
                   body: Any, timeout: float | aiohttp.ClientTimeout | None) -> Response:
        if not self._front.up:
            raise aiohttp.ClientConnectionError(f"{HOST}: the simulated API server is not serving")
        data = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(
            body, option=orjson.OPT_NON_STR_KEYS)
        response: Response | None = None

        def connected() -> bool:
            return self._front.up and not (response is not None and response.closed)

        request = exchange.Request.of(method, path, query=list(query), headers={**self.headers, **headers},
                                      body=data, connected=connected)
        total = timeout if isinstance(timeout, int | float) else (timeout.total if timeout is not None else None)
        read_timeout = timeout.sock_read if isinstance(timeout, aiohttp.ClientTimeout) else None
        if total:
            async with asyncio.timeout(total):
                answer = await self._front.api.handle(request)
        else:
            answer = await self._front.api.handle(request)
        response = Response(answer, read_timeout)
        return response
