"""The simulated cluster's storage: objects, one resourceVersion counter, watch history and watchers.

Owns what etcd plus the watch cache do for a kube-apiserver: every write bumps one cluster-wide
counter, every object is kept as pre-serialised JSON bytes (plus its labels, so lists and watches
never re-parse, and its field-selector values, read once on a field selector's first use), each
resource keeps a bounded ring of recent changes to serve watches from a resourceVersion (older ones
answer 410 Expired), and live watchers get changes through bounded asyncio queues (a watcher that
falls too far behind is closed, as the real cache closes slow watchers). It also owns the generic
write rules: uid, creationTimestamp, generation (bumped only on spec changes), no-op writes that bump
nothing, finalizers, graceful pod deletion, and the managedFields a write keeps (`managedfields`: a
client's, nested to any depth). Per-kind validation and the status/spec split live in `strategy`;
HTTP in `apiserver`.

Resource keys are the plural for the core group and ``plural.group`` otherwise: ``pods``, ``nodes``,
``events`` (also served as events.k8s.io), ``configmaps``, ``secrets``, ``namespaces``,
``leases.coordination.k8s.io``, ``jobs.batch``, ``pytorchjobs.kubeflow.org`` (and tfjobs, mpijobs,
xgboostjobs, paddlejobs, jaxjobs), ``trainjobs.trainer.kubeflow.org``, ``jobsets.jobset.x-k8s.io``,
``jobs.batch.volcano.sh``, ``leaderworkersets.leaderworkerset.x-k8s.io``.

Errors are `status.ApiError`s carrying the exact `Status` the API server would answer.
"""

from __future__ import annotations

import bisect
import builtins
import datetime as dt
import math
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kcover.aio import clock as clocks
from kcover.sim import collecting, deepjson, managedfields, registry, status
from kcover.sim.tables import Change, Entry, FieldValues, Filter, ListResult, Watcher, _Table

