"""The one gateway for kcover's writes: a Protocol of exactly the calls it makes, and its HTTP implementation.

Owns the vocabulary of writes (typed bodies for the objects kcover writes: Events, Nodes, LedgerEntries,
ConfigMaps, DeviceTaintRules, Recoveries) and `Http`, which sends them through a `KubeClient` with the
leader's `retrying.Fence` on every write: the one leadership gate of recovery. A replica that no longer
leads gets `errors.NotLeaderError` from the write itself, whoever called it.

Implementations: `Http` here (the product; the client may talk to a real API server or, in tests and the
playground, to the simulated one in-process with no socket: `kcover.sim.inprocess`), and
`kcover.recovery.dryrun.DryRun`, which records what would be written and writes only what a person reads
(Events, Recovery resources). Dry run is that substitution, never an `if` in the code that decides.

Reads made at write time (a Node before its read-modify-write, a LedgerEntry after a conflict) belong
here too; everything else kcover reads comes from the watched cache. How it fails: the client's
`errors.KubeError` tree (`NotFoundError`, `ConflictError` for a failed precondition or an existing name,
`TooManyRequestsError` for an eviction a PodDisruptionBudget refuses), after the client's retries.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

from kcover import errors
from kcover.kube import client as client_
from kcover.kube import events, retrying


class Meta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    creationTimestamp: str


class TaintBody(TypedDict, total=False):
    key: str
    value: str
    effect: str
    timeAdded: str


class NodeSpecBody(TypedDict, total=False):
    unschedulable: bool
    taints: list[TaintBody]


class NodeBody(TypedDict, total=False):
    """A Node as kcover reads and rewrites it (every other field is kept as read)."""

    apiVersion: str
    kind: str
    metadata: Meta
    spec: NodeSpecBody
    status: dict[str, Any]


class NodeConditionBody(TypedDict):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    lastHeartbeatTime: str


class DataBody(TypedDict, total=False):
    """A ConfigMap or a LedgerEntry: metadata and string data."""

    apiVersion: str
    kind: str
    metadata: Meta
    data: dict[str, str]


ObjectRefBody = events.InvolvedObject
EventBody = events.EventBody
"""A core/v1 Event; `kcover.kube.events` owns its shape and builds every one."""


class SpecBody(TypedDict, total=False):
    """A custom resource kcover owns (a Recovery, a DeviceTaintRule): metadata, spec and status."""

    apiVersion: str
    kind: str
    metadata: Meta
    spec: dict[str, Any]
    status: dict[str, Any]


class Removal(enum.StrEnum):
    """What became of one pod a restart took away."""

    REMOVED = "removed"
    """Deleted or evicted now."""
    GONE = "gone"
    """Already gone, or its name belongs to a newer pod (the uid precondition failed): nothing to do."""
    HELD = "held"
    """An eviction a PodDisruptionBudget refused (429): try again later."""


LEDGER_GROUP_VERSION = "kcover.io/v1alpha1"
LEDGER_PLURAL = "ledgerentries"
LEDGER_LABEL = "kcover.io/ledger"
RECOVERY_GROUP_VERSION = "kcover.io/v1alpha1"
RECOVERY_PLURAL = "recoveries"
DEVICE_TAINT_PLURAL = "devicetaintrules"
MERGE_PATCH = client_.MERGE_PATCH
STRATEGIC_MERGE_PATCH = client_.STRATEGIC_MERGE_PATCH


class Gateway(Protocol):
    """Every write kcover's recovery makes (and the reads its read-modify-writes need)."""

    async def post_event(self, body: EventBody) -> None:
        """Create an Event; one that already exists (an attempt whose answer was lost) is not an error."""
        ...

    async def get_node(self, name: str) -> NodeBody: ...

    async def replace_node(self, body: NodeBody) -> NodeBody:
        """PUT with the body's resourceVersion as precondition (`ConflictError` if it moved)."""
        ...

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels (None removes one)."""
        ...

    async def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations (None removes one)."""
        ...

    async def patch_node_conditions(self, name: str, conditions: Sequence[NodeConditionBody]) -> None:
        """Strategic-merge the conditions into `status.conditions` (merged by type)."""
        ...

    async def evict_pod(self, namespace: str, name: str, uid: str) -> Removal: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> Removal: ...

    async def list_ledger_entries(self, namespace: str, ledger: str) -> list[DataBody]: ...

    async def ledger_served(self, namespace: str) -> bool: ...

    async def get_ledger_entry(self, namespace: str, name: str) -> DataBody | None: ...

    async def create_ledger_entry(self, body: DataBody) -> DataBody: ...

    async def replace_ledger_entry(self, body: DataBody) -> DataBody: ...

    async def delete_ledger_entry(self, namespace: str, name: str, resource_version: str) -> None: ...

    async def get_config_map(self, namespace: str, name: str) -> DataBody | None: ...

    async def create_config_map(self, body: DataBody) -> DataBody: ...

    async def replace_config_map(self, body: DataBody) -> DataBody: ...

    async def get_device_taint_rule(self, api_version: str, name: str) -> SpecBody | None: ...

    async def create_device_taint_rule(self, api_version: str, body: SpecBody) -> None: ...

    async def delete_device_taint_rule(self, api_version: str, name: str, uid: str) -> None: ...

    async def recovery_status_subresource(self) -> bool:
        """Whether the served Recovery kind has a `/status` subresource (its CRD says so; the chart's has
        none); `errors.NotFoundError` when the kind is not served."""
        ...

    async def create_recovery(self, body: SpecBody) -> None:
        """Create a Recovery; a `status` in `body` is kept only where the kind has no status subresource."""
        ...

    async def patch_recovery_status(self, namespace: str, name: str, status: Mapping[str, Any], *,
                                    subresource: bool) -> None:
        """Merge `status` into a Recovery: through its `/status` subresource, or the object itself where the
        kind has none (with one, the server would ignore a status written to the object)."""
        ...

    async def list_recoveries(self, *, limit: int, continue_token: str = "") -> tuple[list[SpecBody], str]:
        """One page of every Recovery (all namespaces) and the next page's token ("" at the end)."""
        ...

    async def delete_recovery(self, namespace: str, name: str) -> None: ...


