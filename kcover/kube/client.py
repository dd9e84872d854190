"""The one HTTP path to the Kubernetes API: raw JSON in, parsed dicts out.

Owns client construction (explicit kubeconfig, in-cluster, $KUBECONFIG, ~/.kube/config; the HTTP,
TLS and credentials are `transport`'s, which re-reads rotating service-account tokens), and
the mapping of error responses (Status objects and plain-text 429s) onto `errors.KubeError`
subclasses. It never deserialises into kubernetes-asyncio models: that costs 12-35x plain parsing.
Bodies are decoded by `decoding` (orjson, with fallbacks so that one object nested too deep cannot
break a list): an item left out of a list is logged and counted in `skips`.

Every request is counted by "<VERB> <resource>" in `request_counts`, which `kcover bench` reads.
Every request is retried as `retrying` says (429, 5xx, connection errors, within a deadline); a
write made for a leader passes its `retrying.Fence`, which keeps each attempt inside the term.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import structlog

from kcover import errors
from kcover.kube import decoding, retrying, transport

log = structlog.get_logger()

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Query = Mapping[str, str | int | bool] | Sequence[tuple[str, str | int | bool]]


def _verb(method: str, path: str, query: dict[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("1", "true", "True"):
            return "WATCH"
        parts = [p for p in path.split("?")[0].split("/") if p]
        # /api/v1/pods, /api/v1/namespaces/ns/pods and /apis/g/v/.. ; a get names an object after the plural
        return "LIST" if _is_collection(parts) else "GET"
    if method == "POST":
        return "CREATE"
    if method == "PUT":
        return "UPDATE"
    if method == "DELETE":
        parts = [p for p in path.split("/") if p]
        return "DELETECOLLECTION" if _is_collection(parts) else "DELETE"
    return method


def _is_collection(parts: list[str]) -> bool:
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    return len(rest) == 1


def resource_of(path: str) -> str:
    """`/api/v1/namespaces/ns/pods/p/log` -> `pods/log`; `/apis/kubeflow.org/v1/.../pytorchjobs` -> `pytorchjobs`."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    if not rest:
        return "discovery"
    if len(rest) >= 3:
        return f"{rest[0]}/{rest[2]}"
    return rest[0]


def error_from(status: int, body: bytes, headers: Mapping[str, str]) -> errors.KubeError:
    """Map an error response to the exception tree; handles Status JSON and plain text."""
    retry_after: float | None = None
    if "Retry-After" in headers:
        with contextlib.suppress(ValueError):
            retry_after = float(headers["Retry-After"])
    reason = ""
    message = body.decode("utf-8", "replace").strip()
    parsed: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(body)
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or message)
        details = parsed.get("details") or {}
        if retry_after is None and isinstance(details, dict) and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
    cls: type[errors.KubeError] = {
        404: errors.NotFoundError,
        409: errors.ConflictError,
        410: errors.GoneError,
        429: errors.TooManyRequestsError,
    }.get(status, errors.KubeError)
    return cls(f"HTTP {status} {reason}: {message}".replace("  ", " "), status=status, reason=reason,
               retry_after=retry_after, body=parsed)


