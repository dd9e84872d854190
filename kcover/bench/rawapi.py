"""A bare aiohttp path to the API server: the bench's writer and its watch-delivery floor.

Owns one aiohttp session built from a kubeconfig (server, bearer token or client certificate, CA),
plain JSON requests, and a plain watch that timestamps each line as it arrives. It is what "the
floor" means: no cache, no projection, no detector between the socket and the clock. It also seeds
(kcover's `KubeClient` goes through kubernetes-asyncio's request path, about 2 ms of CPU per write,
which would make seeding 150,000 pods take minutes of client time). Not used by the product.

How it fails: `errors.KubeError` subclasses for error answers (via `client.error_from`),
`errors.ConfigError` when the kubeconfig cannot be read.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from kcover import errors
from kcover.kube import client as client_


async def configuration(kubeconfig: str) -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise errors.ConfigError(f"{kubeconfig}: no usable Kubernetes credentials: {exc}") from exc
    return cfg


async def open_api(kubeconfig: str, *, concurrency: int = 64) -> RawApi:
    """A `RawApi` for a kubeconfig (bearer token read once: the bench runs for minutes, not hours)."""
    cfg = await configuration(kubeconfig)
    token = await cfg.get_api_key_with_prefix("authorization") or await cfg.get_api_key_with_prefix("BearerToken")
    return RawApi(cfg, token=str(token or ""), concurrency=concurrency)


class RawApi:
    """Plain HTTP to one API server. `async with await open_api(path) as api:`."""

    def __init__(self, cfg: k8s_client.Configuration, *, token: str = "", concurrency: int = 64) -> None:
        self.base = str(cfg.host).rstrip("/")
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["Authorization"] = token
        context: ssl.SSLContext | bool = False
        if self.base.startswith("https"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if not cfg.verify_ssl:  # the kubeconfig asked for insecure-skip-tls-verify
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
        self._connector = aiohttp.TCPConnector(limit=concurrency, ssl=context)
        self.session = aiohttp.ClientSession(connector=self._connector)

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> RawApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None,
                      content_type: str = client_.JSON) -> Any:
        data = orjson.dumps(body) if body is not None else None
        headers = {**self.headers, "Content-Type": content_type}
        async with self.session.request(method, self.base + path, data=data, params=query, headers=headers) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise client_.error_from(resp.status, raw, resp.headers)
            return orjson.loads(raw) if raw else None

    async def watch(self, path: str, query: Mapping[str, str]) -> AsyncIterator[tuple[float, dict[str, Any]]]:
        """Yield (perf_counter at arrival, watch event) for each line of a watch."""
        params = {**query, "watch": "true", "allowWatchBookmarks": "false"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
        async with self.session.get(self.base + path, params=params, headers=self.headers, timeout=timeout) as resp:
            if resp.status >= 400:
                raise client_.error_from(resp.status, await resp.read(), resp.headers)
            async for line in resp.content:
                yield time.perf_counter(), orjson.loads(line)
