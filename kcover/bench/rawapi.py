"""A bare aiohttp path to the API server: the bench's writer and its watch-delivery floor.

Owns plain JSON requests over kcover's transport (`kube.transport`: the kubeconfig's server and
credentials, one aiohttp session) without the client's retries and counting, and a plain watch that
timestamps each line as it arrives. It is what "the floor" means: no cache, no projection, no
detector between the socket and the clock. It also seeds. Not used by the product.

How it fails: `errors.KubeError` subclasses for error answers (via `client.error_from`),
`errors.ConfigError` when the kubeconfig cannot be read.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from kcover.kube import client as client_
from kcover.kube import transport as transport_


async def open_api(kubeconfig: str) -> RawApi:
    """A `RawApi` for a kubeconfig, on kcover's own transport (its credentials, its connection pool)."""
    return RawApi(await client_.open_transport(kubeconfig))


class RawApi:
    """Plain HTTP to one API server. `async with await open_api(path) as api:`."""

    def __init__(self, transport: transport_.Transport) -> None:
        self.transport = transport
        self.base = transport.host

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> RawApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None,
                      content_type: str = client_.JSON) -> Any:
        resp = await self.transport.send(method, path, query=list((query or {}).items()), body=body, timeout=None,
                                         headers={"Accept": client_.JSON, "Content-Type": content_type})
        async with resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise client_.error_from(resp.status, raw, resp.headers)
            return orjson.loads(raw) if raw else None

    async def watch(self, path: str, query: Mapping[str, str]) -> AsyncIterator[tuple[float, dict[str, Any]]]:
        """Yield (perf_counter at arrival, watch event) for each line of a watch."""
        params = {**query, "watch": "true", "allowWatchBookmarks": "false"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
        resp = await self.transport.send("GET", path, query=list(params.items()), body=None, timeout=timeout,
                                         headers={"Accept": client_.JSON})
        async with resp:
            if resp.status >= 400:
                raise client_.error_from(resp.status, await resp.read(), resp.headers)
            async for line in resp.content:
                yield time.perf_counter(), orjson.loads(line)
