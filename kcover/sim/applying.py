"""Server-side apply and managed fields in the simulated API server, as kube-apiserver 1.36's field manager.

Owns `metadata.managedFields` (read from k8s.io/apimachinery pkg/util/managedfields/internal and
structured-merge-diff's merge/update.go, on `fieldsets`):

* `apply` (PATCH `application/apply-patch+yaml`, YAML or JSON; `fieldManager` required, 422
  otherwise; `force`): the applied configuration is merged into the live object (or an empty one:
  apply creates), the manager's field set becomes the configuration's, fields it applied before
  and no one owns any more are removed, and a field another manager owns whose value the apply would
  change is a conflict, 409 with SMD's message and one `FieldManagerConflict` cause per field, unless
  `force` takes it over. An object without managed fields first gets a `before-first-apply` manager
  for what it holds.
* `track` (every create, update and non-apply patch through the API): the changed fields go to the
  writer (`fieldManager`, else the User-Agent up to its first "/"), operation Update, and are taken
  from other managers; an object that exists without managed fields is not tracked (as the real
  server, until something applies to it); a no-op write changes nothing; managed fields a client
  sends that differ from the stored ones replace them (`[{}]` clears them).

Entries are keyed by manager, operation, API version (Update only) and subresource, sorted as the
real server sorts them, and carry a whole-second time. Main-resource writes of kinds with a status
subresource leave status out of the sets, `/status` writes leave spec out, and metadata's
server-set fields (name, uid, resourceVersion, ...) are never owned. It does not do field
validation (`fieldValidation`), dry runs, or the client-side-apply upgrade's last-applied
annotation. Errors are `status.ApiError`s.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from kcover.aio import clock as clocks
from kcover.sim import deepjson, exchange, jobs, registry, requesting, status, strategy
from kcover.sim import fieldsets as fs

if TYPE_CHECKING:
    from kcover.sim import apiserver

Obj = dict[str, Any]
Managers = dict[tuple[str, str, str, str], tuple[set[fs.Path], str]]
"""(manager, operation, apiVersion ("" for Apply), subresource) -> (fields, time)."""
BEFORE_FIRST_APPLY = "before-first-apply"
_STRIP: frozenset[fs.Path] = frozenset({(("f", "apiVersion"),), (("f", "kind"),), (("f", "metadata"),), *(
    (("f", "metadata"), ("f", name)) for name in ("name", "namespace", "creationTimestamp", "selfLink", "uid",
                                                  "clusterName", "generation", "managedFields", "resourceVersion"))})


def manager_of(query: Any, user_agent: str) -> str:
    """managerOrUserAgent: the `fieldManager` parameter, else the User-Agent before its first "/"."""
    given = str(query.get("fieldManager") or "")
    if len(given) > 128:
        raise status.invalid("PatchOptions", "meta.k8s.io", "", [
            ("FieldValueTooLong", "fieldManager", "Too long: may not be more than 128 bytes")])
    return given or "".join(ch for ch in user_agent.split("/")[0] if ch.isprintable())[:128]


def _schema(res: registry.Resource) -> fs.Schema:
    return fs.Schema.of(res.group, res.version, res.kind)


def _opaque(value: Any) -> bool:
    """`value` holds a part the simulator keeps unparsed (`deepjson.Raw`: nested past orjson's depth)."""
    if isinstance(value, deepjson.Raw):
        return True
    if isinstance(value, dict):
        return any(_opaque(v) for v in value.values())
    if isinstance(value, list):
        return any(_opaque(v) for v in value)
    return False


def _decode(meta: Obj) -> Managers:
    out: Managers = {}
    for entry in meta.get("managedFields") or []:
        if not isinstance(entry, dict) or (not entry.get("manager") and not entry.get("operation")):
            continue
        op = str(entry.get("operation") or "")
        key = (str(entry.get("manager") or ""), op, "" if op == "Apply" else str(entry.get("apiVersion") or ""),
               str(entry.get("subresource") or ""))
        try:
            fields = fs.from_fields_v1(entry.get("fieldsV1") or {})
        except ValueError:
            raise status.bad_request(f"failed to decode managed fields: {entry.get('fieldsV1')!r}") from None
        out[key] = (fields, str(entry.get("time") or ""))
    return out


def _encode(managers: Managers, api_version: str) -> list[Obj]:
    entries = []
    for (manager, op, version, sub), (fields, time) in managers.items():
        entry: Obj = {"manager": manager, "operation": op, "apiVersion": version or api_version}
        if time:
            entry["time"] = time
        entry["fieldsType"] = "FieldsV1"
        entry["fieldsV1"] = fs.to_fields_v1(fields)
        if sub:
            entry["subresource"] = sub
        entries.append(entry)
    entries.sort(key=lambda e: (e["operation"], e.get("time", ""), e["manager"], e["apiVersion"],
                                e.get("subresource", "")))
    return entries


def _excluded(res: registry.Resource, subresource: str) -> tuple[str, ...]:
    """Top-level fields a write to this endpoint cannot change (the strategy resets them)."""
    if subresource == "status":
        return ("spec",)
    return ("status",) if res.has_status else ()


def _filter(paths: set[fs.Path], excluded: tuple[str, ...]) -> set[fs.Path]:
    return {p for p in paths if p not in _STRIP and not (p and p[0][0] == "f" and p[0][1] in excluded)}


def _empty(res: registry.Resource) -> Obj:
    """The zero value of the kind as the real server compares against on create: struct-typed spec and
    status present (Go encodes a zero struct), everything else absent."""
    schema = _schema(res)
    out: Obj = {"metadata": {}}
    for name in ("spec", "status"):
        if schema.has_field(name) and schema.child(name).kind({}) == "struct":
            out[name] = {}
    return out


def _update(old: Obj, new: Obj, managers: Managers, who: tuple[str, str, str, str], schema: fs.Schema,
            excluded: tuple[str, ...], now: str) -> Managers:
    """Updater.Update: the writer takes what changed; others lose it; removed fields leave every set."""
    diff = fs.compare(old, new, schema)
    changed = _filter(diff.added | diff.modified, excluded)
    removed = _filter(diff.removed, excluded)
    out: Managers = {}
    for key, (fields, time) in managers.items():
        if key == who:
            continue
        kept = fields - changed - removed
        if kept:
            out[key] = (kept, time)
    mine = (managers.get(who, (set(), ""))[0] - removed) | changed
    if mine:
        out[who] = (mine, now if changed or who not in managers else managers[who][1])
    return out


def track(res: registry.Resource, old: Obj | None, new: Obj, manager: str, subresource: str, now: str) -> Obj:
    """`new` (a create when `old` is None) with its managed fields after a non-apply write by `manager`."""
    new = copy.deepcopy(new)
    meta = new.setdefault("metadata", {})
    sent = meta.get("managedFields")
    stored = (old or {}).get("metadata", {}).get("managedFields")
    if sent == [{}]:
        managers: Managers = {}
    elif _opaque(sent) or (not sent and _opaque(stored)):
        return new  # nested past what the simulator parses (kube-apiserver reads any depth): kept as they are
    elif sent and sent != stored:
        managers = _decode(meta)
    elif old is not None:
        if not stored:
            meta.pop("managedFields", None)
            return new  # never applied to: not tracked
        managers = _decode(old["metadata"])
    else:
        managers = {}
    who = (manager, "Update", res.api_version, subresource)
    base = copy.deepcopy(old) if old is not None else _empty(res)
    base.get("metadata", {}).pop("managedFields", None)
    candidate = {**new, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    managers = _update(base, candidate, managers, who, _schema(res), _excluded(res, subresource), now)
    if managers:
        meta["managedFields"] = _encode(managers, res.api_version)
    else:
        meta.pop("managedFields", None)
    return new


def parse_applied(data: bytes) -> Obj:
    """The applied configuration: YAML (JSON is YAML), one object; 400 when it is not."""
    try:
        body = yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise status.bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(body, dict):
        raise status.bad_request("error decoding YAML: the applied configuration is not an object")
    return body


def check_options(query: Any, content_type: str, apply_type: str) -> None:
    """ValidatePatchOptions: `fieldManager` required for apply, `force` only for apply."""
    if content_type == apply_type:
        if not query.get("fieldManager"):
            raise status.invalid("PatchOptions", "meta.k8s.io", "", [
                ("FieldValueRequired", "fieldManager", "Required value: is required for apply patch")])
    elif query.get("force") not in (None, ""):
        raise status.invalid("PatchOptions", "meta.k8s.io", "", [
            ("FieldValueForbidden", "force", "Forbidden: may not be specified for non-apply patch")])


def apply(res: registry.Resource, live: Obj | None, applied: Obj, manager: str, force: bool, subresource: str,
          now: str) -> Obj:
    """The object after `manager` applies `applied` to `live` (None: it does not exist yet); 409 on conflicts."""
    schema = _schema(res)
    excluded = _excluded(res, subresource)
    applied = copy.deepcopy(applied)
    applied.get("metadata", {}).pop("managedFields", None)
    base = copy.deepcopy(live) if live is not None else _empty(res)
    managers = _decode(base.get("metadata") or {})
    base.get("metadata", {}).pop("managedFields", None)
    if not managers and live is not None:
        managers = _update(_empty(res), base, {}, (BEFORE_FIRST_APPLY, "Update", res.api_version, subresource),
                           schema, excluded, now)
    who = (manager, "Apply", "", subresource)
    last, last_time = managers.get(who, (set(), ""))
    merged: Obj = fs.merge(base, applied, schema)
    mine = _filter(fs.field_set(applied, schema), excluded)
    managers[who] = (mine, now)
    owned = set().union(*(fields for fields, _ in managers.values()))
    stale = {p for p in last - owned if not any(o[:len(p)] == p for o in owned)}
    merged = dict(fs.remove(merged, stale, schema))
    if merged == base:  # the object does not change: the applier's time is not touched (SMD returns no object)
        managers[who] = (mine, last_time)
    diff = fs.compare(base, merged, schema)
    changed = _filter(diff.added | diff.modified, excluded)
    removed = _filter(diff.removed, excluded)
    conflicts = [(key, path) for key, (fields, _) in managers.items() if key != who
                 for path in sorted(fields & changed, key=fs.path_text)]
    if conflicts and not force:
        raise _conflict(conflicts, managers)
    out: Managers = {}
    for key, (fields, time) in managers.items():
        kept = fields if key == who else fields - changed - removed
        if kept:
            out[key] = (kept, time)
    merged.setdefault("metadata", {})["managedFields"] = _encode(out, res.api_version)
    return merged


def _describe(key: tuple[str, str, str, str], time: str) -> str:
    """printManager over the manager identifier (which holds no time): `"name"`, with its subresource, and for an
    updater its API version."""
    manager, op, version, sub = key
    text = f'"{manager}"' + (f' with subresource "{sub}"' if sub else "")
    if op == "Update":
        text += f" using {version}"
    return text


def _conflict(conflicts: list[tuple[tuple[str, str, str, str], fs.Path]], managers: Managers) -> status.ApiError:
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {_describe(k, managers[k][1])}",
               "field": fs.path_text(p)} for k, p in conflicts]
    if len(conflicts) == 1:
        key, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {_describe(key, managers[key][1])}: {fs.path_text(path)}"
    else:
        lines = []
        for key in sorted({k for k, _ in conflicts}, key=lambda k: _describe(k, managers[k][1])):
            lines.append(f"conflicts with {_describe(key, managers[key][1])}:")
            lines += [f"- {fs.path_text(p)}" for k, p in conflicts if k == key]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return status.ApiError({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": "Conflict", "details": {"causes": causes},
                            "code": 409})


