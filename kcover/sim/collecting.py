"""Owner-reference garbage collection in the simulated cluster: the API server's half and the collector's.

The API server's half (`deletion_finalizers`, called by `Store.delete`) is what kube-apiserver's
generic registry store does with a DELETE's `propagationPolicy` (or the legacy `orphanDependents`),
read from k8s.io/apiserver pkg/registry/generic/registry/store.go: `Orphan` puts the `orphan`
finalizer on the object, `Foreground` the `foregroundDeletion` finalizer, `Background` neither (and
either is dropped when the policy says otherwise); without a policy a finalizer already there
decides, else the kind's default: `Orphan` for batch/v1 Jobs (kept for backward compatibility,
pkg/registry/batch/job/strategy.go), none for Events (garbage collection unsupported), `Background`
for every other kind. A finalizer holds the object (deletionTimestamp set) until removed.

The collector's half (`GarbageCollector`, an actor of the simulated cluster, as kube-controller-
manager's garbage collector) follows every resource the store serves and:

* deletes a dependent none of whose owners exists any more (an ownerReference whose uid no live
  object of that kind and name has), with its uid as precondition and the policy its own
  finalizers ask for (background otherwise); a dependent that still has a live owner only loses the
  references to the gone ones;
* for an owner being deleted with `foregroundDeletion`: deletes its dependents, waits until none
  with `blockOwnerDeletion: true` is left, then removes the finalizer (and so the owner);
* for an owner being deleted with `orphan`: removes the owner's reference from every dependent,
  then the finalizer.

References to kinds the simulated server does not serve are left alone (the real collector cannot
resolve them either). Writes race with other actors: a 404 or 409 is retried on the next change of
that object. It never raises out of `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kcover.sim import informing, registry, status
from kcover.sim import store as stores

Obj = dict[str, Any]
ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
POLICIES = ("Orphan", "Background", "Foreground")
_ORPHAN_BY_DEFAULT = frozenset({"jobs.batch"})
_UNSUPPORTED = frozenset({"events"})


def deletion_finalizers(res: registry.Resource, finalizers: Iterable[str], policy: str | None) -> list[str]:
    """The finalizers a DELETE with `policy` (None: not given) leaves on an object of `res`."""
    current = list(finalizers)
    if res.key in _UNSUPPORTED:
        return current
    orphan = foreground = False
    if policy in POLICIES:
        orphan, foreground = policy == "Orphan", policy == "Foreground"
    elif ORPHAN in current:
        orphan = True
    elif FOREGROUND in current:
        foreground = True
    else:
        orphan = res.key in _ORPHAN_BY_DEFAULT
    out = [f for f in current if f not in (ORPHAN, FOREGROUND)]
    if orphan:
        out.append(ORPHAN)
    if foreground:
        out.append(FOREGROUND)
    return current if set(out) == set(current) else out


@dataclass(frozen=True)
class Ref:
    """Where one object lives, and which object it is (uid)."""

    key: str
    namespace: str
    name: str
    uid: str


@dataclass
class _Graph:
    """Live objects by uid and dependents by owner uid, kept from the store's changes."""

    objects: dict[str, Ref] = field(default_factory=dict)
    dependents: dict[str, set[str]] = field(default_factory=dict)
    owners: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def put(self, ref: Ref, owner_uids: tuple[str, ...]) -> None:
        self.drop(ref.uid)
        self.objects[ref.uid] = ref
        self.owners[ref.uid] = owner_uids
        for owner in owner_uids:
            self.dependents.setdefault(owner, set()).add(ref.uid)

    def drop(self, uid: str) -> None:
        self.objects.pop(uid, None)
        for owner in self.owners.pop(uid, ()):
            deps = self.dependents.get(owner)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self.dependents[owner]

    def dependents_of(self, uid: str) -> list[Ref]:
        return [self.objects[d] for d in sorted(self.dependents.get(uid, ())) if d in self.objects]


