"""Reading the tail of a container's log: an adapter over a client, for running logscan outside kcover.

Inside kcover, logscan reads logs through the `contract.LogReader` the controller hands every detector
(`context.log_reader`); this module owns `KubeLogReader`, which serves that contract with a GET of
`/api/v1/namespaces/{ns}/pods/{name}/log` through any client that has kcover's
`KubeClient.text(path, *, query, limit_bytes)`. It does not decide which log to read (the detector
does) and raises what the client raises (`contract.KubeError` and subclasses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol
from urllib.parse import quote


class TextGetter(Protocol):
    async def text(self, path: str, *, query: Mapping[str, str | int | bool] | None = None, limit_bytes: int | None = None) -> str: ...


class KubeLogReader:
    """`LogReader` over the pods/log subresource (RBAC: `get` on `pods/log`)."""

    def __init__(self, client: TextGetter) -> None:
        self._client = client

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"
        query: dict[str, str | int | bool] = {"container": container, "tailLines": tail_lines,
                                              "limitBytes": limit_bytes}
        if previous:
            query["previous"] = True
        return await self._client.text(path, query=query, limit_bytes=limit_bytes)
