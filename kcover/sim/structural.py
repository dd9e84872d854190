"""Structural schemas of custom resources, and what they make kube-apiserver do to an object it decodes.

Owns `Schema`, a CRD's `openAPIV3Schema` compiled once into frozen nodes (`build`), and the
apiextensions decoding steps, in the real server's order (its `unstructuredSchemaCoercer`, then the
defaulter): `prune` drops every field the schema does not specify (at the root `apiVersion`, `kind` and
`metadata` are kept; under `x-kubernetes-preserve-unknown-fields` unspecified fields stay while the
specified ones are still pruned by their own schema), `prune_nulls` drops nulls the schema does not
allow (not `nullable`, no `default`) from objects, `prune_metadata` keeps only ObjectMeta's fields, and
`default` fills `default:` values in for absent fields and non-nullable nulls. `go_numbers` turns
integral floats into integers, as Go's JSON encoding of a decoded object prints them. What a schema
refuses is `schemacheck`'s.

How it fails: `build` raises `SchemaError` for a keyword this module or `schemacheck` does not carry
out (`pattern`, `minLength`, `oneOf`, list types, a format other than date-time, a CEL rule other than
`self == oldSelf`), so a CRD that relies on one cannot pass the simulated server unchecked.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

Obj = dict[str, Any]

TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
IMMUTABLE_RULE = "self == oldSelf"
"""The one `x-kubernetes-validations` rule carried out: a transition rule (checked on updates only)."""
_ANNOTATIONS = frozenset({"description", "title", "example", "externalDocs"})
_KNOWN = frozenset({"type", "nullable", "x-kubernetes-preserve-unknown-fields", "properties", "additionalProperties",
                    "items", "required", "enum", "default", "format", "maxLength", "maxItems", "maxProperties",
                    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "x-kubernetes-validations"})
_ROOT_META = frozenset({"apiVersion", "kind", "metadata"})
OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields"})
"""metav1.ObjectMeta's JSON fields: a custom resource's metadata keeps these alone."""
_EMPTY: Mapping[str, Schema] = types.MappingProxyType({})


class SchemaError(ValueError):
    """A CRD schema uses something the simulated API server does not carry out (or is not structural)."""


@dataclass(frozen=True, eq=False)
class Schema:
    """One node of a structural schema."""

    type: str = ""
    nullable: bool = False
    preserve_unknown: bool = False
    properties: Mapping[str, Schema] = field(default_factory=lambda: _EMPTY)
    additional: Schema | None = None
    """`additionalProperties` (a map's values)."""
    items: Schema | None = None
    required: tuple[str, ...] = ()
    enum: tuple[Any, ...] | None = None
    default_json: bytes | None = None
    """The `default`, pruned by this node's schema, as JSON (each use gets a fresh copy)."""
    format: str = ""
    max_length: int | None = None
    max_items: int | None = None
    max_properties: int | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    immutable_message: str | None = None
    """The message of an `x-kubernetes-validations` rule `self == oldSelf` on this node."""
    has_rules: bool = field(default=False)
    """This node or one under it has `x-kubernetes-validations` (the server then runs its CEL validator)."""

    @property
    def has_default(self) -> bool:
        return self.default_json is not None

    def default_value(self) -> Any:
        return None if self.default_json is None else orjson.loads(self.default_json)


PRESERVE = Schema(type="object", preserve_unknown=True)
"""`{type: object, x-kubernetes-preserve-unknown-fields: true}`: the test CRDs of the operators' kinds."""


def build(raw: Mapping[str, Any], path: str = "openAPIV3Schema") -> Schema:
    """`raw` (a CRD version's `schema.openAPIV3Schema`) as frozen `Schema` nodes; `SchemaError` for what is
    not carried out."""
    if not isinstance(raw, Mapping):
        raise SchemaError(f"{path}: a schema must be an object")
    unknown = sorted(set(raw) - _KNOWN - _ANNOTATIONS)
    if unknown:
        raise SchemaError(f"{path}: {', '.join(unknown)}: not carried out by the simulated API server")
    kind = str(raw.get("type", ""))
    preserve = bool(raw.get("x-kubernetes-preserve-unknown-fields", False))
    if kind and kind not in TYPES:
        raise SchemaError(f"{path}.type: {kind!r} is not a structural type")
    if not kind and not preserve:
        raise SchemaError(f"{path}.type: required unless x-kubernetes-preserve-unknown-fields is true")
    fmt = str(raw.get("format", ""))
    if fmt and (fmt != "date-time" or kind != "string"):
        raise SchemaError(f"{path}.format: only date-time on strings is carried out, not {fmt!r}")
    properties = {str(k): build(v, f"{path}.properties.{k}") for k, v in (raw.get("properties") or {}).items()}
    extra = raw.get("additionalProperties")
    if extra is not None and not isinstance(extra, Mapping):
        raise SchemaError(f"{path}.additionalProperties: only a schema is carried out")
    if extra is not None and properties:
        raise SchemaError(f"{path}: properties and additionalProperties are mutually exclusive")
    additional = build(extra, f"{path}.additionalProperties") if extra is not None else None
    items = build(raw["items"], f"{path}.items") if "items" in raw else None
    if kind == "array" and items is None:
        raise SchemaError(f"{path}.items: required for an array")
    immutable = _immutable_message(raw.get("x-kubernetes-validations"), path)
    enum = raw.get("enum")
    node = Schema(
        type=kind, nullable=bool(raw.get("nullable", False)), preserve_unknown=preserve,
        properties=types.MappingProxyType(properties), additional=additional, items=items,
        required=tuple(str(r) for r in raw.get("required") or ()),
        enum=None if enum is None else tuple(enum), format=fmt,
        max_length=_int(raw, "maxLength", path), max_items=_int(raw, "maxItems", path),
        max_properties=_int(raw, "maxProperties", path),
        minimum=_number(raw, "minimum", path), maximum=_number(raw, "maximum", path),
        exclusive_minimum=bool(raw.get("exclusiveMinimum", False)),
        exclusive_maximum=bool(raw.get("exclusiveMaximum", False)),
        immutable_message=immutable,
        has_rules=immutable is not None or any(s.has_rules for s in (*properties.values(), additional, items)
                                               if s is not None))
    if "default" not in raw:
        return node
    value = copy.deepcopy(raw["default"])
    prune(value, node, root=False)  # the real server prunes defaults when the CRD is written
    return dataclasses.replace(node, default_json=orjson.dumps(value))


def _int(raw: Mapping[str, Any], key: str, path: str) -> int | None:
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise SchemaError(f"{path}.{key}: must be a non-negative integer")
    return value


def _number(raw: Mapping[str, Any], key: str, path: str) -> float | None:
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise SchemaError(f"{path}.{key}: must be a number")
    return None if value is None else float(value)


def _immutable_message(rules: Any, path: str) -> str | None:
    if rules is None:
        return None
    message = None
    for rule in rules:
        extra = sorted(set(rule) - {"rule", "message"})
        if rule.get("rule") != IMMUTABLE_RULE or extra:
            raise SchemaError(f"{path}.x-kubernetes-validations: only the rule {IMMUTABLE_RULE!r} (with a message) is "
                              f"carried out, not {rule!r}")
        message = str(rule.get("message") or f"failed rule: {IMMUTABLE_RULE}")
    return message


# --- decoding ---------------------------------------------------------------------------------

def prune(x: Any, s: Schema | None, *, root: bool = True, unknown: list[str] | None = None, at: str = "") -> None:
    """Drop, in place, the fields `s` does not specify (apiextensions' pruning algorithm); the path of each
    goes to `unknown` (`spec.a.b`, `spec.items[0].c`: what the real server warns about or refuses)."""
    if s is not None and s.preserve_unknown:
        _keep_unknown(x, s, root, unknown, at)
    elif isinstance(x, dict):
        for k in list(x):
            if root and k in _ROOT_META:
                continue
            sub = None if s is None else s.properties.get(k) or s.additional
            if sub is None:
                del x[k]
                if unknown is not None:
                    unknown.append(_key(at, k))
            else:
                prune(x[k], sub, root=False, unknown=unknown, at=_key(at, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            prune(v, None if s is None else s.items, root=False, unknown=unknown, at=f"{at}[{i}]")


def _key(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _keep_unknown(x: Any, s: Schema, root: bool, unknown: list[str] | None, at: str) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            sub = s.properties.get(k) or s.additional
            if sub is not None and not (root and k in _ROOT_META):
                prune(v, sub, root=False, unknown=unknown, at=_key(at, k))
    elif isinstance(x, list) and s.items is not None:
        for i, v in enumerate(x):  # as the real server does: items under a preserve-unknown node keep theirs
            _keep_unknown(v, s.items, False, unknown, f"{at}[{i}]")


def _sub(s: Schema | None, key: str) -> Schema | None:
    return None if s is None else s.properties.get(key) or s.additional


def prune_nulls(x: Any, s: Schema | None) -> None:
    """Drop, in place, null values of object fields whose schema is neither nullable nor defaulted."""
    if isinstance(x, dict):
        for k in list(x):
            sub = _sub(s, k)
            if x[k] is None and sub is not None and not sub.nullable and not sub.has_default:
                del x[k]
            else:
                prune_nulls(x[k], sub)
    elif isinstance(x, list):
        for v in x:
            prune_nulls(v, None if s is None else s.items)


def default(x: Any, s: Schema | None) -> None:
    """Fill `default:` values in, in place: absent fields, and nulls where the schema is not nullable."""
    if s is None:
        return
    if isinstance(x, dict):
        for k, prop in s.properties.items():
            if prop.has_default and (k not in x or (x[k] is None and not prop.nullable)):
                x[k] = prop.default_value()
        for k in list(x):
            sub = s.properties.get(k)
            if sub is None and s.additional is not None:
                sub = s.additional
                if x[k] is None and not sub.nullable:
                    x[k] = sub.default_value()
            default(x[k], sub)
    elif isinstance(x, list) and s.items is not None:
        for i, v in enumerate(x):
            if v is None and not s.items.nullable:
                x[i] = s.items.default_value()
            default(x[i], s.items)


def prune_metadata(obj: Obj) -> list[str]:
    """Keep only ObjectMeta's fields in `obj["metadata"]` (in place), as decoding into ObjectMeta does; the
    paths of those dropped."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return []
    dropped = [k for k in meta if k not in OBJECT_META_FIELDS]
    for k in dropped:
        del meta[k]
    return [f"metadata.{k}" for k in dropped]


def go_numbers(x: Any) -> Any:
    """`x` with integral floats as integers: Go decodes `3.0` to float64 and encodes it as `3` (its JSON
    encoder prints floats under 1e21 without an exponent)."""
    if isinstance(x, float):
        return int(x) if x.is_integer() and abs(x) < 1e21 else x
    if isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, float | dict | list):
                x[k] = go_numbers(v)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            if isinstance(v, float | dict | list):
                x[i] = go_numbers(v)
    return x