class GarbageCollector:
    """kube-controller-manager's garbage collector, over the simulated cluster's store."""

    def __init__(self, cluster: Any) -> None:
        self.store: stores.Store = cluster.store
        self._graph = _Graph()
        self._kinds = {(r.api_version, r.kind): r.key for r in self.store.registry.resources}
        self._keys = list(dict.fromkeys(r.key for r in self.store.registry.resources))

    async def run(self, stop: asyncio.Event) -> None:
        async for key, change in informing.follow(self.store, self._keys, stop):
            obj = change.new.obj()
            meta = obj["metadata"]
            ref = Ref(key, str(meta.get("namespace") or ""), str(meta["name"]), str(meta["uid"]))
            if change.type == "DELETED":
                owners = self._graph.owners.get(ref.uid, ())
                self._graph.drop(ref.uid)
                for dependent in self._graph.dependents_of(ref.uid):
                    self._attempt(dependent)
                for owner_uid in owners:  # an owner waiting for its dependents may be done
                    owner = self._graph.objects.get(owner_uid)
                    if owner is not None:
                        self._finalize(owner)
                continue
            refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid")]
            self._graph.put(ref, tuple(str(r["uid"]) for r in refs))
            if refs:
                self._attempt(ref)
            if meta.get("deletionTimestamp") and {ORPHAN, FOREGROUND} & set(meta.get("finalizers") or []):
                self._finalize(ref)
            for owner_uid in self._graph.owners.get(ref.uid, ()):
                owner = self._graph.objects.get(owner_uid)
                if owner is not None:
                    self._finalize(owner)  # a dependent went or changed: a waiting owner may be done

    # ------------------------------------------------------------------------------------ dependents

    def _live(self, ref: Ref) -> Obj | None:
        try:
            obj = self.store.get(ref.key, ref.namespace, ref.name)
        except status.ApiError:
            return None
        return obj if obj["metadata"]["uid"] == ref.uid else None

    def _owner(self, dependent: Ref, owner_ref: Obj) -> Obj | bool | None:
        """The live owner, None when it is gone, False when its kind is not served (left alone)."""
        key = self._kinds.get((str(owner_ref.get("apiVersion")), str(owner_ref.get("kind"))))
        if key is None:
            return False
        res = self.store.registry.by_key(key)
        namespace = dependent.namespace if res.namespaced else ""
        return self._live(Ref(key, namespace, str(owner_ref.get("name")), str(owner_ref["uid"])))

    def _attempt(self, ref: Ref) -> None:
        """attemptToDeleteItem: collect `ref` if no owner holds it, or drop its references to gone owners."""
        obj = self._live(ref)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid")]
        solid, gone, waiting = [], [], []
        for owner_ref in refs:
            owner = self._owner(ref, owner_ref)
            if owner is False:
                solid.append(owner_ref)
            elif owner is None:
                gone.append(owner_ref)
            elif isinstance(owner, dict) and owner["metadata"].get("deletionTimestamp") \
                    and FOREGROUND in (owner["metadata"].get("finalizers") or []):
                waiting.append(owner_ref)
            else:
                solid.append(owner_ref)
        if solid:
            drop = {str(r["uid"]) for r in (*gone, *waiting)}
            if drop:
                self._drop_references(ref, drop)
            return
        if not gone and not waiting:
            return
        finalizers = set(obj["metadata"].get("finalizers") or [])
        policy = "Orphan" if ORPHAN in finalizers else "Foreground" if FOREGROUND in finalizers else "Background"
        if waiting and self._graph.dependents_of(ref.uid):
            policy = "Foreground"
        with contextlib.suppress(status.ApiError):  # gone or replaced meanwhile
            self.store.delete(ref.key, ref.namespace, ref.name, uid=ref.uid, policy=policy)

    def _drop_references(self, ref: Ref, uids: set[str]) -> None:
        def change(obj: Obj) -> None:
            if obj["metadata"]["uid"] != ref.uid:
                return
            kept = [r for r in obj["metadata"].get("ownerReferences") or [] if str(r.get("uid")) not in uids]
            if kept:
                obj["metadata"]["ownerReferences"] = kept
            else:
                obj["metadata"].pop("ownerReferences", None)

        with contextlib.suppress(status.ApiError):
            self.store.mutate(ref.key, ref.namespace, ref.name, change)

    # ------------------------------------------------------------------------------------ owners

    def _finalize(self, ref: Ref) -> None:
        """An owner being deleted with a garbage-collector finalizer: orphan or delete its dependents, and
        remove the finalizer once that is done."""
        obj = self._live(ref)
        if obj is None or not obj["metadata"].get("deletionTimestamp"):
            return
        finalizers = list(obj["metadata"].get("finalizers") or [])
        dependents = self._graph.dependents_of(ref.uid)
        if ORPHAN in finalizers:
            for dependent in dependents:
                self._drop_references(dependent, {ref.uid})
            self._remove_finalizer(ref, ORPHAN)
        elif FOREGROUND in finalizers:
            blocking = False
            for dependent in dependents:
                live = self._live(dependent)
                if live is None:
                    continue
                mine = [r for r in live["metadata"].get("ownerReferences") or [] if str(r.get("uid")) == ref.uid]
                blocking = blocking or any(r.get("blockOwnerDeletion") for r in mine)
                if not live["metadata"].get("deletionTimestamp"):
                    self._attempt(dependent)
            if not blocking:
                self._remove_finalizer(ref, FOREGROUND)

    def _remove_finalizer(self, ref: Ref, finalizer: str) -> None:
        def change(obj: Obj) -> None:
            if obj["metadata"]["uid"] != ref.uid:
                return
            kept = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
            if kept:
                obj["metadata"]["finalizers"] = kept
            else:
                obj["metadata"].pop("finalizers", None)

        with contextlib.suppress(status.ApiError):
            self.store.mutate(ref.key, ref.namespace, ref.name, change)
