"""Server-side printing of the simulated API server: `meta.k8s.io/v1` Table answers for custom resources.

Owns what kube-apiserver's custom-resource table convertor does when a client (kubectl get) asks
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`: a `Name` column, then the CRD's
`additionalPrinterColumns` (`registry.Column`), each cell read with its simple JSONPath; `date` cells
rendered as a human age (`5m10s`, `3h`, as `duration.HumanDuration`), absent values as null; each row
carrying the object as `PartialObjectMetadata` (`includeObject=Metadata`, the default), the whole
object (`Object`) or nothing (`None`). Built-in kinds keep plain JSON (kubectl prints those itself).
It holds no state and never raises on a malformed object (the cell is null).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kcover.sim import registry, status

Obj = dict[str, Any]
TABLE_MEDIA = "as=Table"


def wants_table(accept: str, resource: registry.Resource) -> bool:
    """True when the Accept header asks for a meta.k8s.io/v1 Table and the resource has printer columns."""
    if not resource.columns:
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


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration`: the largest two units that matter."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = (s % 3600) // 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{hours // 24 // 365}y"


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
    definitions: list[Obj] = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                               "description": "Name must be unique within a namespace."}]
    definitions += [{"name": c.name, "type": c.type, "format": "", "priority": c.priority,
                     "description": c.description} for c in resource.columns]
    rows = []
    for obj in objects:
        cells = [(obj.get("metadata") or {}).get("name")]
        cells += [_cell(c, _lookup(obj, c.json_path), now) for c in resource.columns]
        row: Obj = {"cells": cells}
        embedded = _row_object(obj, include or "Metadata")
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": definitions, "rows": rows}
