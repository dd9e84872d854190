"""`Api`: raw Kubernetes HTTP through kubernetes-asyncio, for the conformance suite."""

from __future__ import annotations

import asyncio
import importlib.resources
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes_asyncio import client


class Api:
    """Raw HTTP through kubernetes-asyncio's ApiClient (auth, TLS), answers parsed with orjson."""

    def __init__(self, api_client: client.ApiClient, backend: str,
                 compact: Callable[[str], None] | None = None) -> None:
        self.client = api_client
        self.backend = backend
        self._compact = compact

    def compact(self, resource: str) -> None:
        """Drop the server's watch history of `resource` (sim: its ring; real: an etcd compaction, with
        that resource's watch cache disabled by the test control plane), so older RVs get 410."""
        if self._compact is None:
            raise RuntimeError(f"the {self.backend} backend cannot compact")
        self._compact(resource)

    async def raw(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                  content_type: str | None = None, request_timeout: float = 30) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, str(v).lower() if isinstance(v, bool) else v) for k, v in (query or {}).items()]
        return await self.client.call_api(path, method, query_params=params, header_params=headers, body=body,
                                          auth_settings=["BearerToken"], _preload_content=False,
                                          _return_http_data_only=True, _request_timeout=request_timeout)

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        resp = await self.raw(method, path, **kwargs)
        data = await resp.read()
        resp.release()
        try:
            return resp.status, orjson.loads(data)
        except orjson.JSONDecodeError:
            return resp.status, data.decode()

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        code, body = await self.request(method, path, **kwargs)
        assert 200 <= code < 300, (code, body)
        return body

    async def watch(self, path: str, query: dict[str, Any], *, until: int = 0, seconds: float = 10) -> list[Any]:
        """Read watch events until `until` have arrived, the stream ends, or `seconds` pass."""
        code, events = await self.stream(path, query, until=until, seconds=seconds)
        assert code == 200, events
        return events

    async def stream(self, path: str, query: dict[str, Any], *, until: int = 0,
                     seconds: float = 10) -> tuple[int, Any]:
        """Like `watch`, but answers (HTTP status, events) and a non-200 answer as (status, Status)."""
        query = {"watch": "true", **query}
        resp = await self.raw("GET", path, query=query, request_timeout=seconds + 5)
        if resp.status != 200:
            body = orjson.loads(await resp.read())
            resp.release()
            return resp.status, body
        events: list[Any] = []
        try:
            async with asyncio.timeout(seconds):
                while not until or len(events) < until:
                    line = await resp.content.readline()
                    if not line:
                        break
                    events.append(orjson.loads(line))
        except TimeoutError:
            pass
        finally:
            resp.close()
        return 200, events

    async def served_versions(self, group: str, plural: str) -> list[str]:
        """The versions of `group` whose discovery lists `plural` (a test asks this of the server instead of
        assuming a Kubernetes version): [] when the group is not served."""
        code, body = await self.request("GET", f"/apis/{group}")
        if code == 404:
            return []
        assert code == 200, (group, code, body)
        out = []
        for version in (v["version"] for v in body.get("versions") or []):
            code, listing = await self.request("GET", f"/apis/{group}/{version}")
            if code == 200 and any(r.get("name") == plural for r in listing.get("resources") or []):
                out.append(version)
        return out

    async def schema_fields(self, schema: str, document: str = "api/v1") -> set[str]:
        """The properties of `schema` (`io.k8s.api.core.v1.ContainerStatus`) in the server's OpenAPI v3
        document: the fields this server's version has (a field a feature gate turns off is still listed)."""
        body = await self.ok("GET", f"/openapi/v3/{document}")
        return set(((body.get("components") or {}).get("schemas") or {}).get(schema, {}).get("properties") or {})

    async def server_version(self) -> str:
        """`gitVersion` from /version, for a skip reason ("" on a server without it)."""
        code, body = await self.request("GET", "/version")
        return str(body.get("gitVersion") or "") if code == 200 and isinstance(body, dict) else ""


def recorded_version() -> str:
    """The kube-apiserver version the simulated server's recordings (Table columns, OpenAPI documents) were
    made from: kcover/sim/recorded/VERSION."""
    return importlib.resources.files("kcover.sim").joinpath("recorded/VERSION").read_text().strip()


def minor(version: str) -> tuple[int, int]:
    """`v1.29.6` or `1.36.3` -> (1, 29)."""
    major, minor_, *_ = version.lstrip("v").split(".")
    return int(major), int("".join(c for c in minor_ if c.isdigit()) or 0)


async def skip_unless_recorded_minor(api: Api, what: str) -> None:
    """Skip, saying why, on a server of another minor than the simulated server's recordings: `what` (an
    error message's wording, a Table's column descriptions) is that minor's, and other minors word it
    their own way (kube-apiserver 1.29 says "may not be longer than 253" where 1.36 says "may not be more
    than 253 bytes")."""
    import pytest

    server = await api.server_version()
    if minor(server) != minor(recorded_version()):
        pytest.skip(f"{what} follows kube-apiserver {recorded_version()}; {server} words it its own way")
