"""What a write to the simulated cluster keeps of `metadata.managedFields`, as kube-apiserver does.

The real server's field manager decodes the managedFields a request carries and, when they are well
formed (a list of entries with `manager`, `operation` Apply or Update, `fieldsType` FieldsV1 and a
`fieldsV1` object), stores them in place of the live ones: any writer of an object may set them, to
any depth (`deepjson` keeps what is too deep to decode). A request without them, with an empty list,
or with entries it cannot decode keeps the live ones; a list of one empty entry clears them. Unlike
the real server, the simulated one adds no entry of its own for the request's manager. Pure.
"""

from __future__ import annotations

from typing import Any

from kcover.sim import deepjson

Obj = dict[str, Any]
_OPERATIONS = frozenset({"Apply", "Update"})


def _well_formed(entries: Any) -> bool:
    if not isinstance(entries, list) or not entries:
        return False
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("manager", ""), str):
            return False
        if entry.get("operation") not in _OPERATIONS or entry.get("fieldsType") != "FieldsV1":
            return False
        if not isinstance(entry.get("fieldsV1"), dict | deepjson.Raw):
            return False
    return True


def merge(meta: Obj, live: Any) -> None:
    """Set `meta["managedFields"]` to what the write keeps: the request's (in `meta`), else `live`."""
    sent = meta.pop("managedFields", None)
    if sent == [{}]:
        return  # the documented way to clear them
    kept = sent if _well_formed(sent) else live
    if kept:
        meta["managedFields"] = kept
