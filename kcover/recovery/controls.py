"""Operator controls: pausing kcover per scope, and the latched circuit breaker with its reset.

Owns two things a person uses to hold kcover back, both kept in the cluster:

* **Pause.** The annotation `kcover.io/paused: "true"` (the value in any letter case) on the controls
  ConfigMap (`recovery.controls_name` in `recovery.ledger_namespace`: every target), on a Namespace
  (label or annotation), on a workload, on a Pod, or on a Node pauses kcover for that scope. A
  restart is paused when its workload, its namespace, its faulting pod or that pod's node is; a
  cordon, drain or un-cordon when its node is. `refusal()` answers `Paused` with the scope, and the
  executor turns it into a `KcoverRecoverySkipped` Event on the target.
* **The latched breaker** (`recovery.breaker_latch`). When the breaker refuses an action, `trip()`
  writes `kcover.io/breaker: open` (with the reason and the time) on the controls ConfigMap; while it
  is there every restart and cordon is refused (`BreakerLatched`), whoever leads. A person closes it
  with `kcover breaker reset` (`reset()`), or by annotating the ConfigMap
  `kcover.io/breaker-reset=true`, which the leader turns into the same reset on its next read (the
  next action it judges): it takes the annotation off, writes the close time, logs `breaker_reset`
  and leaves a `KcoverBreakerReset` Event on the ConfigMap. The annotation on a breaker that is not
  latched does nothing, and the next latch removes it, so a stale request never closes a later latch. For
  `recovery.breaker_cooldown_seconds` after the reset, restarts and cordons are still refused
  (`BreakerCooldown`).

Reads: one GET of the ConfigMap per action, and one of the Namespace per restart (not cached: a
pause or a reset applies to the very next action). Workloads, Pods and Nodes are read from the
cluster cache. In dry run the latch is kept in memory only (nothing is written) and still refuses.
How it fails: a ConfigMap or Namespace that cannot be read (other than 404) raises `errors.KubeError`
to the executor, which refuses nothing it cannot check: the engine logs and counts the error. A write
that conflicts during a reset through the annotation is read again and judged anew (five tries, then
`errors.KubeError`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kube_client
from kcover.kube import retrying
from kcover.recovery import actions, policy

log = structlog.get_logger()

PAUSED = "kcover.io/paused"
BREAKER = "kcover.io/breaker"
BREAKER_REASON = "kcover.io/breaker-reason"
BREAKER_OPENED_AT = "kcover.io/breaker-opened-at"
BREAKER_CLOSED_AT = "kcover.io/breaker-closed-at"
BREAKER_RESET = "kcover.io/breaker-reset"
RESET_REASON = "KcoverBreakerReset"
OPEN = "open"
SC = actions.SkipCode


def is_true(value: str | None) -> bool:
    return (value or "").lower() == "true"


def paused(pairs: Iterable[tuple[str, str]]) -> bool:
    """The annotation (or label) `kcover.io/paused` says true."""
    return any(k == PAUSED and is_true(v) for k, v in pairs)


@dataclass(frozen=True)
class Latch:
    """The breaker's latched state as the controls ConfigMap holds it."""

    open: bool = False
    reason: str = ""
    opened_at: str = ""
    closed_at: float | None = None
    """Epoch seconds of the last reset, or None."""
    reset_asked: bool = False

    @classmethod
    def of(cls, annotations: dict[str, str]) -> Latch:
        closed = annotations.get(BREAKER_CLOSED_AT, "")
        try:
            closed_at = clock_.parse_time(closed).timestamp() if closed else None
        except ValueError:
            closed_at = None
        return cls(open=annotations.get(BREAKER) == OPEN, reason=annotations.get(BREAKER_REASON, ""),
                   opened_at=annotations.get(BREAKER_OPENED_AT, ""), closed_at=closed_at,
                   reset_asked=is_true(annotations.get(BREAKER_RESET)))


def reset_annotations(annotations: dict[str, Any], now: dt.datetime) -> None:
    """Close the latch in place: the open marks and the reset request go, the close time is written."""
    for key in (BREAKER, BREAKER_REASON, BREAKER_OPENED_AT, BREAKER_RESET):
        annotations.pop(key, None)
    annotations[BREAKER_CLOSED_AT] = clock_.rfc3339(now)


