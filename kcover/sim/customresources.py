"""What kube-apiserver's apiextensions handler does to a custom resource write before it reaches storage.

Owns, for resources with a `registry.Resource.schema`: decoding (`decode`: 400 for a body without `kind`
or of another `apiVersion`, then `structural`'s pruning, null pruning, ObjectMeta pruning and
defaulting, in the real server's order; another kind is a 422, as its TypeMeta validation answers), the
paths decoding drops (`unknown_fields`) and what a write's `fieldValidation` makes of them (`field_validation`:
a `Warning` header each, Strict's refusal, or nothing; an unsupported value is refused for every kind), the
causes of a create, a main-resource update or a /status write (`schemacheck`, ratcheted against the
stored object on updates; a /status write is held to the status schema alone, with field paths under
`status`), and the encoding of what is stored (`encoded`: Go prints integral floats as integers).
`strategy` calls it for the status/spec split and adds metadata validation. The 400s are
`status.ApiError`s; everything else is returned as causes for `strategy` to raise as one 422.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from kcover.sim import registry, schemacheck, status, structural

Obj = dict[str, Any]
Cause = schemacheck.Cause
FIELD_VALIDATIONS = ("", "Ignore", "Strict", "Warn")


def _unrecognized(res: registry.Resource, what: str, body: Obj) -> status.ApiError:
    raw = orjson.dumps(body).decode()
    shown = raw if len(raw) <= 30 else raw[:30] + " ..."
    return status.bad_request(f"the object provided is unrecognized (must be of type {res.kind}): Object '{what}' "
                              f"is missing in '{raw}' ({shown})")


def _decodable(res: registry.Resource, body: Obj) -> None:
    """400 for a body the decoder cannot take: no `kind`, or another `apiVersion` (none included)."""
    if not body.get("kind"):
        raise _unrecognized(res, "Kind", body)
    if body.get("apiVersion") != res.api_version:
        raise status.bad_request(f"the API version in the data ({body.get('apiVersion') or ''}) does not match the "
                                 f"expected API version ({res.api_version})")


def decode(res: registry.Resource, body: Obj) -> Obj:
    """`body` as the server decodes it: checked TypeMeta, pruned, nulls dropped, defaulted (a new object)."""
    assert res.schema is not None
    _decodable(res, body)
    if body["kind"] != res.kind:
        name = str((body.get("metadata") or {}).get("name", ""))
        raise status.invalid(str(body["kind"]), res.group, name, [
            ("FieldValueInvalid", "kind", f'Invalid value: {schemacheck.go_quote(str(body["kind"]))}: must be {res.kind}')])
    obj = copy.deepcopy(body)
    structural.prune_metadata(obj)
    structural.prune(obj, res.schema)
    structural.prune_nulls(obj, res.schema)
    structural.default(obj, res.schema)
    return obj


def unknown_fields(res: registry.Resource, body: Obj) -> list[str]:
    """The paths decoding `body` drops (ObjectMeta's unknown fields, then the pruned ones), sorted: what the
    real server names in its `unknown field` warnings (`fieldValidation=Warn`, the default) or refuses
    (`Strict`)."""
    assert res.schema is not None
    _decodable(res, body)
    obj = copy.deepcopy(body)
    dropped = structural.prune_metadata(obj)
    structural.prune(obj, res.schema, unknown=dropped)
    return sorted(dropped)


def field_validation(res: registry.Resource, query: Any, method: str, body: Obj, *, patched: bool) -> dict[str, str]:
    """The `fieldValidation` of a write (`query`'s) applied to `body` (the object to decode: for a patch, the
    patched object): the fields decoding drops are a `Warning` each (Warn, the default), refused (Strict: 400,
    422 for a patch), or nothing (Ignore); the headers to answer with. Kinds without a schema get no warnings."""
    mode = query.get("fieldValidation") or ""
    if mode not in FIELD_VALIDATIONS:
        options = {"POST": "CreateOptions", "PUT": "UpdateOptions"}.get(method, "PatchOptions")
        raise status.invalid(options, "meta.k8s.io", "", [
            ("FieldValueNotSupported", "fieldValidation", f"Unsupported value: {schemacheck.go_quote(mode)}: "
             'supported values: "", "Ignore", "Strict", "Warn"')])
    if res.schema is None or mode == "Ignore":
        return {}
    paths = unknown_fields(res, body)
    if not paths:
        return {}
    if mode == "Strict":
        detail = "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in paths)
        if patched:
            raise status.invalid("", "", "", [("FieldValueInvalid", "patch", "Invalid value: "
                                               f"{schemacheck.go_quote(orjson.dumps(body).decode())}: {detail}")])
        raise status.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: {detail}')
    return {"Warning": ", ".join("299 - " + schemacheck.go_quote(f"unknown field {schemacheck.go_quote(p)}")
                                 for p in paths)}


def create_causes(res: registry.Resource, obj: Obj) -> list[Cause]:
    """Why the server refuses to create `obj` (decoded, status already dropped where it has a subresource)."""
    assert res.schema is not None
    return schemacheck.causes(obj, res.schema)


def update_causes(res: registry.Resource, new: Obj, old: Obj, *, subresource: str) -> list[Cause]:
    """Why the server refuses `new` (decoded, with the status/spec split done) over the stored `old`."""
    assert res.schema is not None
    if subresource != "status":
        return schemacheck.causes(new, res.schema, old=old)
    status_schema = res.schema.properties.get("status")
    if "status" not in new or status_schema is None:
        return []
    return schemacheck.causes(new["status"], status_schema, old=old.get("status", schemacheck.MISSING),
                              field_root="status", rules_on=new, rules_old=old, rules_schema=res.schema)


def encoded(obj: Obj) -> Obj:
    """`obj` as it comes back from the server: integral floats are integers."""
    result: Obj = structural.go_numbers(obj)
    return result
