"""The simulated API server's write verbs: create, update, patch, delete, deletecollection, binding, eviction.

Owns what each write does to the store as kube-apiserver would: the namespace and name of the body checked
against the URL, the per-kind rules (`strategy`), `fieldValidation`'s answer (`customresources`), managed
fields (`applying.track`), merge, strategic-merge and JSON patches (`patching`; an apply is `applying`'s),
DeleteOptions (grace period, preconditions, propagation policy, from the body or the query), pods/binding
and pods/eviction (`evicting`), and forgetting a deleted pod's logs. It does not route, count or delay
requests (`apiserver`), nor read them (`requesting`).

Every refusal raises or answers the `Status` a real kube-apiserver would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from kcover.aio import clock as clocks
from kcover.sim import (
    applying,
    customresources,
    deepjson,
    devicetaints,
    evicting,
    exchange,
    jobs,
    patching,
    requesting,
    status,
    strategy,
)

if TYPE_CHECKING:
    from kcover.sim import apiserver

Obj = dict[str, Any]


async def create(server: apiserver.ApiServer, request: exchange.Request,
                 t: requesting.Target) -> exchange.Answer:
    body = await requesting.body(request)
    if not isinstance(body, dict):
        raise status.bad_request("the object provided is not an object")
    meta = body.setdefault("metadata", {})
    if t.resource.namespaced:
        if meta.get("namespace") and meta["namespace"] != t.namespace:
            raise status.bad_request("the namespace of the provided object does not match the namespace "
                                     "sent on the request")
        if t.namespace is None:
            raise status.ApiError(status.status(405, "MethodNotAllowed", "the server does not allow this "
                                                "method on the requested resource"))
        meta["namespace"] = t.namespace
    if t.new_events:
        body = strategy.event_to_core(body)
    warnings = customresources.field_validation(t.resource, request.query, request.method, body, patched=False)
    try:
        obj = strategy.prepare_create(t.resource, body, new_api=t.new_events)
        if t.resource.key == devicetaints.KEY:
            obj = devicetaints.defaults(obj, server.store.clock.now())
        job = t.resource.key == jobs.KEY
        obj = applying.track(t.resource, None, jobs.defaults(obj) if job else obj, _manager(request), "",
                             clocks.rfc3339(server.store.clock.now()))
        created = server.store.create(t.resource.key, obj, admit=jobs.generate_selector if job else None)
    except status.ApiError as err:
        return requesting.json_reply(err.status_obj, err.status, headers=warnings)
    return requesting.json_reply(server._render_obj(t, created), 201, headers=warnings)


def _manager(request: exchange.Request) -> str:
    return applying.manager_of(request.query, request.headers.get("User-Agent", ""))


async def write(server: apiserver.ApiServer, t: requesting.Target, new: Obj, old: Obj, manager: str | None = None,
                *, request: exchange.Request | None = None, patched: bool = False) -> exchange.Reply:
    """Store `new` over `old`; `manager` (the writer's field manager) tracks managed fields, None for an
    apply, whose object already carries them; `request`'s `fieldValidation` is answered (none for an
    apply: its unknown fields are not checked)."""
    assert t.name is not None
    meta = new.get("metadata") or {}
    if meta.get("name", t.name) != t.name:
        raise status.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                                 f"the URL ({t.name})")
    if t.resource.namespaced and meta.get("namespace", t.namespace) != t.namespace:
        raise status.bad_request("the namespace of the provided object does not match the namespace sent on "
                                 "the request")
    new.setdefault("metadata", {})["name"] = t.name
    if t.resource.namespaced:
        new["metadata"]["namespace"] = t.namespace
    if t.new_events:
        new = strategy.event_to_core(new)
    warnings = {} if request is None else customresources.field_validation(
        t.resource, request.query, request.method, new, patched=patched)
    try:
        prepared = strategy.prepare_update(t.resource, new, old, subresource=t.subresource,
                                           new_api=t.new_events)
        if manager is not None:
            prepared = applying.track(t.resource, old, prepared, manager, t.subresource,
                                      clocks.rfc3339(server.store.clock.now()))
        updated = server.store.update(t.resource.key, prepared)
    except status.ApiError as err:
        return requesting.json_reply(err.status_obj, err.status, headers=warnings)
    return requesting.json_reply(server._render_obj(t, updated), headers=warnings)


async def update(server: apiserver.ApiServer, request: exchange.Request,
                 t: requesting.Target) -> exchange.Answer:
    assert t.name is not None
    body = await requesting.body(request)
    if not isinstance(body, dict):
        raise status.bad_request("the object provided is not an object")
    if not t.resource.put_without_rv and not (body.get("metadata") or {}).get("resourceVersion"):
        raise status.invalid(t.resource.kind, t.resource.group, t.name, [
            ("FieldValueInvalid", "metadata.resourceVersion",
             "Invalid value: 0x0: must be specified for an update")])
    old = server.store.get(t.resource.key, t.namespace or "", t.name)
    return await write(server, t, body, old, _manager(request), request=request)


async def patch(server: apiserver.ApiServer, request: exchange.Request,
                t: requesting.Target) -> exchange.Answer:
    assert t.name is not None
    content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    accepted = [patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH]
    if t.resource.strategic_merge:
        accepted.insert(2, patching.STRATEGIC_MERGE_PATCH)
    if content_type not in accepted:
        raise status.unsupported_media_type(content_type, accepted)
    applying.check_options(request.query, content_type, patching.APPLY_PATCH)
    if content_type == patching.APPLY_PATCH:
        return await applying.serve(server, request, t)
    body = await requesting.body(request)
    old = server.store.get(t.resource.key, t.namespace or "", t.name)
    patched = patching.apply(server._render_obj(t, old), body, content_type)
    return await write(server, t, patched, old, _manager(request), request=request, patched=True)


async def _delete_options(request: exchange.Request) -> tuple[int | None, str | None, str | None, str | None]:
    data = await request.read()
    options: Obj = {}
    if data and requesting.is_protobuf(request):
        options = requesting.protobuf_body(data)
    elif data:
        try:
            options = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise status.bad_request("the body of the request was not valid DeleteOptions") from None
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        grace = requesting.parse_int(request.query, "gracePeriodSeconds")
    policy = options.get("propagationPolicy") or request.query.get("propagationPolicy")
    orphan = options.get("orphanDependents", request.query.get("orphanDependents"))
    if policy in (None, "") and orphan not in (None, ""):
        policy = "Orphan" if str(orphan).lower() == "true" else "Background"
    if policy not in (None, "", "Orphan", "Background", "Foreground"):
        raise status.invalid("DeleteOptions", "", "", [
            ("FieldValueNotSupported", "propagationPolicy",
             f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan", "nil"')])
    pre = options.get("preconditions") or {}
    return (None if grace is None else max(0, int(grace)), pre.get("uid"), pre.get("resourceVersion"),
            policy or None)


async def delete(server: apiserver.ApiServer, request: exchange.Request,
                 t: requesting.Target) -> exchange.Answer:
    assert t.name is not None
    grace, uid, rv, policy = await _delete_options(request)
    obj, gone = server.store.delete(t.resource.key, t.namespace or "", t.name, grace_seconds=grace, uid=uid,
                                    resource_version=rv, policy=policy)
    if gone and t.resource.key == "pods":
        server.logs.forget_pod(t.namespace or "", t.name)
    if gone and t.resource.key not in ("pods", "namespaces") and not t.resource.returns_deleted:
        meta = obj["metadata"]
        return requesting.json_reply(status.success(t.resource.plural, t.resource.group, t.name, meta["uid"]))
    return requesting.json_reply(server._render_obj(t, obj))


async def delete_collection(server: apiserver.ApiServer, request: exchange.Request,
                            t: requesting.Target) -> exchange.Answer:
    grace, _, _, policy = await _delete_options(request)
    flt = server._filter(request, t)
    matched = server.store.list(t.resource.key, flt).entries
    items: list[bytes] = []
    for entry in matched:
        try:
            obj, gone = server.store.delete(t.resource.key, entry.namespace, entry.name, grace_seconds=grace,
                                            policy=policy)
        except status.ApiError as err:
            if err.status == 404:
                continue
            raise
        if gone and t.resource.key == "pods":
            server.logs.forget_pod(entry.namespace, entry.name)
        items.append(server._list_item(t, deepjson.dumps(server._render_obj(t, obj))))
    head = orjson.dumps({"kind": server._list_kind(t), "apiVersion": t.resource.api_version,
                         "metadata": {"resourceVersion": str(server.store.resource_version)}})
    return exchange.Reply(body=head[:-1] + b',"items":[' + b",".join(items) + b"]}", content_type=exchange.JSON)


async def bind(server: apiserver.ApiServer, request: exchange.Request,
               t: requesting.Target) -> exchange.Answer:
    assert t.name is not None
    body = await requesting.body(request)
    node = str(((body or {}).get("target") or {}).get("name") or "")
    pod = server.store.get("pods", t.namespace or "", t.name)
    if pod.get("spec", {}).get("nodeName"):
        raise status.conflict("pods", "", t.name, f"pod {t.name} is already assigned to node "
                              f"\"{pod['spec']['nodeName']}\"")
    pod["spec"]["nodeName"] = node
    server.store.update("pods", pod)
    return requesting.json_reply({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "code": 201}, 201)


async def evict(server: apiserver.ApiServer, request: exchange.Request,
                t: requesting.Target) -> exchange.Answer:
    """The Eviction API, PodDisruptionBudgets honoured (`evicting`): 201 and a Success Status."""
    assert t.name is not None
    body = await requesting.body(request)
    if not isinstance(body, dict):
        raise status.bad_request("the object provided is not an object")
    now = clocks.rfc3339(server.store.clock.now())
    _, gone = evicting.evict(server.store, t.namespace or "", t.name, body, now)
    if gone:
        server.logs.forget_pod(t.namespace or "", t.name)
    return requesting.json_reply({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "code": 201}, 201)
