"""Field sets of objects, as structured-merge-diff (SMD) computes them for server-side apply, over plain dicts.

Owns the typed view of an object that SMD takes from the served OpenAPI v3 schema (`Schema`: structs,
maps, lists with `x-kubernetes-list-type` atomic / set / map and their `x-kubernetes-list-map-keys`,
atomic maps, untyped values whose shape is deduced: maps granular, lists atomic) and, on it, the
operations of sigs.k8s.io/structured-merge-diff v6 (typed/tofieldset.go, compare.go, merge.go,
remove.go) that server-side apply needs: the field set of an applied configuration (`field_set`), the
Added/Modified/Removed sets between two objects (`compare`), merging an applied configuration into
the live object (`merge`), removing a set of fields (`remove`), and the FieldsV1 encoding of a set
(`to_fields_v1`, `from_fields_v1`). A path is a tuple of path elements: ("f", field name),
("k", ((key field, value), ...)) for an item of an associative list, ("v", value) for a set item,
("i", index) for a list without keys. Functions never mutate their arguments. A value whose shape does
not match its schema is treated by its shape; nothing here raises on user data except
`from_fields_v1` on a malformed FieldsV1 (ValueError).
"""

from __future__ import annotations

import copy
import gzip
import importlib.resources
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

PathElement = tuple[str, Any]
Path = tuple[PathElement, ...]
FieldSet = frozenset[Path]
Obj = dict[str, Any]
_MISSING: Any = object()


@cache
def _documents() -> dict[str, Obj]:
    out: dict[str, Obj] = {}
    folder = importlib.resources.files("kcover.sim").joinpath("recorded/openapi-v3")
    for item in folder.iterdir():
        if item.name.endswith(".json.gz"):
            doc = json.loads(gzip.decompress(item.read_bytes()))
            out.update((doc.get("components") or {}).get("schemas") or {})
    return out


@cache
def _kind_schemas() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in _documents().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            out[(str(gvk.get("group", "")), str(gvk.get("version", "")), str(gvk.get("kind", "")))] = name
    return out


@dataclass(frozen=True)
class Schema:
    """One node of an OpenAPI v3 schema, `$ref`s resolved; `raw` None is an untyped (deduced) value."""

    raw: Any = None

    @staticmethod
    def of(group: str, version: str, kind: str) -> Schema:
        name = _kind_schemas().get((group, version, kind))
        return Schema(_documents()[name] if name else None)

    def _resolved(self) -> Any:
        raw = self.raw
        for _ in range(8):
            if not isinstance(raw, dict):
                return None
            ref = raw.get("$ref") or (len(raw.get("allOf") or []) == 1 and raw["allOf"][0].get("$ref"))
            if not ref:
                return raw
            target = _documents().get(str(ref).rsplit("/", 1)[-1])
            raw = {**target, **{k: v for k, v in raw.items() if k.startswith("x-kubernetes-")}} if target else None
        return None

    def kind(self, value: Any) -> str:
        """"struct", "map", "list" or "scalar": the schema's, or the value's shape where the schema says nothing."""
        raw = self._resolved()
        typ = raw.get("type") if raw else None
        if raw and not raw.get("x-kubernetes-preserve-unknown-fields") and not raw.get("x-kubernetes-int-or-string"):
            if typ == "object" and raw.get("properties"):
                return "struct"
            if typ == "object":
                return "map"
            if typ == "array":
                return "list"
            if typ in ("string", "integer", "number", "boolean"):
                return "scalar"
        if isinstance(value, dict):
            return "map"
        if isinstance(value, list):
            return "list"
        return "scalar"

    def child(self, name: str) -> Schema:
        raw = self._resolved()
        if not raw:
            return Schema()
        props = raw.get("properties") or {}
        if name in props:
            return Schema(props[name])
        extra = raw.get("additionalProperties")
        return Schema(extra if isinstance(extra, dict) else None)

    def has_field(self, name: str) -> bool:
        raw = self._resolved()
        return bool(raw) and name in (raw.get("properties") or {})

    def items(self) -> Schema:
        raw = self._resolved()
        return Schema((raw or {}).get("items"))

    def atomic(self, value: Any) -> bool:
        raw = self._resolved() or {}
        kind = self.kind(value)
        if kind == "list":
            return raw.get("x-kubernetes-list-type", "atomic") == "atomic" or not raw
        if kind in ("map", "struct"):
            return raw.get("x-kubernetes-map-type") == "atomic"
        return True

    def list_keys(self) -> tuple[str, ...] | None:
        """The map keys of an associative list, () for a set, None otherwise."""
        raw = self._resolved() or {}
        if raw.get("x-kubernetes-list-type") == "map":
            return tuple(raw.get("x-kubernetes-list-map-keys") or ())
        if raw.get("x-kubernetes-list-type") == "set":
            return ()
        return None


