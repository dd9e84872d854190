"""Reading the tail of a container's log through the `pods/log` subresource.

Owns `KubeLogReader`, the log reader the controller hands detectors as `context.log_reader`
(`kcover.detectors.contract.LogReader`:
`async read_log(namespace, pod, container, *, previous, tail_lines, limit_bytes) -> str`). It does not
decide which log to read or what the text means (detectors do). It raises what `KubeClient.text`
raises: `errors.NotFoundError` for a pod or container that is gone, `errors.KubeError` (status 400)
for a previous instance that never existed, other `errors.KubeError`s for transport failures.
RBAC: `get` on `pods/log`.
"""

from __future__ import annotations

from urllib.parse import quote

from kcover.kube import client as client_


def log_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"


class KubeLogReader:
    """Reads bounded log tails with one GET each."""

    def __init__(self, client: client_.KubeClient) -> None:
        self._client = client

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        """The last `tail_lines` lines (at most `limit_bytes` bytes) of the container's current log, or of
        its previous instance when `previous`."""
        query: dict[str, str | int | bool] = {"container": container, "tailLines": tail_lines,
                                              "limitBytes": limit_bytes}
        if previous:
            query["previous"] = True
        return await self._client.text(log_path(namespace, pod), query=query, limit_bytes=limit_bytes)