async def serve(server: apiserver.ApiServer, request: exchange.Request, t: requesting.Target) -> exchange.Reply:
    """PATCH with `application/apply-patch+yaml`: update the object, or create it (201) when it does not exist."""
    assert t.name is not None
    data = await request.read()
    if not data:
        raise status.bad_request("the body of the request is empty")
    applied = parse_applied(data)
    if t.new_events:
        applied = strategy.event_to_core(applied)
    meta: Obj = applied["metadata"] if isinstance(applied.get("metadata"), dict) else {}
    if meta.get("name", t.name) != t.name:
        raise status.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                                 f"({t.name})")
    if t.resource.namespaced and meta.get("namespace", t.namespace) != t.namespace:
        raise status.bad_request("the namespace of the provided object does not match the namespace sent on the "
                                 "request")
    from kcover.sim import writing  # the module that imports this one

    force = requesting.parse_bool(request.query, "force")
    manager = str(request.query.get("fieldManager"))
    now = clocks.rfc3339(server.store.clock.now())
    try:
        live: Obj | None = server.store.get(t.resource.key, t.namespace or "", t.name)
    except status.ApiError as err:
        if err.status != 404 or t.subresource:
            raise
        live = None
    merged = apply(t.resource, live, applied, manager, force, t.subresource, now)
    merged.setdefault("metadata", {})["name"] = t.name
    if t.resource.namespaced:
        merged["metadata"]["namespace"] = t.namespace
    if live is not None:
        return await writing.write(server, t, merged, live)
    merged.setdefault("apiVersion", t.resource.api_version)
    merged.setdefault("kind", t.resource.kind)
    obj = strategy.prepare_create(t.resource, merged, new_api=False)
    job = t.resource.key == jobs.KEY
    created = server.store.create(t.resource.key, jobs.defaults(obj) if job else obj,
                                  admit=jobs.generate_selector if job else None)
    return exchange.Reply(status=201, body=orjson.dumps(server._render_obj(t, created)))