def _item_element(schema: Schema, item: Any, index: int) -> PathElement:
    keys = schema.list_keys()
    if keys:
        return ("k", tuple((k, item.get(k)) for k in sorted(keys) if isinstance(item, dict) and k in item))
    if keys == ():
        return ("v", json.dumps(item, sort_keys=True, separators=(",", ":")))
    return ("i", index)


def _items(schema: Schema, items: list[Any]) -> Iterator[tuple[PathElement, Any]]:
    for i, item in enumerate(items):
        yield _item_element(schema, item, i), item


# --------------------------------------------------------------------------------------------- field sets

def field_set(value: Any, schema: Schema, path: Path = ()) -> set[Path]:
    """tofieldset.go: every scalar and atomic value, every list item, and every map key that is not a struct
    field (or whose value is null or an empty map)."""
    out: set[Path] = set()
    kind = schema.kind(value)
    if kind == "scalar" or (kind == "list" and schema.atomic(value)):
        out.add(path)
        return out
    if kind == "list":
        if isinstance(value, list):
            element = schema.items()
            for pe, item in _items(schema, value):
                out |= field_set(item, element, (*path, pe))
                out.add((*path, pe))
        return out
    if schema.atomic(value):
        out.add(path)
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            child = (*path, ("f", key))
            out |= field_set(item, schema.child(key), child)
            if item is None or item == {} or not schema.has_field(key):
                out.add(child)
    return out


@dataclass
class Comparison:
    added: set[Path]
    modified: set[Path]
    removed: set[Path]


def compare(lhs: Any, rhs: Any, schema: Schema) -> Comparison:
    """compare.go: the paths added, modified and removed going from `lhs` to `rhs`."""
    result = Comparison(set(), set(), set())
    _compare(lhs, rhs, schema, (), result)
    return result


def _compare(lhs: Any, rhs: Any, schema: Schema, path: Path, c: Comparison) -> None:
    value = rhs if rhs is not _MISSING else lhs
    kind = schema.kind(value)
    both_empty = not (None if lhs is _MISSING else lhs) and not (None if rhs is _MISSING else rhs)
    if kind == "scalar" or schema.atomic(value) or both_empty:  # an empty list or map on both sides is a leaf
        if lhs is _MISSING:
            c.added.add(path)
        elif rhs is _MISSING:
            c.removed.add(path)
        elif lhs != rhs:
            c.modified.add(path)
        return
    if kind == "list":
        element = schema.items()
        left = dict(_items(schema, lhs if isinstance(lhs, list) else []))
        right = dict(_items(schema, rhs if isinstance(rhs, list) else []))
        for pe in [*left, *[p for p in right if p not in left]]:
            _compare(left.get(pe, _MISSING), right.get(pe, _MISSING), element, (*path, pe), c)
    else:
        left_map = lhs if isinstance(lhs, dict) else {}
        right_map = rhs if isinstance(rhs, dict) else {}
        for key in [*left_map, *[k for k in right_map if k not in left_map]]:
            _compare(left_map.get(key, _MISSING), right_map.get(key, _MISSING), schema.child(key),
                     (*path, ("f", key)), c)
    if lhs is _MISSING:
        c.added.add(path)
    elif rhs is _MISSING:
        c.removed.add(path)


# --------------------------------------------------------------------------------------------- merge, remove

def merge(live: Any, applied: Any, schema: Schema) -> Any:
    """merge.go with the applier's rule: the applied value wins at every leaf; granular maps merge by key,
    associative lists and sets by item (live order, new items where the applied order puts them)."""
    if applied is _MISSING:
        return copy.deepcopy(live)
    if live is _MISSING or live is None:
        return copy.deepcopy(applied)
    kind = schema.kind(applied)
    if kind == "scalar" or schema.atomic(applied) or (not applied and not live):
        return copy.deepcopy(applied)
    if kind == "list":
        if not isinstance(live, list) or not isinstance(applied, list):
            return copy.deepcopy(applied)
        return _merge_list(live, applied, schema)
    if not isinstance(live, dict) or not isinstance(applied, dict):
        return copy.deepcopy(applied)
    out = {k: copy.deepcopy(v) for k, v in live.items()}
    for key, value in applied.items():
        out[key] = merge(live.get(key, _MISSING), value, schema.child(key))
    return out


