"""The simulated cluster's API server: Kubernetes REST paths in, the real server's answers out.

Owns routing (core and group paths, namespaced and all-namespaces, subresources), query parsing
(Go-style booleans, selectors, list and watch resourceVersion semantics, pagination tokens), the
verbs get, list, watch, create, update, patch, delete, deletecollection, pods/log and pods/eviction
(`evicting`), request bodies as JSON or protobuf (`protobuf`), `fieldValidation`'s answer on writes
(`customresources.field_validation`: `Warning` headers, or Strict's refusal), the recorded `/openapi/v3` documents
(`openapi`), request counting by "<VERB> <resource>", and applying `faults`. Storage rules live in `store`, per-kind
rules in `strategy`. Every refusal answers the `Status` a real kube-apiserver would; an unexpected
exception answers 500 InternalError rather than closing the connection. It answers
`exchange.Request`s with `exchange.Reply`/`exchange.Stream`; how they travel (loopback HTTP in
`server`, or in-process in `inprocess`) is not its business.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from kcover.aio import clock as clocks
from kcover.sim import (
    applying,
    customresources,
    deepjson,
    devicetaints,
    discovery,
    evicting,
    exchange,
    faults,
    jobs,
    openapi,
    patching,
    podlogs,
    printing,
    protobuf,
    registry,
    selectors,
    status,
    strategy,
    tables,
    watching,
)
from kcover.sim import store as stores

Obj = dict[str, Any]
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}
_JSON = "application/json"


def parse_bool(query: Any, name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise status.bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def parse_int(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise status.bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None


def _json(body: Obj | bytes, code: int = 200, *, headers: dict[str, str] | None = None) -> exchange.Reply:
    data = body if isinstance(body, bytes) else deepjson.dumps(body)
    return exchange.Reply(status=code, body=data, content_type=_JSON, headers=dict(headers or {}))


def _is_protobuf(request: exchange.Request) -> bool:
    return (request.headers.get("Content-Type") or "").split(";")[0].strip().lower() == protobuf.MEDIA_TYPE


def _protobuf_body(data: bytes) -> Obj:
    """A body client-go's generated clients send as protobuf (built-in kinds), as JSON."""
    try:
        return protobuf.decode(data)
    except protobuf.ProtobufError as exc:
        raise status.bad_request(f"the object provided is unrecognized: {exc}") from None


def encode_continue(rv: int, key: str) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": key + "\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"]).rstrip("\x00")
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise status.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                 "(version meta.k8s.io/v1)") from None


@dataclass
class Target:
    """A parsed resource URL."""

    resource: registry.Resource
    namespace: str | None
    name: str | None
    subresource: str

    @property
    def new_events(self) -> bool:
        return self.resource.group == "events.k8s.io"


