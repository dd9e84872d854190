"""An HTTP reverse proxy in front of a test's API server that answers chosen requests with 500s: an outage of
one resource on any backend (the simulated server, a real kube-apiserver).

`async with FaultProxy.around(configuration) as proxy:` serves plain HTTP on loopback and forwards every
request, headers (the bearer token) and body as sent, to the server `configuration` names (HTTPS with its
CA, or the simulated server's HTTP), streaming the answer back as it comes (watches included).
`proxy.configuration` is a copy of `configuration` pointing at the proxy, for the clients under test.
`proxy.fail("configmaps", methods={"GET"})` answers every matching request with a 500 `InternalError`
Status, as kube-apiserver does when etcd is unreachable, and ends the open watches of that resource so
their clients have to list again; `proxy.heal()` ends the outage. The resource of a request is its path's
plural (`/api/v1/namespaces` and `/api/v1/namespaces/x` are `namespaces`, `.../namespaces/x/configmaps/y`
is `configmaps`). `proxy.failed` counts the requests answered so, by resource.

Test code only: it decides nothing about kcover and does not import it.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp
from aiohttp import web

HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
                 "proxy-connection", "te", "trailer"})
OUTAGE = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
          b'"message":"etcdserver: request timed out (injected outage)","reason":"InternalError","code":500}')


def resource_of(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        rest = parts[3:]
    else:
        return ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        return rest[2]
    return rest[0] if rest else ""


class FaultProxy:
    def __init__(self, upstream: str, *, ssl_context: ssl.SSLContext | None) -> None:
        self.upstream = upstream.rstrip("/")
        self._ssl = ssl_context
        self._outages: dict[str, frozenset[str] | None] = {}
        self._streams: dict[str, set[aiohttp.ClientResponse]] = collections.defaultdict(set)
        """Resource -> the upstream answers being streamed back now (watches): closed when an outage begins."""
        self.failed: collections.Counter[str] = collections.Counter()
        self.url = ""
        self.configuration: Any = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def around(cls, configuration: Any) -> AsyncIterator[FaultProxy]:
        context = None
        if str(configuration.host).startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            context.check_hostname = False  # the serving certificate names the IP; the chain is still verified
        proxy = cls(configuration.host, ssl_context=context)
        await proxy.start()
        proxy.configuration = copy.copy(configuration)
        proxy.configuration.host = proxy.url
        try:
            yield proxy
        finally:
            await proxy.close()

    def fail(self, resource: str, *, methods: Iterable[str] | None = None) -> None:
        """Answer requests for `resource` (by `methods`, all when None) with 500s until `heal()`."""
        self._outages[resource] = frozenset(m.upper() for m in methods) if methods is not None else None
        for upstream in list(self._streams.get(resource, ())):
            upstream.close()

    def heal(self) -> None:
        self._outages.clear()

    def _failing(self, method: str, resource: str) -> bool:
        if resource not in self._outages:
            return False
        methods = self._outages[resource]
        return methods is None or method in methods

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                              auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        for streams in self._streams.values():
            for upstream in list(streams):
                upstream.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resource = resource_of(request.path)
        if self._failing(request.method, resource):
            self.failed[resource] += 1
            return web.Response(status=500, body=OUTAGE, content_type="application/json")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        try:
            upstream = await self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                                   data=body or None, ssl=self._ssl if self._ssl else False,
                                                   allow_redirects=False)
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"proxy: {exc}")
        try:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
            await response.prepare(request)
            self._streams[resource].add(upstream)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the outage closed the upstream answer, or the client went away: the stream ends
            finally:
                self._streams[resource].discard(upstream)
            if request.transport is not None and not request.transport.is_closing():
                with contextlib.suppress(ConnectionResetError):
                    await response.write_eof()
            return response
        finally:
            upstream.release()
