"""Server-side printing of the simulated API server: `meta.k8s.io/v1` Table answers.

Owns the Table a client (kubectl get) gets for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`:
for a built-in kind with a printer (`printers`), the real server's recorded columns and the printer's
cells; for a custom resource, what kube-apiserver's custom-resource table convertor does when asked
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`: a `Name` column, then the CRD's
`additionalPrinterColumns` (`registry.Column`), each cell read with its simple JSONPath; `date` cells
rendered as a human age (`5m10s`, `3h`, as `duration.HumanDuration`), absent values as null; each row
carrying the object as `PartialObjectMetadata` (`includeObject=Metadata`, the default), the whole
object (`Object`) or null (`None`). Kinds with neither keep plain JSON (kubectl prints NAME and AGE
itself). It holds no state and never raises on a malformed object (the cell is null).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kcover.sim import printers, registry, status

Obj = dict[str, Any]
TABLE_MEDIA = "as=Table"


def wants_table(accept: str, resource: registry.Resource) -> bool:
    """True when the Accept header asks for a meta.k8s.io/v1 Table and the resource has printer columns
    (a custom resource's) or a built-in printer."""
    if not resource.columns and not (resource.builtin and resource.key in printers.PRINTERS):
        return False
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")[1:]}
        if "as=Table" in params and "g=meta.k8s.io" in params and ("v=v1" in params or "v=v1beta1" in params):
            return True
    return False


def _lookup(obj: Any, path: str) -> Any:
    cur = obj
    for key in [k for k in path.split(".") if k]:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


human_duration = printers.human_duration


def _cell(column: registry.Column, value: Any, now: dt.datetime) -> Any:
    if value is None:
        return None
    if column.type == "date":
        try:
            at = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return "<invalid>"
        return human_duration((now - at).total_seconds())
    if column.type == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if column.type == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if column.type == "boolean":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) else str(value)


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata") or {}}


def table(resource: registry.Resource, objects: list[Obj], *, include: str, now: dt.datetime,
          list_meta: Obj | None = None) -> Obj:
    """The Table of `objects` (one for a get, all for a list), as kube-apiserver renders a custom resource."""
    if include not in ("", "None", "Metadata", "Object"):
        raise status.bad_request(f'includeObject: unsupported value "{include}"')
    if not resource.columns:
        return _builtin_table(resource, objects, include=include, now=now, list_meta=list_meta)
    definitions: list[Obj] = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                               "description": "Name must be unique within a namespace."}]
    definitions += [{"name": c.name, "type": c.type, "format": "", "priority": c.priority,
                     "description": c.description} for c in resource.columns]
    rows = []
    for obj in objects:
        cells = [(obj.get("metadata") or {}).get("name")]
        cells += [_cell(c, _lookup(obj, c.json_path), now) for c in resource.columns]
        row: Obj = {"cells": cells}
        row["object"] = _row_object(obj, include or "Metadata")  # null with includeObject=None, as Go encodes it
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": definitions, "rows": rows}


def _builtin_table(resource: registry.Resource, objects: list[Obj], *, include: str, now: dt.datetime,
                   list_meta: Obj | None) -> Obj:
    """A built-in kind's Table: the recorded column definitions, the printer's (always wide) cells."""
    printer = printers.PRINTERS[resource.key]
    rows = []
    for obj in objects:
        row: Obj = {"cells": printer(obj, now)}
        conditions = printers.pod_conditions(obj) if resource.key == "pods" else None
        if conditions:
            row["conditions"] = conditions
        row["object"] = _row_object(obj, include or "Metadata")  # null with includeObject=None, as Go encodes it
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": printers.recorded_columns()[resource.key], "rows": rows}