class ApiServer:
    """The aiohttp application of one simulated cluster."""

    def __init__(self, store: stores.Store, logs: podlogs.LogBuffers, fault: faults.Faults,
                 *, rng: random.Random | None = None, bookmark_interval: float = 60.0,
                 liveness_interval: float = 1.0) -> None:
        self.store = store
        self.logs = logs
        self.faults = fault
        self.request_counts: dict[str, int] = {}
        self.bookmark_interval = bookmark_interval
        self.liveness_interval = liveness_interval
        """Seconds between checks that a quiet watch's client is still there (a closed HTTP connection)."""
        self.server_address = "127.0.0.1:0"
        self._rng = rng or random.Random()
        self.openapi = openapi.Documents()

    # --- routing ------------------------------------------------------------------------------

    async def handle(self, request: exchange.Request) -> exchange.Answer:
        """Answer one request as kube-apiserver would."""
        try:
            parts = [p for p in request.path.split("/") if p]
            target = self._target(parts)
            if target is None:
                return self._non_resource(parts)
            return await self._resource(request, target)
        except status.ApiError as err:
            return _json(err.status_obj, err.status)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # task boundary: answer like the apiserver's panic handler
            return _json(status.internal(repr(exc)).status_obj, 500)

    def _target(self, parts: list[str]) -> Target | None:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if not rest:
            return None
        reg = self.store.registry
        if rest[0] == "namespaces" and len(rest) >= 3:
            res = reg.by_url(group, version, rest[2])
            if res is not None and res.namespaced:
                if len(rest) > 5:
                    raise status.ApiError(status.status(404, "NotFound", "the server could not find the "
                                                        "requested resource"))
                return Target(res, rest[1], rest[3] if len(rest) > 3 else None, rest[4] if len(rest) > 4 else "")
        res = reg.by_url(group, version, rest[0])
        if res is None or len(rest) > 3 or (res.namespaced and len(rest) > 1):
            raise status.ApiError(status.status(404, "NotFound", "the server could not find the requested "
                                                "resource"))
        return Target(res, None, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else "")

    def _non_resource(self, parts: list[str]) -> exchange.Answer:
        reg = self.store.registry
        path = "/" + "/".join(parts)
        doc: Obj | None = None
        if path in ("/healthz", "/readyz", "/livez"):
            return exchange.Reply(body=b"ok", content_type="text/plain")
        if path == "/openapi/v3":
            return _json(self.openapi.index(openapi.served_paths(reg.group_versions())))
        if path.startswith("/openapi/v3/"):
            found = self.openapi.document(path.removeprefix("/openapi/v3/"))
            if found is not None:
                return exchange.Reply(body=found[0], content_type=_JSON, headers={"ETag": f'"{found[1]}"'})
        if path == "/version":
            doc = discovery.version()
        elif path == "/api":
            doc = discovery.api_versions(self.server_address)
        elif path == "/api/v1":
            doc = discovery.api_resource_list(reg, "", "v1")
        elif path == "/apis":
            doc = discovery.api_group_list(reg)
        elif len(parts) == 2 and parts[0] == "apis":
            doc = discovery.api_group(reg, parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            doc = discovery.api_resource_list(reg, parts[1], parts[2])
        if doc is None:
            raise status.ApiError(status.status(404, "NotFound", "the server could not find the requested "
                                                "resource"))
        return _json(doc)

    async def _resource(self, request: exchange.Request, t: Target) -> exchange.Answer:
        method, query = request.method, request.query
        sub = t.subresource
        if sub and sub not in t.resource.subresources:
            raise status.ApiError(status.status(404, "NotFound", "the server could not find the requested "
                                                "resource"))
        handler: Callable[[exchange.Request, Target], Awaitable[exchange.Answer]]
        if method == "GET" and t.name is None:
            verb = "WATCH" if parse_bool(query, "watch") else "LIST"
            handler = self._watch if verb == "WATCH" else self._list
        elif method == "GET":
            verb, handler = "GET", self._get if sub != "log" else self._log
        elif method == "POST" and t.name is None:
            verb, handler = "CREATE", self._create
        elif method == "POST" and sub == "binding":
            verb, handler = "CREATE", self._bind
        elif method == "POST" and sub == "eviction":
            verb, handler = "CREATE", self._evict
        elif method == "PUT" and t.name is not None:
            verb, handler = "UPDATE", self._update
        elif method == "PATCH" and t.name is not None:
            verb, handler = "PATCH", self._patch
        elif method == "DELETE" and t.name is not None:
            verb, handler = "DELETE", self._delete
        elif method == "DELETE":
            verb, handler = "DELETECOLLECTION", self._delete_collection
        else:
            raise status.ApiError(status.status(405, "MethodNotAllowed",
                                                "the server does not allow this method on the requested "
                                                "resource"))
        counted = t.resource.key + (f"/{sub}" if sub else "")
        name = f"{verb} {counted}"
        self.request_counts[name] = self.request_counts.get(name, 0) + 1
        decision = self.faults.decide(t.resource.key)
        if decision.delay_seconds:
            await asyncio.sleep(decision.delay_seconds)
        if decision.throttle == "text":
            return exchange.Reply(status=429, body=b"Too many requests, please try again later.\n",
                                  content_type="text/plain",
                                  headers={"Retry-After": str(decision.retry_after_seconds)})
        if decision.throttle == "status":
            err = status.too_many_requests(decision.retry_after_seconds)
            return exchange.Reply(status=429, body=orjson.dumps(err.status_obj), content_type=_JSON,
                                  headers={"Retry-After": str(decision.retry_after_seconds)})
        if decision.error_code:
            code = decision.error_code
            reason = "ServiceUnavailable" if code == 503 else "InternalError"
            return _json(status.status(code, reason, "injected fault"), code)
        return await handler(request, t)

    # --- helpers ------------------------------------------------------------------------------

    def _render(self, t: Target, raw: bytes) -> bytes:
        if t.new_events:
            return deepjson.dumps(strategy.event_from_core(deepjson.loads(raw)))
        return raw

    def _render_obj(self, t: Target, obj: Obj) -> Obj:
        return strategy.event_from_core(obj) if t.new_events else obj

    async def _body(self, request: exchange.Request) -> Any:
        data = await request.read()
        if not data:
            raise status.bad_request("the body of the request is empty")
        if _is_protobuf(request):
            return _protobuf_body(data)
        try:
            return deepjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise status.bad_request(f"the object provided is unrecognized: {exc}") from None

    def _filter(self, request: exchange.Request, t: Target) -> tables.Filter:
        query = request.query
        fields = selectors.parse_fields(query.get("fieldSelector"), t.resource.field_labels)
        if t.new_events:
            rename = {"reportingController": "reportingComponent"}
            fields = selectors.FieldSelector(tuple(
                selectors.FieldRequirement(rename.get(r.field, r.field.replace("regarding.", "involvedObject.")),
                                           r.equal, r.value) for r in fields.requirements))
        return tables.Filter(t.namespace, selectors.parse_labels(query.get("labelSelector")), fields)

    def _check_rv(self, rv_text: str | None) -> int | None:
        if rv_text in (None, ""):
            return None
        try:
            rv = int(str(rv_text))
        except ValueError:
            raise status.bad_request(f'invalid resource version "{rv_text}"') from None
        if rv > self.store.resource_version:
            raise status.too_large_rv(rv, self.store.resource_version)
        return rv

    def _list_item(self, t: Target, raw: bytes) -> bytes:
        """An item as a list carries it: kube-apiserver leaves `kind`/`apiVersion` out of a built-in kind's
        items (a typed list) and keeps them in a custom resource's (unstructured)."""
        if not t.resource.builtin:
            return raw
        api_version = "events.k8s.io/v1" if t.new_events else t.resource.api_version
        head = orjson.dumps({"apiVersion": api_version, "kind": t.resource.kind})[:-1] + b","
        if raw.startswith(head):
            return b"{" + raw[len(head):]
        obj = deepjson.loads(raw)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        return deepjson.dumps(obj)

    def _list_kind(self, t: Target) -> str:
        return f"{t.resource.kind}List"

    # --- verbs --------------------------------------------------------------------------------

    async def _get(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        self._check_rv(request.query.get("resourceVersion"))
        entry = self.store.entry(t.resource.key, t.namespace or "", t.name)
        if printing.wants_table(request.headers.get("Accept", ""), t.resource):
            return _json(printing.table(t.resource, [entry.obj()], include=request.query.get("includeObject", ""),
                                        now=self.store.clock.now()))
        return _json(self._render(t, entry.raw))

    async def _list(self, request: exchange.Request, t: Target) -> exchange.Answer:
        query = request.query
        limit = parse_int(query, "limit") or 0
        token = query.get("continue") or None
        rv_text = query.get("resourceVersion")
        match = query.get("resourceVersionMatch") or ""
        flt = self._filter(request, t)
        if match and rv_text in (None, ""):
            raise status.bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")
        if match not in ("", "Exact", "NotOlderThan"):
            raise status.bad_request(f"resourceVersionMatch: unsupported value {match!r}")
        after: str | None = None
        list_rv = self.store.resource_version
        if token:
            if rv_text not in (None, "", "0"):
                raise status.bad_request("specifying resource version is not allowed when using continue")
            list_rv, after = decode_continue(token)
        else:
            rv = self._check_rv(rv_text)
            if rv and (match == "Exact" or (limit and match != "NotOlderThan")):
                entries = self.store.list_at(t.resource.key, flt, rv)
                more = bool(limit) and len(entries) > limit
                entries = entries[:limit] if more else entries
                token = encode_continue(rv, stores.entry_key(entries[-1])) if more else None
                return self._list_response(t, entries, rv, token, None, request)
        result = self.store.list(t.resource.key, flt, limit=limit, continue_after=after)
        cont = encode_continue(list_rv, result.continue_after) if result.continue_after else None
        return self._list_response(t, result.entries, list_rv, cont, result.remaining, request)

    def _list_response(self, t: Target, entries: list[tables.Entry], rv: int, cont: str | None,
                       remaining: int | None, request: exchange.Request | None = None) -> exchange.Reply:
        meta: Obj = {"resourceVersion": str(rv)}
        if cont:
            meta["continue"] = cont
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        if request is not None and printing.wants_table(request.headers.get("Accept", ""), t.resource):
            return _json(printing.table(t.resource, [e.obj() for e in entries], list_meta=meta,
                                        include=request.query.get("includeObject", ""), now=self.store.clock.now()))
        head = orjson.dumps({"kind": self._list_kind(t), "apiVersion": t.resource.api_version, "metadata": meta})
        items = b",".join(self._list_item(t, self._render(t, e.raw)) for e in entries)
        return exchange.Reply(body=head[:-1] + b',"items":[' + items + b"]}", content_type=_JSON)

    async def _watch(self, request: exchange.Request, t: Target) -> exchange.Answer:
        options = watching.parse_options(request.query, parse_bool, parse_int)
        flt = self._filter(request, t)
        return await watching.serve(request, self, t, flt, options)

    async def _create(self, request: exchange.Request, t: Target) -> exchange.Answer:
        body = await self._body(request)
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
                obj = devicetaints.defaults(obj, self.store.clock.now())
            job = t.resource.key == jobs.KEY
            obj = applying.track(t.resource, None, jobs.defaults(obj) if job else obj, self._manager(request), "",
                                 clocks.rfc3339(self.store.clock.now()))
            created = self.store.create(t.resource.key, obj, admit=jobs.generate_selector if job else None)
        except status.ApiError as err:
            return _json(err.status_obj, err.status, headers=warnings)
        return _json(self._render_obj(t, created), 201, headers=warnings)

    def _manager(self, request: exchange.Request) -> str:
        return applying.manager_of(request.query, request.headers.get("User-Agent", ""))

    async def _write(self, t: Target, new: Obj, old: Obj, manager: str | None = None, *,
                     request: exchange.Request | None = None, patched: bool = False) -> exchange.Reply:
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
                                          clocks.rfc3339(self.store.clock.now()))
            updated = self.store.update(t.resource.key, prepared)
        except status.ApiError as err:
            return _json(err.status_obj, err.status, headers=warnings)
        return _json(self._render_obj(t, updated), headers=warnings)

    async def _update(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        body = await self._body(request)
        if not isinstance(body, dict):
            raise status.bad_request("the object provided is not an object")
        if not t.resource.put_without_rv and not (body.get("metadata") or {}).get("resourceVersion"):
            raise status.invalid(t.resource.kind, t.resource.group, t.name, [
                ("FieldValueInvalid", "metadata.resourceVersion",
                 "Invalid value: 0x0: must be specified for an update")])
        old = self.store.get(t.resource.key, t.namespace or "", t.name)
        return await self._write(t, body, old, self._manager(request), request=request)

    async def _patch(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        accepted = [patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH]
        if t.resource.strategic_merge:
            accepted.insert(2, patching.STRATEGIC_MERGE_PATCH)
        if content_type not in accepted:
            raise status.unsupported_media_type(content_type, accepted)
        applying.check_options(request.query, content_type, patching.APPLY_PATCH)
        if content_type == patching.APPLY_PATCH:
            return await applying.serve(self, request, t)
        body = await self._body(request)
        old = self.store.get(t.resource.key, t.namespace or "", t.name)
        patched = patching.apply(self._render_obj(t, old), body, content_type)
        return await self._write(t, patched, old, self._manager(request), request=request, patched=True)

    async def _delete_options(self, request: exchange.Request) -> tuple[int | None, str | None, str | None, str | None]:
        data = await request.read()
        options: Obj = {}
        if data and _is_protobuf(request):
            options = _protobuf_body(data)
        elif data:
            try:
                options = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise status.bad_request("the body of the request was not valid DeleteOptions") from None
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = parse_int(request.query, "gracePeriodSeconds")
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

    async def _delete(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        grace, uid, rv, policy = await self._delete_options(request)
        obj, gone = self.store.delete(t.resource.key, t.namespace or "", t.name, grace_seconds=grace, uid=uid,
                                      resource_version=rv, policy=policy)
        if gone and t.resource.key == "pods":
            self.logs.forget_pod(t.namespace or "", t.name)
        if gone and t.resource.key not in ("pods", "namespaces") and not t.resource.returns_deleted:
            meta = obj["metadata"]
            return _json(status.success(t.resource.plural, t.resource.group, t.name, meta["uid"]))
        return _json(self._render_obj(t, obj))

    async def _delete_collection(self, request: exchange.Request, t: Target) -> exchange.Answer:
        grace, _, _, policy = await self._delete_options(request)
        flt = self._filter(request, t)
        matched = self.store.list(t.resource.key, flt).entries
        items: list[bytes] = []
        for entry in matched:
            try:
                obj, gone = self.store.delete(t.resource.key, entry.namespace, entry.name, grace_seconds=grace,
                                              policy=policy)
            except status.ApiError as err:
                if err.status == 404:
                    continue
                raise
            if gone and t.resource.key == "pods":
                self.logs.forget_pod(entry.namespace, entry.name)
            items.append(self._list_item(t, deepjson.dumps(self._render_obj(t, obj))))
        head = orjson.dumps({"kind": self._list_kind(t), "apiVersion": t.resource.api_version,
                             "metadata": {"resourceVersion": str(self.store.resource_version)}})
        return exchange.Reply(body=head[:-1] + b',"items":[' + b",".join(items) + b"]}", content_type=_JSON)

    async def _bind(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        body = await self._body(request)
        node = str(((body or {}).get("target") or {}).get("name") or "")
        pod = self.store.get("pods", t.namespace or "", t.name)
        if pod.get("spec", {}).get("nodeName"):
            raise status.conflict("pods", "", t.name, f"pod {t.name} is already assigned to node "
                                  f"\"{pod['spec']['nodeName']}\"")
        pod["spec"]["nodeName"] = node
        self.store.update("pods", pod)
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    async def _evict(self, request: exchange.Request, t: Target) -> exchange.Answer:
        """The Eviction API, PodDisruptionBudgets honoured (`evicting`): 201 and a Success Status."""
        assert t.name is not None
        body = await self._body(request)
        if not isinstance(body, dict):
            raise status.bad_request("the object provided is not an object")
        now = clocks.rfc3339(self.store.clock.now())
        _, gone = evicting.evict(self.store, t.namespace or "", t.name, body, now)
        if gone:
            self.logs.forget_pod(t.namespace or "", t.name)
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    async def _log(self, request: exchange.Request, t: Target) -> exchange.Answer:
        assert t.name is not None
        query = request.query
        options = podlogs.LogOptions(previous=parse_bool(query, "previous"),
                                     tail_lines=parse_int(query, "tailLines"),
                                     limit_bytes=parse_int(query, "limitBytes"),
                                     timestamps=parse_bool(query, "timestamps"),
                                     since_seconds=parse_int(query, "sinceSeconds"))
        podlogs.validate(options, t.name)
        pod = self.store.get("pods", t.namespace or "", t.name)
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        init_names = [c["name"] for c in spec.get("initContainers") or []]
        container = query.get("container") or ""
        if not container:
            if len(names) != 1:
                message = (f"a container name must be specified for pod {t.name}, choose one of: "
                           f"[{' '.join(names)}]")
                if init_names:
                    message += f" or one of the init containers: [{' '.join(init_names)}]"
                raise status.bad_request(message)
            container = names[0]
        if container not in names + init_names:
            raise status.bad_request(f"container {container} is not valid for pod {t.name}")
        if not spec.get("nodeName"):  # no kubelet to ask: a real server answers 204 No Content
            return exchange.Reply(status=204, content_type="text/plain")
        text = self.logs.read(t.namespace or "", t.name, container, options)
        return exchange.Reply(body=text.encode(), content_type="text/plain")