def _ledger_base(namespace: str) -> str:
    return f"/apis/{LEDGER_GROUP_VERSION}/namespaces/{namespace}/{LEDGER_PLURAL}"


def _recovery_base(namespace: str) -> str:
    return f"/apis/{RECOVERY_GROUP_VERSION}/namespaces/{namespace}/{RECOVERY_PLURAL}"


def _config_maps(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


class Http:
    """`Gateway` over a `KubeClient`; every write carries `fence` (None: no leader election)."""

    def __init__(self, client: client_.KubeClient, *, fence: retrying.Fence | None = None) -> None:
        self.client = client
        self.fence = fence

    async def _write(self, method: str, path: str, body: Any = None, *, content_type: str | None = None,
                     answer: Callable[[errors.KubeError], bool] | None = None) -> Any:
        return await self.client.request(method, path, body=body, content_type=content_type, fence=self.fence,
                                         answer=answer)

    async def _get(self, path: str) -> Any:
        try:
            return await self.client.request("GET", path)
        except errors.NotFoundError:
            return None

    async def post_event(self, body: EventBody) -> None:
        try:
            await self._write("POST", events.path_of(body), body)
        except errors.ConflictError:
            pass  # AlreadyExists: an attempt whose answer was lost wrote it (the name is the same)

    async def get_node(self, name: str) -> NodeBody:
        node: NodeBody = await self.client.request("GET", f"/api/v1/nodes/{name}")
        return node

    async def replace_node(self, body: NodeBody) -> NodeBody:
        name = body.get("metadata", {}).get("name", "")
        updated: NodeBody = await self._write("PUT", f"/api/v1/nodes/{name}", body)
        return updated

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self._write("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": dict(labels)}},
                          content_type=MERGE_PATCH)

    async def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        await self._write("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": dict(annotations)}},
                          content_type=MERGE_PATCH)

    async def patch_node_conditions(self, name: str, conditions: Sequence[NodeConditionBody]) -> None:
        await self._write("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": list(conditions)}},
                          content_type=STRATEGIC_MERGE_PATCH)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> Removal:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        try:
            # retried as every write is (priority and fairness's 429s, 5xx, lost connections: one of a 2,048-pod
            # restart's evictions failing would end the attempt), but a PodDisruptionBudget's 429 is an answer
            await self._write("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body,
                              answer=_eviction_answer)
        except (errors.NotFoundError, errors.ConflictError):
            return Removal.GONE
        except errors.TooManyRequestsError as exc:
            if _disruption_budget(exc):
                return Removal.HELD
            raise
        return Removal.REMOVED

    async def delete_pod(self, namespace: str, name: str, uid: str) -> Removal:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._write("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except (errors.NotFoundError, errors.ConflictError):
            return Removal.GONE
        return Removal.REMOVED

    async def list_ledger_entries(self, namespace: str, ledger: str) -> list[DataBody]:
        out: list[DataBody] = []
        query: dict[str, str | int] = {"labelSelector": f"{LEDGER_LABEL}={ledger}", "limit": 500}
        while True:
            page = await self.client.request("GET", _ledger_base(namespace), query=query)
            out.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out
            query = {**query, "continue": token}

    async def ledger_served(self, namespace: str) -> bool:
        """Whether LedgerEntries are served in `namespace` (one item listed at most; False on 404: no CRD)."""
        try:
            await self.client.request("GET", _ledger_base(namespace), query={"limit": 1})
        except errors.NotFoundError:
            return False
        return True

    async def get_ledger_entry(self, namespace: str, name: str) -> DataBody | None:
        found: DataBody | None = await self._get(f"{_ledger_base(namespace)}/{name}")
        return found

    async def create_ledger_entry(self, body: DataBody) -> DataBody:
        created: DataBody = await self._write("POST", _ledger_base(body["metadata"]["namespace"]), body)
        return created

    async def replace_ledger_entry(self, body: DataBody) -> DataBody:
        meta = body["metadata"]
        updated: DataBody = await self._write("PUT", f"{_ledger_base(meta['namespace'])}/{meta['name']}", body)
        return updated

    async def delete_ledger_entry(self, namespace: str, name: str, resource_version: str) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": resource_version}}
        try:
            await self._write("DELETE", f"{_ledger_base(namespace)}/{name}", options)
        except errors.NotFoundError:
            pass

    async def get_config_map(self, namespace: str, name: str) -> DataBody | None:
        found: DataBody | None = await self._get(f"{_config_maps(namespace)}/{name}")
        return found

    async def create_config_map(self, body: DataBody) -> DataBody:
        created: DataBody = await self._write("POST", _config_maps(body["metadata"]["namespace"]), body)
        return created

    async def replace_config_map(self, body: DataBody) -> DataBody:
        meta = body["metadata"]
        updated: DataBody = await self._write("PUT", f"{_config_maps(meta['namespace'])}/{meta['name']}", body)
        return updated

    async def get_device_taint_rule(self, api_version: str, name: str) -> SpecBody | None:
        found: SpecBody | None = await self._get(f"/apis/{api_version}/{DEVICE_TAINT_PLURAL}/{name}")
        return found

    async def create_device_taint_rule(self, api_version: str, body: SpecBody) -> None:
        await self._write("POST", f"/apis/{api_version}/{DEVICE_TAINT_PLURAL}", body)

    async def delete_device_taint_rule(self, api_version: str, name: str, uid: str) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._write("DELETE", f"/apis/{api_version}/{DEVICE_TAINT_PLURAL}/{name}", options)
        except errors.NotFoundError:
            pass

    async def recovery_status_subresource(self) -> bool:
        found = await self.client.request("GET", f"/apis/{RECOVERY_GROUP_VERSION}")
        names = {r.get("name") for r in (found or {}).get("resources") or [] if isinstance(r, dict)}
        if RECOVERY_PLURAL not in names:
            raise errors.NotFoundError(f"/apis/{RECOVERY_GROUP_VERSION} does not serve {RECOVERY_PLURAL}")
        return f"{RECOVERY_PLURAL}/status" in names

    async def create_recovery(self, body: SpecBody) -> None:
        await self._write("POST", _recovery_base(body["metadata"]["namespace"]), body)

    async def patch_recovery_status(self, namespace: str, name: str, status: Mapping[str, Any], *,
                                    subresource: bool) -> None:
        path = f"{_recovery_base(namespace)}/{name}" + ("/status" if subresource else "")
        await self._write("PATCH", path, {"status": dict(status)}, content_type=MERGE_PATCH)

    async def list_recoveries(self, *, limit: int, continue_token: str = "") -> tuple[list[SpecBody], str]:
        query: dict[str, str | int] = {"limit": limit}
        if continue_token:
            query["continue"] = continue_token
        page = await self.client.request("GET", f"/apis/{RECOVERY_GROUP_VERSION}/{RECOVERY_PLURAL}", query=query)
        return list(page.get("items") or []), str((page.get("metadata") or {}).get("continue") or "")

    async def delete_recovery(self, namespace: str, name: str) -> None:
        try:
            await self._write("DELETE", f"{_recovery_base(namespace)}/{name}")
        except errors.NotFoundError:
            pass


def _eviction_answer(exc: errors.KubeError) -> bool:
    """An eviction's failure that asking again would not change: a PodDisruptionBudget's 429, or the server's
    500 for a pod more than one budget selects."""
    if exc.status == 500:
        body = exc.body if isinstance(exc.body, dict) else {}
        return "more than one poddisruptionbudget" in str(body.get("message", "")).lower()
    return _disruption_budget(exc)


def _disruption_budget(exc: errors.KubeError) -> bool:
    """A 429 from the Eviction API because of a PodDisruptionBudget, not the server's throttling.

    The eviction's refusal is a Status with reason `TooManyRequests` and a cause `DisruptionBudget`
    (plain-text 429s and Statuses with `retryAfterSeconds` alone come from priority and fairness)."""
    if exc.status != 429:
        return False
    body = exc.body if isinstance(exc.body, dict) else {}
    causes = ((body.get("details") or {}).get("causes") or []) if isinstance(body.get("details"), dict) else []
    if any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes):
        return True
    return "disruption budget" in str(body.get("message", "")).lower()
