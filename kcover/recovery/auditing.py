"""The Kubernetes Events kcover leaves on every object it acts on or refuses to act on.

Owns the shape of one core/v1 Event with `eventTime` (MicroTime, six fractional digits), the
reporting component and instance, and the API server's length limits (reason and action 128,
message 1,024). Pure: the executor writes what this builds.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from kcover import model
from kcover.aio import clock as clock_
from kcover.recovery import actions


def event_body(about: actions.ObjectRef, *, reason: str, action: str, message: str, warning: bool,
               now: dt.datetime, controller: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event on `about`, in its namespace (`default` for cluster-scoped objects)."""
    namespace = about.namespace or "default"
    involved: dict[str, Any] = {"kind": about.kind, "apiVersion": about.api_version, "name": about.name,
                                "uid": about.uid}
    if about.namespace:
        involved["namespace"] = about.namespace
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{about.name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": involved,
        "reason": model.fit(reason, model.NAME_MAX, suffix=""), "action": model.fit(action, model.NAME_MAX, suffix=""),
        "message": model.fit(message, model.MESSAGE_MAX),
        "type": "Warning" if warning else "Normal",
        "eventTime": clock_.micro_time(now),
        "reportingComponent": controller, "reportingInstance": model.fit(instance, model.NAME_MAX, suffix=""),
    }