def _merge_list(live: list[Any], applied: list[Any], schema: Schema) -> list[Any]:
    element = schema.items()
    left = list(_items(schema, live))
    right = list(_items(schema, applied))
    left_by, right_by = dict(left), dict(right)
    shared = [pe for pe, _ in right if pe in left_by]
    out: list[Any] = []
    merged: set[PathElement] = set()
    li = ri = 0
    next_shared = shared.pop(0) if shared else None
    while li < len(left) or ri < len(right):
        if li < len(left) and ri < len(right):
            pe = left[li][0]
            if pe == right[ri][0]:
                merged.add(pe)
                out.append(merge(left_by[pe], right_by[pe], element))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if pe in right_by and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < len(left):
            pe = left[li][0]
            if pe not in right_by:
                out.append(copy.deepcopy(left[li][1]))
                li += 1
                continue
            if pe in merged:
                li += 1
        if ri < len(right):
            pe = right[ri][0]
            merged.add(pe)
            out.append(merge(left_by.get(pe, _MISSING), right_by[pe], element))
            ri += 1
            if next_shared is not None and next_shared == pe:
                next_shared = shared.pop(0) if shared else None
    return out


def remove(value: Any, paths: Iterable[Path], schema: Schema) -> Any:
    """remove.go: `value` without the fields (and their subtrees) at `paths`."""
    todo = set(paths)
    if not todo:
        return copy.deepcopy(value)
    out = _remove(value, todo, schema)
    return {} if out is _MISSING else out


def _remove(value: Any, todo: set[Path], schema: Schema) -> Any:
    """`value` less `todo`; a map or list that loses its last entry is itself gone (_MISSING), as SMD leaves
    it null and the server drops it."""
    kind = schema.kind(value)
    if kind == "scalar" or schema.atomic(value) or not value:
        return copy.deepcopy(value)
    if kind == "list" and isinstance(value, list):
        element = schema.items()
        out = []
        for pe, item in _items(schema, value):
            if (pe,) in todo:
                continue
            sub = {p[1:] for p in todo if p[:1] == (pe,)}
            kept = _remove(item, sub, element) if sub else copy.deepcopy(item)
            if kept is not _MISSING:
                out.append(kept)
        return out if out else _MISSING
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            pe = ("f", key)
            if (pe,) in todo:
                continue
            sub = {p[1:] for p in todo if p[:1] == (pe,)}
            kept = _remove(item, sub, schema.child(key)) if sub else copy.deepcopy(item)
            if kept is not _MISSING:
                result[key] = kept
        return result if result else _MISSING
    return copy.deepcopy(value)


# --------------------------------------------------------------------------------------------- FieldsV1

def _element_text(pe: PathElement) -> str:
    kind, value = pe
    if kind == "f":
        return f"f:{value}"
    if kind == "k":
        return "k:" + json.dumps(dict(value), separators=(",", ":"), sort_keys=True)
    if kind == "v":
        return f"v:{value}"
    return f"i:{value}"


def _element_order(pe: PathElement) -> tuple[int, str]:
    return ({"f": 0, "k": 1, "v": 2, "i": 3}[pe[0]], json.dumps(pe[1], sort_keys=True, default=str)
            if pe[0] != "i" else f"{int(pe[1]):012d}")


def to_fields_v1(fields: Iterable[Path]) -> Obj:
    """The FieldsV1 document of a set: nested "f:", "k:", "v:", "i:" keys, "." where the path itself is a member."""
    tree: Obj = {}
    for path in sorted(fields, key=lambda p: [_element_order(pe) for pe in p]):
        node = tree
        for pe in path:
            node = node.setdefault(_element_text(pe), {})
        if path:
            node["."] = {}
    return _order(tree)


def _order(node: Obj) -> Obj:
    out: Obj = {}
    if "." in node and len(node) > 1:
        out["."] = {}
    for key in [k for k in node if k != "."]:
        out[key] = _order(node[key])
    if "." in node and len(node) == 1:
        return {}
    return out


def from_fields_v1(doc: Any, prefix: Path = ()) -> set[Path]:
    """The set a FieldsV1 document encodes; ValueError when it is malformed."""
    if not isinstance(doc, dict):
        raise ValueError("FieldsV1 must be an object")
    out: set[Path] = set()
    if prefix and (not doc or "." in doc):
        out.add(prefix)
    for key, child in doc.items():
        if key == ".":
            continue
        kind, _, text = key.partition(":")
        pe: PathElement
        if kind == "f":
            pe = ("f", text)
        elif kind == "k":
            pe = ("k", tuple(sorted(json.loads(text).items())))
        elif kind == "v":
            pe = ("v", text)
        elif kind == "i":
            pe = ("i", int(text))
        else:
            raise ValueError(f"unknown FieldsV1 element {key!r}")
        out |= from_fields_v1(child, (*prefix, pe))
    return out


def path_text(path: Path) -> str:
    """SMD's Path.String(): `.spec.containers[name="c"].image`, `[=v]`, `[0]`."""
    parts = []
    for kind, value in path:
        if kind == "f":
            parts.append(f".{value}")
        elif kind == "k":
            parts.append("[" + ",".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in value) + "]")
        elif kind == "v":
            parts.append(f"[={value}]")
        else:
            parts.append(f"[{value}]")
    return "".join(parts)