Obj = dict[str, Any]
HISTORY_PER_RESOURCE = 10_000
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "kcover-system")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def entry_key(entry: Entry) -> str:
    """The key an entry is stored (and paginated) under."""
    return _key(entry.namespace, entry.name)


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    """All objects of the simulated cluster. Single-threaded: call it from the event loop's thread."""

    def __init__(self, *, reg: registry.Registry | None = None, clock: clocks.Clock | None = None,
                 history: int = HISTORY_PER_RESOURCE, rng: random.Random | None = None) -> None:
        self.registry = reg or registry.Registry()
        self.clock: clocks.Clock = clock or clocks.SystemClock()
        self._rng = rng or random.Random()
        self._rv = 1
        self._now_cache: tuple[int, str] = (-1, "")
        self._tables = {key: _Table(self.registry.by_key(key), history) for key in self.registry.resource_keys()}
        for ns in INITIAL_NAMESPACES:
            self.create("namespaces", {"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                                       "status": {"phase": "Active"}})
        # Like kube-apiserver's watch cache before it has evicted anything: a watch from an older
        # resourceVersion gets every change since start, not 410 (seen on a real server). 410 comes
        # once history is evicted (`history` bound) or compacted (`compact()`).

    # --- reading ------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        return self._rv

    def table(self, key: str) -> _Table:
        try:
            return self._tables[key]
        except KeyError:
            raise KeyError(f"unknown resource key {key!r}; known: {sorted(self._tables)}") from None

    def entry(self, key: str, namespace: str, name: str) -> Entry:
        table = self.table(key)
        found = table.entries.get(_key(namespace if table.resource.namespaced else "", name))
        if found is None:
            raise status.not_found(table.resource.plural, table.resource.group, name)
        return found

    def get(self, key: str, namespace: str, name: str) -> Obj:
        """A fresh dict of the stored object; raises 404 `ApiError`."""
        return self.entry(key, namespace, name).obj()

    def count(self, key: str) -> int:
        return len(self.table(key).entries)

    def namespace_exists(self, namespace: str) -> bool:
        return namespace in self._tables["namespaces"].entries

    def list(self, key: str, flt: Filter | None = None, *, limit: int = 0,
             continue_after: str | None = None) -> ListResult:
        """Matching entries in key order, at most `limit` (0 = all), resuming after `continue_after`."""
        table = self.table(key)
        flt = flt or Filter()
        keys = table.keys()
        lo, hi = 0, len(keys)
        if flt.namespace is not None and table.resource.namespaced:
            lo = bisect.bisect_left(keys, flt.namespace + "/")
            hi = bisect.bisect_left(keys, flt.namespace + "0")  # "0" sorts right after "/"
        if continue_after is not None:
            lo = max(lo, bisect.bisect_right(keys, continue_after))
        out: list[Entry] = []
        entries = table.entries
        plain = flt.labels.empty and flt.fields.empty
        idx = lo
        while idx < hi:
            entry = entries[keys[idx]]
            idx += 1
            if plain or flt.matches(entry):
                out.append(entry)
                if limit and len(out) >= limit:
                    break
        more = limit > 0 and len(out) >= limit and idx < hi
        cont = keys[idx - 1] if more else None
        remaining = (hi - idx) if more and plain else None
        return ListResult(out, self._rv, cont, remaining)

    def list_at(self, key: str, flt: Filter, rv: int) -> builtins.list[Entry]:
        """Matching entries as they were at `rv`, rebuilt from the watch history (410 when compacted)."""
        table = self.table(key)
        if rv < table.compacted_rv:
            raise status.expired("The resourceVersion for the provided list is too old.")
        later = [c for c in table.history if c.rv > rv]
        if not later:
            return self.list(key, flt).entries
        state = dict(table.entries)
        for change in reversed(later):
            k = entry_key(change.new)
            if change.type == "ADDED" or change.old is None:
                state.pop(k, None)
            else:
                state[k] = change.old
        return [state[k] for k in sorted(state) if flt.matches(state[k])]

    def iter_objects(self, key: str) -> Iterator[Obj]:
        for entry in list(self.table(key).entries.values()):
            yield entry.obj()

    # --- watching -----------------------------------------------------------------------------

    def watch(self, key: str, flt: Filter, since: int | None) -> Watcher:
        """Start a watch: `since` None/0 sends every match as ADDED first; N sends changes after N."""
        table = self.table(key)
        if since:
            if since > self._rv:
                raise status.too_large_rv(since, self._rv)
            if since < table.compacted_rv:
                raise status.too_old(since, table.compacted_rv)
            initial = [c for c in table.history if c.rv > since]
        else:
            initial = [Change(self._rv, "ADDED", e, None) for e in self.list(key, flt).entries]
        watcher = Watcher(table, flt, initial)
        table.watchers.add(watcher)
        return watcher

    def compact(self, key: str) -> None:
        """Forget the watch history of `key`: any watch from an older resourceVersion gets 410."""
        table = self.table(key)
        table.history.clear()
        self._rv += 1  # compaction leaves a gap, so "since < compacted" holds for everything handed out
        table.compacted_rv = self._rv

    def close_watchers(self, key: str | None = None) -> int:
        """End every open watch (of `key`, or of all resources); returns how many."""
        closed = 0
        for k, table in self._tables.items():
            if key is None or key == k:
                for watcher in list(table.watchers):
                    watcher.close()
                    closed += 1
        return closed

    # --- writing ------------------------------------------------------------------------------

    def _entry(self, table: _Table, obj: Obj) -> Entry:
        meta = obj["metadata"]
        res = table.resource
        raw = deepjson.dumps(obj)
        return Entry(raw, meta.get("namespace", ""), meta["name"], meta.get("labels") or {},
                     FieldValues(raw, res.field_labels))

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _now(self) -> str:
        return self._stamp(self.clock.now())

    def _stamp(self, moment: dt.datetime) -> str:
        """`clocks.rfc3339(moment)`, formatted once a second: formatting dominates bulk creates and deletes."""
        second = math.floor(moment.timestamp())
        if second != self._now_cache[0]:
            self._now_cache = (second, clocks.rfc3339(moment))
        return self._now_cache[1]

    def generate_name(self, prefix: str) -> str:
        return prefix + "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(5))

    def create(self, key: str, obj: Obj, *, keep_uid: bool = False,
               admit: Callable[[Obj], None] | None = None) -> Obj:
        """Store a new object as given (status included) and return it with server-set fields. `keep_uid`
        (seeding a scenario, never the API): a uid the object carries is kept, so seeded owner references
        and uid labels hold. `admit` changes it once it has its uid, before it is stored (a strategy rule
        that needs the uid: a Job's generated selector)."""
        table = self.table(key)
        res = table.resource
        obj = dict(obj)
        meta = obj["metadata"] = dict(obj.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self.generate_name(str(meta["generateName"]))
        name = meta.get("name")
        if not name:
            raise status.invalid(res.kind, res.group, "", [("FieldValueRequired", "metadata.name",
                                                            "Required value: name or generateName is required")])
        if res.namespaced:
            namespace = meta.get("namespace") or "default"
            meta["namespace"] = namespace
            ns_entry = self._tables["namespaces"].entries.get(namespace)
            if ns_entry is None:
                raise status.not_found("namespaces", "", namespace)
            if b'"deletionTimestamp"' in ns_entry.raw:
                raise status.forbidden(res.plural, res.group, name,
                                       f"unable to create new content in namespace {namespace} because it "
                                       f"is being terminated")
        else:
            meta.pop("namespace", None)
            namespace = ""
        k = _key(namespace, name)
        if k in table.entries:
            raise status.already_exists(res.plural, res.group, name)
        obj = {"apiVersion": res.api_version, "kind": res.kind,
               **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}}
        if not (keep_uid and meta.get("uid")):
            meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = self._now()
        for dropped in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(dropped, None)
        managedfields.merge(meta, None)
        if res.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if admit is not None:
            admit(obj)
        meta["resourceVersion"] = str(self._bump())
        entry = self._entry(table, obj)
        table.put(k, entry)
        table.record(Change(self._rv, "ADDED", entry, None))
        return obj

    def update(self, key: str, obj: Obj) -> Obj:
        """Replace an object. A resourceVersion in `obj` is a precondition (409); no-ops change nothing."""
        table = self.table(key)
        res = table.resource
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        namespace = (meta.get("namespace") or "default") if res.namespaced else ""
        old_entry = self.entry(key, namespace, name)
        old = old_entry.obj()
        old_meta = old["metadata"]
        sent_rv = meta.get("resourceVersion")
        if sent_rv not in (None, "") and str(sent_rv) != old_meta["resourceVersion"]:
            raise status.conflict(res.plural, res.group, name)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise status.conflict(res.plural, res.group, name,
                                  f"Precondition failed: UID in precondition: {meta['uid']}, "
                                  f"UID in object meta: {old_meta['uid']}")
        new = {"apiVersion": res.api_version, "kind": res.kind,
               **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}}
        new_meta = new["metadata"] = dict(meta)
        if res.namespaced:
            new_meta["namespace"] = namespace
        for kept in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if kept in old_meta:
                new_meta[kept] = old_meta[kept]
            else:
                new_meta.pop(kept, None)
        managedfields.merge(new_meta, old_meta.get("managedFields"))
        if res.has_generation:
            gen = int(old_meta.get("generation", 1))
            new_meta["generation"] = gen + 1 if _spec_part(new) != _spec_part(old) else gen
        new_meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == old:
            return old
        if old_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            new_meta.pop("finalizers", None)
            return self._remove(table, old_entry, new)
        new_meta["resourceVersion"] = str(self._bump())
        entry = self._entry(table, new)
        table.put(_key(namespace, name), entry)
        table.record(Change(self._rv, "MODIFIED", entry, old_entry))
        return new

    def mutate(self, key: str, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj:
        """Read, change in place with `change`, write back (no validation: for simulated controllers)."""
        obj = self.get(key, namespace, name)
        change(obj)
        return self.update(key, obj)

    def _remove(self, table: _Table, old_entry: Entry, final: Obj) -> Obj:
        final["metadata"]["resourceVersion"] = str(self._bump())
        entry = self._entry(table, final)
        table.remove(_key(old_entry.namespace, old_entry.name))
        table.record(Change(self._rv, "DELETED", entry, old_entry))
        if table.resource.key == "namespaces":
            self._purge_namespace(old_entry.name)
        return final

    def _purge_namespace(self, namespace: str) -> None:
        for table in self._tables.values():
            if not table.resource.namespaced:
                continue
            for entry in self.list(table.resource.key, Filter(namespace=namespace)).entries:
                obj = entry.obj()
                obj["metadata"].pop("finalizers", None)
                self._remove(table, entry, obj)

    def delete(self, key: str, namespace: str, name: str, *, grace_seconds: int | None = None,
               uid: str | None = None, resource_version: str | None = None,
               policy: str | None = None) -> tuple[Obj, bool]:
        """Delete (or start deleting) an object; returns (object, whether it is gone now). `policy` is the
        DELETE's propagationPolicy (None: not given), turned into garbage-collector finalizers
        (`collecting.deletion_finalizers`)."""
        table = self.table(key)
        res = table.resource
        entry = self.entry(key, namespace, name)
        obj = entry.obj()
        meta = obj["metadata"]
        if uid and uid != meta["uid"]:
            raise status.conflict(res.plural, res.group, name,
                                  f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                                  f"{meta['uid']}")
        if resource_version and resource_version != meta["resourceVersion"]:
            raise status.conflict(res.plural, res.group, name,
                                  f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                                  f"ResourceVersion in object meta: {meta['resourceVersion']}")
        grace = 0
        if key == "pods":
            spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
            grace = grace_seconds if grace_seconds is not None else int(
                spec.get("terminationGracePeriodSeconds", 30))
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                grace = 0
        elif key == "namespaces":
            return self._delete_namespace(table, entry, obj)
        finalizers = list(meta.get("finalizers") or [])
        refinalized = False
        if not (key == "pods" and meta.get("deletionTimestamp")):  # a pod already terminating keeps its finalizers
            wanted = collecting.deletion_finalizers(res, finalizers, policy)
            if wanted != finalizers:
                finalizers, refinalized = wanted, True
                if wanted:
                    meta["finalizers"] = wanted
                else:
                    meta.pop("finalizers", None)
        if grace == 0 and not finalizers:
            return self._remove(table, entry, obj), True
        now = self.clock.now()
        shorter = True
        if meta.get("deletionTimestamp"):
            current = int(meta.get("deletionGracePeriodSeconds", 0))
            shorter = grace < current
            if not shorter and not refinalized:
                return obj, False
            if grace == 0 and not finalizers:
                return self._remove(table, entry, obj), True
        if shorter:  # a second delete may shorten the grace period, never lengthen it
            meta["deletionTimestamp"] = self._stamp(now + dt.timedelta(seconds=grace))
            meta["deletionGracePeriodSeconds"] = grace
        if res.has_generation:
            meta["generation"] = int(meta.get("generation", 1)) + 1
        meta["resourceVersion"] = str(self._bump())
        new_entry = self._entry(table, obj)
        table.put(_key(entry.namespace, entry.name), new_entry)
        table.record(Change(self._rv, "MODIFIED", new_entry, entry))
        return obj, False

    def _delete_namespace(self, table: _Table, entry: Entry, obj: Obj) -> tuple[Obj, bool]:
        """Namespaces go Terminating, their content is removed, then they go (the namespace controller's job)."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = self._now()
            meta["deletionGracePeriodSeconds"] = 0
            obj.setdefault("status", {})["phase"] = "Terminating"
            meta["resourceVersion"] = str(self._bump())
            new_entry = self._entry(table, obj)
            table.put(entry.name, new_entry)
            table.record(Change(self._rv, "MODIFIED", new_entry, entry))
            entry = new_entry
        answer = entry.obj()
        final = entry.obj()
        final.get("spec", {}).pop("finalizers", None)
        self._remove(table, entry, final)
        return answer, False
