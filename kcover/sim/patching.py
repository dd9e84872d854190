"""PATCH bodies applied to plain dicts: JSON patch (RFC 6902), merge patch (RFC 7386), strategic merge.

Owns the patch algorithms only; the API server decides which content types a resource accepts
(custom resources refuse strategic merge with 415) and turns a resourceVersion in the result into a
precondition. Bad patches raise `status.ApiError` (400 malformed, 422 failed `test` or missing path).
Strategic merge knows the merge keys kcover's kinds use: containers, initContainers, volumes, env,
containerStatuses and allocatedResourcesStatus by `name`, ports by `containerPort`, volumeMounts by
`mountPath`, conditions and addresses by `type`, ownerReferences by `uid`, health resources by
`resourceID`; finalizers are a merged set; every other list (taints, tolerations) is replaced whole.
"""

from __future__ import annotations

import copy
from typing import Any

from kcover.sim import status

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "allocatedResourcesStatus": "name",
    "resources": "resourceID",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
}
PRIMITIVE_SETS = frozenset({"finalizers"})


# --- RFC 6902 ---------------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise status.bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _missing(path: str) -> status.ApiError:
    return status.ApiError(status.status(422, "Invalid",
                                         f"the server rejected our request due to an error in our request: "
                                         f"jsonpatch: path {path!r} not found"))


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for tok in tokens[:-1]:
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            raise _missing(path)
    return cur


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise _missing(path)


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise _missing(path)
    else:
        raise _missing(path)
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    parent, last = _parent(doc, tokens, path), tokens[-1] if tokens else ""
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _missing(path)
    return doc


def json_patch(doc: dict[str, Any], ops: Any) -> dict[str, Any]:
    """Apply an RFC 6902 operation list to a copy of `doc`."""
    if not isinstance(ops, list):
        raise status.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    out: Any = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise status.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            out = _add(out, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            out = _remove(out, path)
        elif kind == "replace":
            _get(out, path)
            out = _add(_remove(out, path), path, copy.deepcopy(op.get("value"))) if _pointer(path) else op.get(
                "value")
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(out, op.get("from", "")))
            if kind == "move":
                out = _remove(out, op.get("from", ""))
            out = _add(out, path, value)
        elif kind == "test":
            if _get(out, path) != op.get("value"):
                raise status.ApiError(status.status(422, "Invalid",
                                                    f"the server rejected our request due to an error in our "
                                                    f"request: testing value {path} failed"))
        else:
            raise status.bad_request(f"unexpected kind of JSON patch operation: {kind!r}")
    if not isinstance(out, dict):
        raise status.bad_request("the patch result is not an object")
    return out


# --- RFC 7386 ---------------------------------------------------------------------------------

def merge_patch(doc: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch; returns a new value and leaves both inputs alone."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- strategic merge --------------------------------------------------------------------------

def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items()
                if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


def _merge_list(field: str, orig: list[Any], patch: list[Any]) -> list[Any]:
    if field in PRIMITIVE_SETS:
        return list(orig) + [v for v in patch if v not in orig]
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [_strip_directives(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(v, dict) for v in patch):
        return [_strip_directives(v) for v in patch]
    server_keys = [v.get(key) if isinstance(v, dict) else None for v in orig]
    by_key = {k: copy.deepcopy(v) for k, v in zip(server_keys, orig, strict=True) if k is not None}
    patched: list[Any] = []  # merged items of the patch, in patch order
    touched: set[Any] = set()
    for item in patch:
        if key not in item:
            raise status.bad_request(f"map: {item!r} does not contain declared merge key: {key}")
        touched.add(item[key])
        if item.get("$patch") == "delete":
            continue
        patched.append(_merge_map(by_key[item[key]], item) if item[key] in by_key else _strip_directives(item))
    server_only = [copy.deepcopy(v) for k, v in zip(server_keys, orig, strict=True) if k not in touched]
    return _merge_sorted(server_only, patched, server_keys, key)


def _merge_sorted(left: list[Any], right: list[Any], server_keys: list[Any], key: str) -> list[Any]:
    """apimachinery's mergeSortedSlice: interleave server-only items (left) into the patch's items
    (right), keeping each list's order; a server-only item goes first only when both it and the
    patch item it is compared with were in the live list and it came earlier there."""
    def index(item: Any) -> int:
        k = item.get(key) if isinstance(item, dict) else None
        return server_keys.index(k) if k in server_keys else -1

    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            out.append(left[i])
            i += 1
        elif i >= len(left):
            out.append(right[j])
            j += 1
        else:
            li, ri = index(left[i]), index(right[j])
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


def _merge_map(orig: Any, patch: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip_directives({k: v for k, v in patch.items() if k != "$patch"})
    out = copy.deepcopy(orig) if isinstance(orig, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(out.get(name), list) and isinstance(value, list):
                out[name] = [v for v in out[name] if v not in value]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(key, out[key], value)
        else:
            out[key] = _strip_directives(value)
    return out


def strategic_merge(doc: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply a strategic-merge patch for built-in kinds to a copy of `doc`."""
    if not isinstance(patch, dict):
        raise status.bad_request("strategic merge patch must be a JSON object")
    out = _merge_map(doc, patch)
    if not isinstance(out, dict):
        raise status.bad_request("the patch deletes the whole object")
    return out


def apply(doc: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Dispatch on the (already validated) patch content type."""
    if content_type == JSON_PATCH:
        return json_patch(doc, patch)
    if content_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise status.bad_request("merge patch must be a JSON object")
        result = merge_patch(doc, patch)
        assert isinstance(result, dict)
        return result
    if content_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge(doc, patch)
    raise status.unsupported_media_type(content_type, [JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH])