class KubeClient:
    """Raw-JSON access to one API server. Create with `connect()` or `from_configuration()`."""

    def __init__(self, api: transport.Sender, *, request_timeout: float = 30.0,
                 retry: retrying.Policy = retrying.DEFAULT) -> None:
        self._api = api
        self.request_timeout = request_timeout
        self.retry = retry
        """How requests are retried; replace it to reconfigure (`retrying.NO_RETRY` turns retries off)."""
        self.request_counts: collections.Counter[str] = collections.Counter()
        self.retry_stats = retrying.Stats()
        self.skips = decoding.Skips()
        """Objects left out of lists and watches because they could not be decoded (`kcover_objects_skipped`)."""

    @property
    def host(self) -> str:
        return self._api.host

    @property
    def sender(self) -> transport.Sender:
        """The connections and credentials under this client: plain HTTP with none of its retries or counting
        (the bench's bare-client floor)."""
        return self._api

    async def close(self) -> None:
        await self._api.close()

    def fork(self) -> KubeClient:
        """A client of the same server and credentials with connections of its own and no retries, for use
        on another event loop (a thread that must not wait for this client's loop)."""
        return KubeClient(self._api.fork(), request_timeout=self.request_timeout, retry=retrying.NO_RETRY)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, method: str, path: str, *, query: Query | None, body: Any,
                    content_type: str | None, timeout: float | aiohttp.ClientTimeout | None) -> transport.Response:
        pairs = [(k, _qs(v)) for k, v in (query.items() if isinstance(query, Mapping) else (query or ()))]
        headers = {"Accept": "application/json", "Content-Type": content_type or JSON}
        self.request_counts[f"{_verb(method, path, dict(pairs))} {resource_of(path)}"] += 1
        try:
            response = await self._api.send(method, path, query=pairs, headers=headers, body=body,
                                            timeout=timeout if timeout is not None else self.request_timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise errors.KubeError(f"{method} {path}: {type(exc).__name__}: {exc}", status=0) from exc
        return response

    async def request(self, method: str, path: str, *, query: Query | None = None, body: Any = None,
                      content_type: str | None = None, timeout: float | None = None,
                      deadline: float | None = None, fence: retrying.Fence | None = None, retry: bool = True,
                      answer: Callable[[errors.KubeError], bool] | None = None) -> Any:
        """One request, retried as `self.retry` says; returns parsed JSON (or text for text/plain).

        `timeout` bounds each attempt (default `request_timeout`), `deadline` all of them (default
        `self.retry.deadline_seconds`); `fence` bounds each attempt of a leader's
        write to its term (and refuses it with `errors.NotLeaderError` once over); `retry=False` makes one
        attempt; `answer` picks out failures that are the request's answer, raised without a retry. Raises
        KubeError subclasses."""
        policy = self.retry if retry else retrying.NO_RETRY
        return await retrying.call(
            lambda budget: self._once(method, path, query=query, body=body, content_type=content_type,
                                      timeout=budget),
            policy=policy, timeout=timeout if timeout is not None else self.request_timeout,
            what=f"{method} {resource_of(path)}", deadline_seconds=deadline, fence=fence, stats=self.retry_stats,
            answer=answer)

    async def _once(self, method: str, path: str, *, query: Query | None, body: Any, content_type: str | None,
                    timeout: float) -> Any:
        response = await self._send(method, path, query=query, body=body, content_type=content_type,
                                    timeout=timeout)
        async with response:
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise errors.KubeError(f"{method} {path}: reading the response failed: {exc}") from exc
            if response.status >= 400:
                raise error_from(response.status, data, response.headers)
            if response.content_type == "text/plain":
                return data.decode("utf-8", "replace")
            if not data:
                return None
            document, skipped = decoding.page(data)
            for item in skipped:
                self.skipped(item, path=path)
            return document

    def skipped(self, item: decoding.Skipped, *, path: str) -> None:
        """Count and log an object left out of a list or a watch of `path`."""
        self.skips.add(item)
        log.warning("object_skipped", path=path, kind=item.kind, namespace=item.namespace, name=item.name,
                    reason=item.reason, error=item.error)

    async def text(self, path: str, *, query: Query | None = None, limit_bytes: int | None = None) -> str:
        """GET a text/plain resource such as pods/log, reading at most `limit_bytes`."""
        response = await self._send("GET", path, query=query, body=None, content_type=None, timeout=None)
        async with response:
            if response.status >= 400:
                raise error_from(response.status, await response.read(), response.headers)
            data = await (response.content.read(limit_bytes) if limit_bytes else response.read())
            return data.decode("utf-8", "replace")

    @contextlib.asynccontextmanager
    async def stream(self, path: str, *, query: Query, read_timeout: float) -> AsyncIterator[transport.Response]:
        """Open a watch; yields the response whose `.content` gives one JSON document per line."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout, sock_read=read_timeout)
        response = await self._send("GET", path, query=query, body=None, content_type=None, timeout=timeout)
        async with response:
            if response.status >= 400:
                raise error_from(response.status, await response.read(), response.headers)
            yield response


def _qs(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def from_configuration(configuration: Any, *, request_timeout: float = 30.0,
                       retry: retrying.Policy = retrying.DEFAULT, headers: Mapping[str, str] | None = None) -> KubeClient:
    """From a kubernetes-asyncio `Configuration` (tests and the simulated cluster hand one out)."""
    return KubeClient(transport.Transport.from_configuration(configuration, headers=headers),
                      request_timeout=request_timeout, retry=retry)


async def connect(kubeconfig: str = "", *, environ: Mapping[str, str] | None = None,
                  request_timeout: float = 30.0, retry: retrying.Policy = retrying.DEFAULT) -> KubeClient:
    """Explicit kubeconfig, else in-cluster, else $KUBECONFIG, else ~/.kube/config."""
    api = await open_transport(kubeconfig, environ=environ)
    return KubeClient(api, request_timeout=request_timeout, retry=retry)


async def open_transport(kubeconfig: str = "", *, environ: Mapping[str, str] | None = None) -> transport.Transport:
    """The transport `connect` builds its client on (for a client subclass). Raises ConfigError."""
    env = os.environ if environ is None else environ
    if not kubeconfig and env.get("KUBERNETES_SERVICE_HOST"):
        api, source = transport.in_cluster(env), "in-cluster"
    else:
        source = kubeconfig or env.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
        try:
            if transport.needs_plugin(transport.read_kubeconfig(source)):
                api = transport.Transport.from_configuration(await _plugin_configuration(source))
            else:
                api = transport.from_kubeconfig(source)
        except errors.ConfigError as exc:
            raise errors.ConfigError(f"no usable Kubernetes credentials: {exc}") from exc
    log.info("kube_client_configured", source=source, host=api.host)
    return api


async def _plugin_configuration(path: str) -> Any:
    """kubernetes-asyncio's loader, for `exec` and `auth-provider` users only (imported only then: its
    client package alone costs about 140 ms and 35 MiB)."""
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise errors.ConfigError(f"{path}: {exc}") from exc
    return configuration
