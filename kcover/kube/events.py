"""The core/v1 Events kcover writes: one body, built once, by the API server's rules.

Owns the shape of every Event kcover posts (the agent's fault reports and detector failures, the
controller's audit Events on what it did or refused, its answers to refused signals, its detector
failures): `eventTime` as a MicroTime (six fractional digits and `Z`), the reporting component and
instance, the namespace rule and the length limits. The API server validates core/v1 Events that carry
`eventTime` so (kube-apiserver 1.36, `ValidateEventCreate`), and this module follows it:

* an Event about a namespaced object lives in that object's namespace (its `involvedObject.namespace`
  must equal the Event's);
* an Event about a cluster-scoped object (a Node) may leave `involvedObject.namespace` empty only in
  `default` or `kube-system`; anywhere else the reference carries the Event's own namespace;
* reason, action and reportingInstance are at most 128 bytes, the message at most 1,024 (Go measures
  bytes: text is cut to them in UTF-8 on a character boundary, `model.fit`).

Pure and typed (`EventBody` is a TypedDict): the callers POST what this builds. It raises `ValueError`
for a body the API server would refuse on its namespace (a namespaced object's Event asked for
elsewhere), so the mistake is the caller's, at once, and not a swallowed 422.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from kcover import model
from kcover.aio import clock as clock_

CLUSTER_EVENT_NAMESPACES = frozenset({"default", "kube-system"})
"""Where the API server accepts an Event about a cluster-scoped object whose reference has no namespace."""
DEFAULT_NAMESPACE = "default"
"""Where an Event about a cluster-scoped object goes when the caller names no namespace."""
REASON_MAX = model.NAME_MAX
"""Bytes of `reason`, `action` and `reportingInstance` the API server accepts."""
MESSAGE_MAX = model.MESSAGE_MAX
"""Bytes of `message` the API server accepts."""
NAME_PREFIX_MAX = 200
"""Characters of the object's name that start an Event's name (a name is at most 253)."""


@dataclass(frozen=True)
class About:
    """What an Event is about (its `involvedObject`); `namespace` empty for a cluster-scoped object."""

    kind: str
    api_version: str
    name: str
    namespace: str = ""
    uid: str = ""

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


class InvolvedObject(TypedDict):
    kind: str
    apiVersion: str
    name: str
    namespace: NotRequired[str]
    uid: NotRequired[str]


class EventMetadata(TypedDict):
    namespace: str
    name: NotRequired[str]
    generateName: NotRequired[str]
    annotations: NotRequired[dict[str, str]]


class EventSource(TypedDict):
    component: str
    host: str


class EventBody(TypedDict):
    apiVersion: Literal["v1"]
    kind: Literal["Event"]
    metadata: EventMetadata
    involvedObject: InvolvedObject
    reason: str
    action: str
    message: str
    type: Literal["Normal", "Warning"]
    eventTime: str
    reportingComponent: str
    reportingInstance: str
    source: NotRequired[EventSource]


def involved(about: About, namespace: str) -> InvolvedObject:
    """`involvedObject` of an Event about `about` that lives in `namespace` (the module docstring's rule)."""
    ref = InvolvedObject(kind=about.kind, apiVersion=about.api_version, name=about.name)
    if about.namespace:
        if about.namespace != namespace:
            raise ValueError(f"an Event about {about.describe()} must live in namespace {about.namespace!r}, "
                             f"not {namespace!r}")
        ref["namespace"] = about.namespace
    elif namespace not in CLUSTER_EVENT_NAMESPACES:
        ref["namespace"] = namespace
    if about.uid:
        ref["uid"] = about.uid
    return ref


def body(about: About, *, namespace: str | None = None, reason: str, action: str, message: str, warning: bool,
         now: dt.datetime, controller: str, instance: str, annotations: Mapping[str, str] | None = None,
         generate_name: str = "", source_host: str = "") -> EventBody:
    """A core/v1 Event about `about`, in `namespace` (default: the object's own, `default` for a
    cluster-scoped one), reported by `controller` (reportingComponent) and `instance`.

    Its name is the object's name and a random suffix, so a retried POST of the same body is an
    AlreadyExists, not a second Event; or, with `generate_name`, the API server's (a prefix). With
    `source_host`, the old-style `source` (component and host) is set too, for readers that look there."""
    where = namespace if namespace is not None else (about.namespace or DEFAULT_NAMESPACE)
    metadata = EventMetadata(namespace=where)
    if generate_name:
        metadata["generateName"] = generate_name
    else:
        metadata["name"] = f"{about.name[:NAME_PREFIX_MAX]}.{uuid.uuid4().hex[:16]}"
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    out = EventBody(apiVersion="v1", kind="Event", metadata=metadata, involvedObject=involved(about, where),
                    reason=model.fit(reason, REASON_MAX, suffix=""), action=model.fit(action, REASON_MAX, suffix=""),
                    message=model.fit(message, MESSAGE_MAX), type="Warning" if warning else "Normal",
                    eventTime=clock_.micro_time(now), reportingComponent=controller,
                    reportingInstance=model.fit(instance, REASON_MAX, suffix=""))
    if source_host:
        out["source"] = EventSource(component=controller, host=source_host)
    return out


def collection(namespace: str) -> str:
    """The path Events of `namespace` are created at."""
    return f"/api/v1/namespaces/{namespace}/events"


def path_of(event: EventBody) -> str:
    """Where `event` is POSTed: its own namespace's collection."""
    return collection(event["metadata"]["namespace"])