async def reset(kube: kube_client.KubeClient, *, namespace: str, name: str, now: dt.datetime) -> bool:
    """`kcover breaker reset`: close a latched breaker. Returns whether it was open."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    for _ in range(5):
        try:
            cm: dict[str, Any] = await kube.request("GET", path)
        except errors.NotFoundError:
            return False
        meta = cm.setdefault("metadata", {})
        annotations = meta.get("annotations") or {}
        was_open = annotations.get(BREAKER) == OPEN
        reset_annotations(annotations, now)
        meta["annotations"] = annotations
        try:
            await kube.request("PUT", path, body=cm)
        except errors.ConflictError:
            continue
        return was_open
    raise errors.KubeError(f"ConfigMap {namespace}/{name}: still conflicting", status=409)


class Controls:
    """Answers "may kcover act on this now?" and latches the breaker. One per controller."""

    def __init__(self, kube: kube_client.KubeClient, snapshot: policy.ClusterSnapshot, *,
                 recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock,
                 is_leader: Callable[[], bool], fence: retrying.Fence | None = None,
                 emit: Callable[..., Awaitable[None]] | None = None) -> None:
        """`emit`: `executing.Executor.emit`, for the Event of a reset through the annotation."""
        self._kube = kube
        self._emit = emit
        self._snapshot = snapshot
        self._recovery = recovery
        self._clock = clock
        self._is_leader = is_leader
        self._fence = fence
        self._dry_latch: Latch | None = None
        """The latch a dry run would have written."""

    @property
    def _path(self) -> str:
        rs = self._recovery()
        return f"/api/v1/namespaces/{rs.ledger_namespace}/configmaps/{rs.controls_name}"

    async def _controls(self) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = await self._kube.request("GET", self._path)
        except errors.NotFoundError:
            return None
        return got

    async def _namespace_paused(self, namespace: str) -> bool:
        try:
            ns = await self._kube.request("GET", f"/api/v1/namespaces/{namespace}")
        except errors.NotFoundError:
            return False
        meta = ns.get("metadata") or {}
        return paused((meta.get("labels") or {}).items()) or paused((meta.get("annotations") or {}).items())

    def _node_paused(self, name: str) -> bool:
        node = self._snapshot.node(name) if name else None
        return node is not None and paused(node.annotations)

    async def refusal(self, action: actions.Action) -> tuple[actions.SkipCode, str] | None:
        """Why `action` must not be carried out now (pause, latched breaker, its cooldown), or None."""
        if isinstance(action, actions.Skip | actions.RecordOnly):
            return None
        if isinstance(action, actions.RestartWorkload):  # both fresh reads at once: one round trip, not two
            cm, namespace_paused = await asyncio.gather(self._controls(),
                                                        self._namespace_paused(action.workload.namespace))
        else:
            cm, namespace_paused = await self._controls(), False
        annotations: dict[str, str] = dict(((cm or {}).get("metadata") or {}).get("annotations") or {})
        if paused(annotations.items()):
            return SC.PAUSED, (f"kcover is paused for every target ({PAUSED}=true on ConfigMap "
                               f"{self._recovery().controls_name})")
        scope = self._paused_scope(action, namespace_paused=namespace_paused)
        if scope:
            return SC.PAUSED, f"kcover is paused for {scope} ({PAUSED}=true)"
        if isinstance(action, actions.UncordonNode | actions.UntaintDevice):
            return None  # returning a node or device to service is never held back by the breaker
        return await self._latched(cm, annotations)

    def _paused_scope(self, action: actions.Action, *, namespace_paused: bool) -> str:
        if isinstance(action, actions.CordonNode | actions.UncordonNode | actions.TaintDevice | actions.UntaintDevice):
            return f"Node {action.node}" if self._node_paused(action.node) else ""
        if not isinstance(action, actions.RestartWorkload):
            return ""
        w = action.workload
        workload = self._snapshot.workload(w.uid)
        if workload is not None and paused(workload.annotations):
            return w.describe()
        pod = self._snapshot.pod(action.pod.uid) if action.pod is not None else None
        if pod is not None and paused(pod.annotations):
            return f"Pod {pod.namespace}/{pod.name}"
        if pod is not None and self._node_paused(pod.node):
            return f"Node {pod.node} (where the fault is)"
        if namespace_paused:
            return f"namespace {w.namespace}"
        return ""

    async def _latched(self, cm: dict[str, Any] | None,
                       annotations: dict[str, str]) -> tuple[actions.SkipCode, str] | None:
        rs = self._recovery()
        latch = Latch.of(annotations)
        if rs.dry_run and self._dry_latch is not None and not latch.open:
            latch = self._dry_latch
        now = self._clock.now()
        if latch.open and latch.reset_asked and cm is not None and not rs.dry_run:
            latch = await self._reset_asked(cm, latch, now)
        if latch.open:
            return SC.BREAKER_LATCHED, (f"breaker latched open since {latch.opened_at or 'earlier'} "
                                        f"({latch.reason}); a person resets it: `kcover breaker reset`, or "
                                        f"annotate ConfigMap {rs.controls_name} {BREAKER_RESET}=true")
        if latch.closed_at is not None and now.timestamp() - latch.closed_at < rs.breaker_cooldown_seconds:
            left = rs.breaker_cooldown_seconds - (now.timestamp() - latch.closed_at)
            return SC.BREAKER_COOLDOWN, (f"the breaker was reset {now.timestamp() - latch.closed_at:.0f}s ago; "
                                         f"kcover waits {left:.0f}s more (recovery.breaker_cooldown_seconds)")
        return None

    async def _reset_asked(self, cm: dict[str, Any], latch: Latch, now: dt.datetime) -> Latch:
        """Carry out a person's `kcover.io/breaker-reset=true`: close the latch, take the request off, say so.

        On a conflict (another write, or another action's reset won) the ConfigMap is read again and
        judged anew. Returns the latch as it now stands."""
        rs = self._recovery()
        for _ in range(5):
            meta = cm.setdefault("metadata", {})
            annotations = meta.get("annotations") or {}
            reset_annotations(annotations, now)
            meta["annotations"] = annotations
            if not self._is_leader():
                raise errors.NotLeaderError("not leading: breaker reset refused")
            try:
                await self._kube.request("PUT", self._path, body=cm, fence=self._fence)
            except errors.ConflictError:
                fresh = await self._controls()
                latch = Latch.of(dict(((fresh or {}).get("metadata") or {}).get("annotations") or {}))
                if fresh is None or not (latch.open and latch.reset_asked):
                    return latch
                cm = fresh
                continue
            log.info("breaker_reset", by="annotation", was=latch.reason, cooldown_seconds=rs.breaker_cooldown_seconds)
            if self._emit is not None:
                await self._emit(actions.ObjectRef("ConfigMap", "v1", rs.controls_name, rs.ledger_namespace),
                                 reason=RESET_REASON, action="Reset",
                                 message=f"the breaker was reset ({BREAKER_RESET}=true on this ConfigMap, now taken "
                                         f"off); it had latched open since {latch.opened_at or 'earlier'} "
                                         f"({latch.reason}). kcover refuses restarts and cordons for "
                                         f"{rs.breaker_cooldown_seconds:g}s more (recovery.breaker_cooldown_seconds)")
            return Latch(closed_at=now.timestamp())
        raise errors.KubeError(f"ConfigMap {rs.controls_name}: still conflicting", status=409)

    async def trip(self, skip: actions.Skip) -> bool:
        """Latch the breaker after it refused `skip` (with `recovery.breaker_latch`). True if it latched now."""
        rs = self._recovery()
        if not rs.breaker_latch or skip.code is not SC.BREAKER_OPEN:
            return False
        now = self._clock.now()
        reason = skip.text[:250]
        if rs.dry_run:
            if self._dry_latch is not None and self._dry_latch.open:
                return False
            self._dry_latch = Latch(open=True, reason=f"dry run: {reason}", opened_at=clock_.rfc3339(now))
            return True
        for _ in range(5):
            cm = await self._controls()
            creating = cm is None
            if cm is None:
                cm = {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": rs.controls_name, "namespace": rs.ledger_namespace}}
            meta = cm.setdefault("metadata", {})
            annotations = meta.get("annotations") or {}
            if annotations.get(BREAKER) == OPEN:
                return False
            annotations.update({BREAKER: OPEN, BREAKER_REASON: reason, BREAKER_OPENED_AT: clock_.rfc3339(now)})
            annotations.pop(BREAKER_RESET, None)
            meta["annotations"] = annotations
            if not self._is_leader():
                raise errors.NotLeaderError("not leading: breaker latch refused")
            try:
                if creating:
                    await self._kube.request("POST", f"/api/v1/namespaces/{rs.ledger_namespace}/configmaps",
                                             body=cm, fence=self._fence)
                else:
                    await self._kube.request("PUT", self._path, body=cm, fence=self._fence)
            except errors.ConflictError:
                continue
            log.warning("breaker_latched", reason=reason)
            return True
        raise errors.KubeError(f"ConfigMap {rs.controls_name}: still conflicting", status=409)
