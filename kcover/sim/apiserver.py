"""The simulated cluster's API server: Kubernetes REST paths in, the real server's answers out.

Owns routing (core and group paths, namespaced and all-namespaces, subresources), the read verbs get,
list (list and watch resourceVersion semantics, pagination), watch (`watching`) and pods/log, dispatching
the write verbs (`writing`: create, update, patch, delete, deletecollection, pods/binding and
pods/eviction), the recorded `/openapi/v3` documents (`openapi`), request counting by
"<VERB> <resource>", and applying `faults`. What a request says (query values, bodies, continue tokens,
the target) is read by `requesting`. Storage rules live in `store`, per-kind rules in `strategy`. Every
refusal answers the `Status` a real kube-apiserver would; an unexpected exception answers 500
InternalError rather than closing the connection. It answers `exchange.Request`s with
`exchange.Reply`/`exchange.Stream`; how they travel (loopback HTTP in `server`, or in-process in
`inprocess`) is not its business.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from kcover.sim import (
    deepjson,
    discovery,
    exchange,
    faults,
    openapi,
    podlogs,
    printing,
    requesting,
    selectors,
    status,
    strategy,
    tables,
    watching,
    writing,
)
from kcover.sim import store as stores

Obj = dict[str, Any]


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
            return requesting.json_reply(err.status_obj, err.status)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # task boundary: answer like the apiserver's panic handler
            return requesting.json_reply(status.internal(repr(exc)).status_obj, 500)

    def _target(self, parts: list[str]) -> requesting.Target | None:
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
                return requesting.Target(res, rest[1], rest[3] if len(rest) > 3 else None,
                                         rest[4] if len(rest) > 4 else "")
        res = reg.by_url(group, version, rest[0])
        if res is None or len(rest) > 3 or (res.namespaced and len(rest) > 1):
            raise status.ApiError(status.status(404, "NotFound", "the server could not find the requested "
                                                "resource"))
        return requesting.Target(res, None, rest[1] if len(rest) > 1 else None,
                                 rest[2] if len(rest) > 2 else "")

    def _non_resource(self, parts: list[str]) -> exchange.Answer:
        reg = self.store.registry
        path = "/" + "/".join(parts)
        doc: Obj | None = None
        if path in ("/healthz", "/readyz", "/livez"):
            return exchange.Reply(body=b"ok", content_type="text/plain")
        if path == "/openapi/v3":
            return requesting.json_reply(self.openapi.index(openapi.served_paths(reg.group_versions())))
        if path.startswith("/openapi/v3/"):
            found = self.openapi.document(path.removeprefix("/openapi/v3/"))
            if found is not None:
                return exchange.Reply(body=found[0], content_type=exchange.JSON,
                                      headers={"ETag": f'"{found[1]}"'})
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
        return requesting.json_reply(doc)

    async def _resource(self, request: exchange.Request, t: requesting.Target) -> exchange.Answer:
        method, query = request.method, request.query
        sub = t.subresource
        if sub and sub not in t.resource.subresources:
            raise status.ApiError(status.status(404, "NotFound", "the server could not find the requested "
                                                "resource"))
        handler: Callable[[ApiServer, exchange.Request, requesting.Target], Awaitable[exchange.Answer]]
        if method == "GET" and t.name is None:
            verb = "WATCH" if requesting.parse_bool(query, "watch") else "LIST"
            handler = ApiServer._watch if verb == "WATCH" else ApiServer._list
        elif method == "GET":
            verb, handler = "GET", ApiServer._get if sub != "log" else ApiServer._log
        elif method == "POST" and t.name is None:
            verb, handler = "CREATE", writing.create
        elif method == "POST" and sub == "binding":
            verb, handler = "CREATE", writing.bind
        elif method == "POST" and sub == "eviction":
            verb, handler = "CREATE", writing.evict
        elif method == "PUT" and t.name is not None:
            verb, handler = "UPDATE", writing.update
        elif method == "PATCH" and t.name is not None:
            verb, handler = "PATCH", writing.patch
        elif method == "DELETE" and t.name is not None:
            verb, handler = "DELETE", writing.delete
        elif method == "DELETE":
            verb, handler = "DELETECOLLECTION", writing.delete_collection
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
            return exchange.Reply(status=429, body=orjson.dumps(err.status_obj), content_type=exchange.JSON,
                                  headers={"Retry-After": str(decision.retry_after_seconds)})
        if decision.error_code:
            code = decision.error_code
            reason = "ServiceUnavailable" if code == 503 else "InternalError"
            return requesting.json_reply(status.status(code, reason, "injected fault"), code)
        return await handler(self, request, t)

    # --- helpers ------------------------------------------------------------------------------

    def _render(self, t: requesting.Target, raw: bytes) -> bytes:
        if t.new_events:
            return deepjson.dumps(strategy.event_from_core(deepjson.loads(raw)))
        return raw

    def _render_obj(self, t: requesting.Target, obj: Obj) -> Obj:
        return strategy.event_from_core(obj) if t.new_events else obj

    def _filter(self, request: exchange.Request, t: requesting.Target) -> tables.Filter:
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

    def _list_item(self, t: requesting.Target, raw: bytes) -> bytes:
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

    def _list_kind(self, t: requesting.Target) -> str:
        return f"{t.resource.kind}List"

    # --- verbs --------------------------------------------------------------------------------

    async def _get(self, request: exchange.Request, t: requesting.Target) -> exchange.Answer:
        assert t.name is not None
        self._check_rv(request.query.get("resourceVersion"))
        entry = self.store.entry(t.resource.key, t.namespace or "", t.name)
        if printing.wants_table(request.headers.get("Accept", ""), t.resource):
            return requesting.json_reply(printing.table(t.resource, [entry.obj()],
                                                        include=request.query.get("includeObject", ""),
                                                        now=self.store.clock.now()))
        return requesting.json_reply(self._render(t, entry.raw))

    async def _list(self, request: exchange.Request, t: requesting.Target) -> exchange.Answer:
        query = request.query
        limit = requesting.parse_int(query, "limit") or 0
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
            list_rv, after = requesting.decode_continue(token)
        else:
            rv = self._check_rv(rv_text)
            if rv and (match == "Exact" or (limit and match != "NotOlderThan")):
                entries = self.store.list_at(t.resource.key, flt, rv)
                more = bool(limit) and len(entries) > limit
                entries = entries[:limit] if more else entries
                token = requesting.encode_continue(rv, stores.entry_key(entries[-1])) if more else None
                return self._list_response(t, entries, rv, token, None, request)
        result = self.store.list(t.resource.key, flt, limit=limit, continue_after=after)
        cont = requesting.encode_continue(list_rv, result.continue_after) if result.continue_after else None
        return self._list_response(t, result.entries, list_rv, cont, result.remaining, request)

    def _list_response(self, t: requesting.Target, entries: list[tables.Entry], rv: int, cont: str | None,
                       remaining: int | None, request: exchange.Request | None = None) -> exchange.Reply:
        meta: Obj = {"resourceVersion": str(rv)}
        if cont:
            meta["continue"] = cont
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        if request is not None and printing.wants_table(request.headers.get("Accept", ""), t.resource):
            return requesting.json_reply(printing.table(t.resource, [e.obj() for e in entries], list_meta=meta,
                                                        include=request.query.get("includeObject", ""),
                                                        now=self.store.clock.now()))
        head = orjson.dumps({"kind": self._list_kind(t), "apiVersion": t.resource.api_version, "metadata": meta})
        items = b",".join(self._list_item(t, self._render(t, e.raw)) for e in entries)
        return exchange.Reply(body=head[:-1] + b',"items":[' + items + b"]}", content_type=exchange.JSON)

    async def _watch(self, request: exchange.Request, t: requesting.Target) -> exchange.Answer:
        options = watching.parse_options(request.query, requesting.parse_bool, requesting.parse_int)
        flt = self._filter(request, t)
        return await watching.serve(request, self, t, flt, options)

    async def _log(self, request: exchange.Request, t: requesting.Target) -> exchange.Answer:
        assert t.name is not None
        query = request.query
        options = podlogs.LogOptions(previous=requesting.parse_bool(query, "previous"),
                                     tail_lines=requesting.parse_int(query, "tailLines"),
                                     limit_bytes=requesting.parse_int(query, "limitBytes"),
                                     timestamps=requesting.parse_bool(query, "timestamps"),
                                     since_seconds=requesting.parse_int(query, "sinceSeconds"))
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
