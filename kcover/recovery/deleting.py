"""How a restart's pods are taken away: the one-call DeleteCollection, deletes one by one, evictions.

Owns the writes that end a workload's pods for a restart, given the action and its ledger intent:

* a selector whose labels carry the workload's uid is one DeleteCollection; before a retry, a fresh
  list tells whether an attempt whose answer was lost deleted them already (then nothing is deleted
  again: the operator may have recreated them). Every such kind is evicted today, so this is the path
  for a uid-bearing kind that is not;
* a selector that was not safe names its pods: each is deleted with its uid as precondition, so a pod
  the operator created since (a new uid) is never deleted, whoever resumes the intent;
* workloads whose pods are evicted (`adapters.evicts`) get one Eviction per recorded pod.

Every write is fenced (`retrying.Fence`) and preceded by `guard()`, which raises `errors.NotLeaderError`
once this replica no longer leads. How it fails: API errors propagate to the executor, which keeps
the intent pending; a pod already gone, or whose name now belongs to a new pod, is passed over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from kcover import errors
from kcover.kube import client as kube_client
from kcover.kube import retrying
from kcover.recovery import actions, adapters, ledger


class PodDeleter:
    """The restart's pod writes for one executor; see the module docstring."""

    def __init__(self, kube: kube_client.KubeClient, *, guard: Callable[[], None], concurrency: Callable[[], int],
                 fence: retrying.Fence | None = None) -> None:
        self._kube = kube
        self._guard = guard
        self._concurrency = concurrency
        self._fence = fence

    async def delete(self, action: actions.RestartWorkload, intent: ledger.Intent) -> int:
        """End the restart's pods; the number deleted (or evicted)."""
        w = action.workload
        if adapters.evicts(w.api_version.rpartition("/")[0], w.kind):
            return await self._evict(action, intent)
        if action.selector.pods is not None:
            return await self._one_by_one(action.selector.pods)
        return await self._collection(action, intent)

    async def _collection(self, action: actions.RestartWorkload, intent: ledger.Intent) -> int:
        self._guard()
        path = f"/api/v1/namespaces/{action.workload.namespace}/pods"
        query = {"labelSelector": action.selector.render()}

        async def already_deleted() -> dict[str, Any] | None:
            """Before a retry: did an attempt whose answer was lost delete the pods? Then do not delete
            again (the operator may have recreated them already: deleting those would restart twice)."""
            listed = await self._kube.request("GET", path, query=query)
            left = [p for p in (listed.get("items") or []) if (p.get("metadata") or {}).get("uid") in intent.uids
                    and not (p.get("metadata") or {}).get("deletionTimestamp")]
            self._guard()
            return None if left else {"items": list(intent.uids)}

        listed = await self._kube.request("DELETE", path, query=query, fence=self._fence, before_retry=already_deleted)
        items = listed.get("items") if isinstance(listed, dict) else None
        return len(items) if isinstance(items, list) else 0

    async def _one_by_one(self, refs: Sequence[actions.PodRef]) -> int:
        """One DELETE per pod, each with its uid as precondition: a pod created meanwhile with the workload's
        labels, or a recreated pod of a recorded name, is never deleted."""
        gate = asyncio.Semaphore(max(1, self._concurrency()))
        deleted = 0

        async def delete(ref: actions.PodRef) -> None:
            nonlocal deleted
            async with gate:
                self._guard()
                body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": ref.uid}}
                try:
                    await self._kube.request("DELETE", f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}",
                                             body=body, fence=self._fence)
                except (errors.NotFoundError, errors.ConflictError):
                    return  # already gone, or the name now belongs to a new pod
                deleted += 1

        try:
            async with asyncio.TaskGroup() as tg:
                for ref in refs:
                    tg.create_task(delete(ref), name=f"delete-pod:{ref.namespace}/{ref.name}")
        except BaseExceptionGroup as group:  # the first failure stands for the others (errors.KubeError)
            raise group.exceptions[0] from None
        return deleted

    async def _evict(self, action: actions.RestartWorkload, intent: ledger.Intent) -> int:
        """Evict the workload's pods one by one (uid preconditions): the Job controller then sees the
        DisruptionTarget condition, which a podFailurePolicy can ignore, instead of a failure that counts
        towards backoffLimit (`adapters.evicts`). Only pods the intent recorded are evicted."""
        ns = action.workload.namespace
        if action.selector.pods is not None:
            refs = [(ref.name, ref.uid) for ref in action.selector.pods]
        else:
            listed = await self._kube.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                              query={"labelSelector": action.selector.render()})
            refs = [(str(p["metadata"]["name"]), str(p["metadata"]["uid"])) for p in listed.get("items") or []
                    if not p["metadata"].get("deletionTimestamp")
                    and (not intent.uids or p["metadata"].get("uid") in intent.uids)]
        evicted = 0
        for name, uid in refs:
            self._guard()
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
                    "deleteOptions": {"preconditions": {"uid": uid}}}
            try:
                await self._kube.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body=body,
                                         fence=self._fence)
            except (errors.NotFoundError, errors.ConflictError):
                continue  # already gone, or the name now belongs to a new pod
            evicted += 1
        return evicted
