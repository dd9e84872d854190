"""Operator controls: a pause at any scope, and a person's request to reset the latched breaker.

Owns two things a person uses to hold kcover back, both read from the watched cache (no request per
action), and the rule for each:

* **Pause.** `kcover.io/paused: "true"` (any letter case) on the controls ConfigMap
  (`recovery.controls_name` in `recovery.ledger_namespace`: every target), on a Namespace (label or
  annotation), a workload, a Pod, or a Node. A restart is paused when its workload, its namespace, its
  faulting pod or that pod's node is; a node's cordon, taint or return when that node is. `paused_scope`
  names the scope; the plan holds the restart (`steps.Hold`) or refuses the node step (`Paused`).
* **Breaker reset.** `kcover.io/breaker-reset` on the controls ConfigMap (any value but empty or `false`;
  `kcover breaker reset` writes the time) asks the leader to close a latched breaker. A request is acted
  on once (the ledger's breaker entry remembers the value it acted on) and only while the breaker is
  latched: on a closed breaker it changes nothing, and `kcover breaker reset` says so without writing.

Pure, but for `request_reset`, the CLI's write of the annotation. The breaker's state itself is the
ledger's (`ledgerentries.Breaker`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Protocol

from kcover import errors
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.kube import projections as proj
from kcover.recovery import ledgerentries

PAUSED = "kcover.io/paused"
BREAKER_RESET = "kcover.io/breaker-reset"
RESET_REASON = "KcoverBreakerReset"


class View(Protocol):
    """The cache reads the controls need (`caching.ClusterCache` provides them)."""

    def controls(self) -> proj.ConfigMap | None: ...

    def namespace(self, name: str) -> proj.Namespace | None: ...

    def workload(self, uid: str) -> proj.Workload | None: ...

    def pod(self, uid: str) -> proj.Pod | None: ...

    def node(self, name: str) -> proj.Node | None: ...


def is_true(value: str | None) -> bool:
    return (value or "").lower() == "true"


def paused(pairs: Iterable[tuple[str, str]]) -> bool:
    """The annotation (or label) `kcover.io/paused` says true."""
    return any(k == PAUSED and is_true(v) for k, v in pairs)


def globally_paused(view: View) -> bool:
    cm = view.controls()
    return cm is not None and paused(cm.annotations)


def paused_scope(view: View, *, workload_uid: str = "", namespace: str = "", pod_uid: str = "",
                 node: str = "") -> str:
    """The scope that pauses a step about these objects ("" when none does)."""
    if globally_paused(view):
        return f"every target ({PAUSED}=true on the controls ConfigMap)"
    if workload_uid:
        w = view.workload(workload_uid)
        if w is not None and paused(w.annotations):
            return f"{w.kind} {w.namespace}/{w.name}"
    pod = view.pod(pod_uid) if pod_uid else None
    if pod is not None and paused(pod.annotations):
        return f"Pod {pod.namespace}/{pod.name}"
    where = node or (pod.node if pod is not None else "")
    n = view.node(where) if where else None
    if n is not None and paused(n.annotations):
        return f"Node {where}" + (" (where the fault is)" if pod is not None else "")
    ns = view.namespace(namespace) if namespace else None
    if ns is not None and (paused(ns.labels) or paused(ns.annotations)):
        return f"namespace {namespace}"
    return ""


def reset_request(view: View, breaker: ledgerentries.Breaker) -> str:
    """The reset request the leader should act on now ("" for none): a new value while latched."""
    cm = view.controls()
    if cm is None:
        return ""
    value = proj.get(cm.annotations, BREAKER_RESET)
    if not value or value.lower() == "false" or value == breaker.reset_request:
        return ""
    return value if breaker.latched else ""


def describe(breaker: ledgerentries.Breaker, *, now: float, cooldown_seconds: float) -> str:
    """One line for people: open since when and why, cooling down, or closed."""
    if breaker.latched and breaker.opened_at is not None:
        return (f"latched open since {clock_.rfc3339(dt.datetime.fromtimestamp(breaker.opened_at, dt.UTC))}: "
                f"{breaker.reason}")
    if breaker.closed_at is not None and now - breaker.closed_at < cooldown_seconds:
        return f"reset {now - breaker.closed_at:.0f}s ago; cooling down for {cooldown_seconds - (now - breaker.closed_at):.0f}s"
    return "closed"


async def request_reset(gw: gateway.Gateway, *, namespace: str, name: str, now: dt.datetime) -> str:
    """`kcover breaker reset`'s write: the reset annotation (the time) on the controls ConfigMap, created if
    missing. Returns the value written. The caller checks first that the breaker is latched."""
    value = clock_.rfc3339(now)
    for _ in range(5):
        cm = await gw.get_config_map(namespace, name)
        try:
            if cm is None:
                await gw.create_config_map({"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": name, "namespace": namespace,
                                                         "annotations": {BREAKER_RESET: value}}})
            else:
                meta = cm.setdefault("metadata", {})
                meta["annotations"] = {**(meta.get("annotations") or {}), BREAKER_RESET: value}
                await gw.replace_config_map(cm)
        except errors.ConflictError:
            continue
        return value
    raise errors.KubeError(f"ConfigMap {namespace}/{name}: still conflicting", status=409)


def scopes_paused(view: View, namespaces: Sequence[str]) -> list[str]:
    """For people (`kcover status`): the global pause and the paused namespaces among `namespaces`."""
    out = ["every target"] if globally_paused(view) else []
    for name in namespaces:
        ns = view.namespace(name)
        if ns is not None and (paused(ns.labels) or paused(ns.annotations)):
            out.append(f"namespace {name}")
    return out
