"""The disruption controller of the simulated cluster: keeps each PodDisruptionBudget's status current.

Owns what kube-controller-manager's disruption controller writes, so that evictions (`evicting`, the
API server's side) see a processed budget instead of "still being processed": for every budget, the
pods of its namespace its (non-empty) selector matches, not terminal; `expectedPods` their number;
`currentHealthy` those Ready and neither terminating nor recorded in `disruptedPods`;
`desiredHealthy` from `minAvailable` (a count, or a percentage of expectedPods rounded up) or
expectedPods less `maxUnavailable` (a count or a percentage rounded up); `disruptionsAllowed` the
surplus, never below 0; the `DisruptionAllowed` condition (SufficientPods, InsufficientPods);
`observedGeneration`. `disruptedPods` entries go once their pod is gone or terminating, or after two
minutes (the real controller's DeletionTimeout). Simplified: expectedPods counts the matching pods,
where the real controller asks their controllers' scale (the same for pods that run). Writes that
race are retried on the next change; it never raises out of `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
from typing import Any

from kcover.aio import clock as clocks
from kcover.sim import evicting, informing, status
from kcover.sim import store as stores

Obj = dict[str, Any]
PDBS = evicting.PDBS
DELETION_TIMEOUT = dt.timedelta(minutes=2)


def _amount(value: Any, total: int) -> int:
    """An IntOrString count: an int, or "N%" of `total` rounded up."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            return math.ceil(float(value[:-1]) * total / 100)
        except ValueError:
            return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def budget_status(pdb: Obj, pods: list[Obj], now: dt.datetime) -> Obj:
    """The status the disruption controller writes for `pdb` over its namespace's `pods`."""
    spec, old = pdb.get("spec") or {}, pdb.get("status") or {}
    selector = evicting.label_selector(spec.get("selector"))
    matched = [p for p in pods if not selector.empty and selector.matches(p["metadata"].get("labels") or {})
               and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    live = {p["metadata"]["name"]: p for p in matched if not p["metadata"].get("deletionTimestamp")}
    disrupted: dict[str, str] = {}
    for name, at in (old.get("disruptedPods") or {}).items():
        with contextlib.suppress(ValueError):
            if name in live and now - clocks.parse_time(str(at)) < DELETION_TIMEOUT:
                disrupted[name] = str(at)
    expected = len(matched)
    healthy = sum(1 for name, p in live.items() if _ready(p) and name not in disrupted)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _amount(spec["maxUnavailable"], expected))
    else:
        desired = _amount(spec.get("minAvailable", 1), expected)
    allowed = max(0, healthy - desired)
    generation = int((pdb.get("metadata") or {}).get("generation", 1))
    previous: Obj = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), {})
    cond_status, reason = ("True", "SufficientPods") if allowed > 0 else ("False", "InsufficientPods")
    changed = previous.get("status") != cond_status or previous.get("reason") != reason
    condition = {"type": "DisruptionAllowed", "status": cond_status, "reason": reason, "message": "",
                 "observedGeneration": generation,
                 "lastTransitionTime": clocks.rfc3339(now) if changed else previous.get("lastTransitionTime")}
    out: Obj = {"observedGeneration": generation, "disruptionsAllowed": allowed, "currentHealthy": healthy,
                "desiredHealthy": desired, "expectedPods": expected, "conditions": [condition]}
    if disrupted:
        out["disruptedPods"] = disrupted
    return out


class DisruptionController:
    """kube-controller-manager's disruption controller over the simulated cluster's store."""

    def __init__(self, cluster: Any) -> None:
        self.store: stores.Store = cluster.store

    async def run(self, stop: asyncio.Event) -> None:
        async for key, change in informing.follow(self.store, (PDBS, "pods"), stop):
            namespace = str(change.new.namespace)
            if key == PDBS and change.type == "DELETED":
                continue
            for pdb in list(self.store.iter_objects(PDBS)):
                if pdb["metadata"].get("namespace") == namespace:
                    self._sync(pdb)

    def _sync(self, pdb: Obj) -> None:
        meta = pdb["metadata"]
        pods = [p for p in self.store.iter_objects("pods") if p["metadata"].get("namespace") == meta.get("namespace")]
        new = budget_status(pdb, pods, self.store.clock.now())
        if new != (pdb.get("status") or {}):
            pdb["status"] = new
            with contextlib.suppress(status.ApiError):  # changed or gone meanwhile: the next change retries
                self.store.update(PDBS, pdb)
