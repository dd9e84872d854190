"""Recovery resources: the durable, kubectl-visible record of what kcover did, written off the critical path.

Owns the `kcover.io/v1alpha1` kind `Recovery` (plural `recoveries`, short name `krec`): one object per
action kcover took (a restart, a cordon, an un-cordon) and per audited refusal. The spec says what
happened and why, and never changes: the fault (detector, reason, message, the typed fault identity
and the source's recommended action), the target, and the decision (action, refusal code, leader).
The status follows the recovery: `phase` (Acting, Verifying, Recovered, Stalled, Failed, Refused),
`detectedAt`, `actedAt`, `recoveredAt`, `mttrSeconds`, `cause` and `message`.

Where they live: a workload's recoveries in the workload's namespace (a tenant who may read its own
namespace reads its own history), a node's in the release namespace (`recovery.ledger_namespace`),
since a namespaced kind cannot hold cluster-scoped objects and a node is the operator's business. The
name is derived from the target and the fault (`recoveries.name_for`), so a retried write, a resumed restart
and its verification all land on the same object. Does not own the kind's names, phases, a step's target,
decision and identity (`recoveries`).

`Records` is the coordinator hook that notes each outcome (a held restart is `Held`: pending, with what
it waits for). A dry run writes its Recoveries too, their decision marked `dryRun: true`. It decides
nothing. `Recorder.note()` is synchronous and never waits: it merges the change into a
bounded queue, keyed by object, that `Recorder.run()` drains in its own task: a new Recovery is created
with its status in the same write, and later phases merge-patch the object (the chart's CRD has no status
subresource: a Recovery is a record only kcover writes, so an action costs one write, not a create and a
`/status` patch). Where the served kind has the subresource (a CRD installed another way; asked of API
discovery once per retention pass), the create drops a status, so it is a create, then a merge-patch of
`/status`, as before. A write that keeps failing is retried `WRITE_ATTEMPTS` times and
then dropped; every drop (queue full, API errors, lost leadership) is logged and counted in
`kcover_recovery_records_failed_total{reason}`, so nothing is lost silently. Retention: every
`records.prune_interval_seconds` the leader lists its recoveries and deletes those older than
`records.retention_age_seconds` and, per target, all but the newest `records.retention_per_target`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from kcover import errors, model, settings
from kcover.aio import clock as clock_
from kcover.kube import gateway
from kcover.recovery import ledgerentries, recoveries
from kcover.recovery import steps as st

log = structlog.get_logger()

WRITE_ATTEMPTS = 5
"""Tries of one record before it is dropped (each already retried by the client on 429/5xx)."""
RETRY_DELAY_SECONDS = 1.0
STOP_POLL_SECONDS = 0.5



@dataclass
class _Write:
    namespace: str
    name: str
    body: dict[str, Any]
    """The object to create (spec, labels), if it may not exist yet."""
    status: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    created: bool = False


class RecordMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter("kcover_recovery_records_written", "Recovery resource writes that succeeded "
                               "(creates and status updates).", registry=registry)
        self.failed = Counter("kcover_recovery_records_failed", "Recovery resource changes dropped, by reason "
                              "(queue_full, api_error, not_leader, not_served: the Recovery kind is not served, "
                              "its CRD missing).", ["reason"], registry=registry)
        self.queued = Gauge("kcover_recovery_records_queued", "Recovery resource changes waiting to be written.",
                            registry=registry)
        self.pruned = Counter("kcover_recovery_records_pruned", "Recovery resources deleted by retention.",
                              registry=registry)
        for reason in ("queue_full", "api_error", "not_leader", "not_served"):
            self.failed.labels(reason=reason)


class Recorder:
    """Notes recoveries without waiting (`note`, `phase`) and writes them in its own task (`run`)."""

    def __init__(self, gw: gateway.Gateway, metrics: RecordMetrics, *,
                 recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock, identity: str,
                 is_leader: Callable[[], bool]) -> None:
        self._gw = gw
        self.metrics = metrics
        self._recovery = recovery
        self._clock = clock
        self.identity = identity
        self._is_leader = is_leader
        self._queue: collections.OrderedDict[tuple[str, str], _Write] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._by_key: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        """Restart unit's ledger key -> its latest restart's Recovery (namespace, name), for the verifier."""
        self._last_prune = float("-inf")
        self._subresource: bool | None = None
        """Whether the served Recovery kind has a status subresource (None: ask before the next write). Without
        one (the chart's CRD), a Recovery's first status goes in its create: one write per recovery, not two."""
        self.unserved = ""
        """Why Recovery resources cannot be written now (their kind is not served: the CRD is missing), or ""
        once one was written again. Recovery goes on meanwhile: the ledger, not the records, is its memory."""

    @property
    def enabled(self) -> bool:
        return self._recovery().records.enabled

    # ------------------------------------------------------------------------------------------ noting

    def note(self, step: st.Step, phase: recoveries.Phase, *, cause: str = "", message: str = "",
             acted: bool = True) -> tuple[str, str] | None:
        """Queue the Recovery of `step` in `phase`; returns its (namespace, name), or None if none is kept."""
        rs = self._recovery()
        target = recoveries.target_of(step)
        if not rs.records.enabled or target is None:
            return None
        namespace = target.namespace if target.kind != "Node" and target.namespace else rs.ledger_namespace
        name = recoveries.name_for(f"{target.kind}-{target.name}", *recoveries.identity_of(step))
        now = self._clock.now()
        source = st.cause_of(step)
        spec: dict[str, Any] = {"target": target.spec(),
                                "decision": {"action": recoveries.decision(step), "leader": self.identity}}
        if isinstance(step, st.RecordOnly):
            spec["decision"]["recordOnly"] = model.fit(step.why, 256)
            step = step.step
        if isinstance(step, st.Restart | st.Cordon):
            spec["decision"]["blame"] = step.blame.value
        if isinstance(step, st.RequestValidation):
            spec["decision"]["text"] = model.fit(step.evidence, 512)
        if isinstance(step, st.Refuse):
            spec["decision"]["code"] = step.code.value
            spec["decision"]["text"] = model.fit(step.text, 512)
        restart = step.restart if isinstance(step, st.Hold | st.Resume) else step
        if isinstance(restart, st.Restart):
            spec["decision"]["selector"] = restart.selector.render()
            spec["decision"]["ledgerKey"] = restart.unit_key
            spec["decision"]["removal"] = restart.removal.value
        if isinstance(step, st.Cordon):
            spec["decision"]["text"] = model.fit(step.reason, 512)
        if source is not None:
            spec["fault"] = recoveries.fault_spec(source)
        labels = {**recoveries.MANAGED,
                  recoveries.TARGET_LABEL: recoveries.target_hash(target.kind, target.namespace, target.name)}
        body = {"apiVersion": recoveries.API_VERSION, "kind": recoveries.KIND,
                "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}
        status: dict[str, Any] = {"phase": phase.value}
        if source is not None:
            status["detectedAt"] = recoveries.stamp(source.observed_at)
        if acted and phase not in (recoveries.Phase.REFUSED, recoveries.Phase.HELD):
            status["actedAt"] = recoveries.stamp(now)
        if cause:
            status["cause"] = cause
        if message:
            status["message"] = model.fit(message, 1024)
        if phase is recoveries.Phase.RECOVERED:
            status["recoveredAt"] = recoveries.stamp(now)
        self._put(namespace, name, body, status)
        key = recoveries.unit_key(step)
        if key:
            self._by_key.pop(key, None)
            self._by_key[key] = (namespace, name)
            while len(self._by_key) > rs.records.queue_size:
                self._by_key.popitem(last=False)
        return namespace, name

    def phase(self, key: str, phase: recoveries.Phase, *, at: float, cause: str = "", message: str = "",
              mttr_seconds: float | None = None, known: tuple[str, str] | None = None) -> bool:
        """Move the latest restart of ledger key `key` to `phase`; False when this leader did not record it
        and `known` does not name it ((namespace, name) of a Recovery another leader wrote: only its status
        is patched, and nothing is kept if it is gone)."""
        ref = self._by_key.get(key) or known
        if ref is None or not self.enabled:
            return False
        status: dict[str, Any] = {"phase": phase.value}
        if phase is recoveries.Phase.RECOVERED:
            status["recoveredAt"] = recoveries.stamp(at)
        if mttr_seconds is not None:
            status["mttrSeconds"] = round(mttr_seconds, 3)
        if cause:
            status["cause"] = cause
        if message:
            status["message"] = model.fit(message, 1024)
        self._put(ref[0], ref[1], None, status)
        return True

    def _put(self, namespace: str, name: str, body: dict[str, Any] | None, status: dict[str, Any]) -> None:
        key = (namespace, name)
        write = self._queue.get(key)
        if write is None:
            if len(self._queue) >= self._recovery().records.queue_size:
                self._drop("queue_full", namespace, name)
                return
            write = self._queue[key] = _Write(namespace, name, body or {}, created=body is None)
        elif body is not None and not write.body:
            write.body, write.created = body, False
        write.status.update(status)
        self.metrics.queued.set(len(self._queue))
        self._wake.set()

    def _drop(self, reason: str, namespace: str, name: str, error: str = "") -> None:
        self.metrics.failed.labels(reason=reason).inc()
        # a replica that lost the Lease has a successor that records its own: worth a warning, not an error
        emit = log.warning if reason == "not_leader" else log.error
        emit("recovery_record_dropped", reason=reason, namespace=namespace, name=name, error=error)

    # ------------------------------------------------------------------------------------------ writing

    async def run(self, stop: asyncio.Event) -> None:
        """Write what was noted until `stop`, then what is left (while leading); prune while leading."""
        while not stop.is_set():
            if not self._queue:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # `stop` is looked at twice a second
                    await asyncio.wait_for(self._wake.wait(), STOP_POLL_SECONDS)
            await self.flush()
            await self._maybe_prune()
        await self.flush()

    async def flush(self) -> None:
        """Write every queued change once; a failed one goes back to the queue until its attempts run out."""
        retry: list[_Write] = []
        while self._queue:
            _, write = self._queue.popitem(last=False)
            self.metrics.queued.set(len(self._queue))
            try:
                await self._write(write)
            except errors.NotLeaderError as exc:
                self._drop("not_leader", write.namespace, write.name, str(exc))
            except errors.KubeError as exc:
                write.attempts += 1
                if write.attempts >= WRITE_ATTEMPTS:
                    self._drop("api_error", write.namespace, write.name, str(exc))
                else:
                    log.warning("recovery_record_retry", name=write.name, attempt=write.attempts, error=str(exc))
                    retry.append(write)
        for write in retry:
            key = (write.namespace, write.name)
            newer = self._queue.pop(key, None)
            if newer is not None:  # changes noted meanwhile go on top of the failed ones
                write.status.update(newer.status)
            self._queue[key] = write
        self.metrics.queued.set(len(self._queue))
        if retry:
            await asyncio.sleep(RETRY_DELAY_SECONDS)

    async def _write(self, write: _Write) -> None:
        if not self._is_leader():
            raise errors.NotLeaderError("not leading: Recovery not written")
        if self._subresource is None:
            try:
                self._subresource = await self._gw.recovery_status_subresource()
            except errors.NotFoundError as exc:
                self._unserved(write, exc)
                return
        with_status = not write.created and not self._subresource and bool(write.status)
        if not write.created:
            try:
                body = {**write.body, "status": dict(write.status)} if with_status else write.body
                await self._gw.create_recovery(body)  # type: ignore[arg-type]
                self.metrics.written.inc()
                if self.unserved:
                    log.info("recovery_records_available")
                    self.unserved = ""
            except errors.ConflictError:
                with_status = False  # AlreadyExists: an earlier write (or a resumed restart's) made it
            except errors.NotFoundError as exc:
                if not _kind_unserved(exc):
                    raise
                self._unserved(write, exc)
                return  # not retried: the next change tries again, and says when it is served again
            write.created = True
        if write.status and not with_status:
            try:
                await self._gw.patch_recovery_status(write.namespace, write.name, write.status,
                                                     subresource=bool(self._subresource))
            except errors.NotFoundError:
                self._subresource = None  # or the kind changed under it (a CRD replaced): asked again
                if not write.body:
                    return  # pruned meanwhile, and this leader never had its spec: nothing to keep
                write.created = False
                raise
            self.metrics.written.inc()

    def _unserved(self, write: _Write, exc: errors.NotFoundError) -> None:
        self._subresource = None
        if not self.unserved:
            log.error("recovery_records_unavailable", error=str(exc)[:300])
        self.unserved = (f"Recovery resources (kcover.io/v1alpha1) are not served: is the Recovery CRD "
                         f"installed? ({str(exc)[:200]})")
        self._drop("not_served", write.namespace, write.name, str(exc))

    # ------------------------------------------------------------------------------------------ retention

    async def _maybe_prune(self) -> None:
        rs = self._recovery()
        now = self._clock.monotonic()
        if now - self._last_prune < rs.records.prune_interval_seconds or not self._is_leader():
            return
        self._last_prune = now
        try:
            # asked in each pass, so a CRD replaced meanwhile (helm upgrade) is seen within one, and here, on
            # the leader's first pass, so its first fault's write does not cost the question
            self._subresource = await self._gw.recovery_status_subresource()
        except errors.KubeError as exc:
            self._subresource = None  # the next write asks again
            log.info("recovery_records_discovery_failed", error=str(exc)[:300])
        try:
            await self.prune()
        except errors.NotLeaderError as exc:
            # the term ended during the pass (a Lease lost to a slow or restarting API server): the next
            # leader prunes; raising here ended the controller's task group, and the replica with it
            log.info("recovery_records_prune_stopped", reason=str(exc))
        except errors.KubeError as exc:
            log.warning("recovery_records_prune_failed", error=str(exc))

    async def prune(self) -> int:
        """Delete recoveries past the age limit, and per target all but the newest `retention_per_target`."""
        rec = self._recovery().records
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page, token = await self._gw.list_recoveries(limit=500, continue_token=token)
            items += [dict(i) for i in page
                      if (i.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "kcover"]
            if not token:
                break
        doomed = retained(items, now=self._clock.now(), max_age_seconds=rec.retention_age_seconds,
                          per_target=rec.retention_per_target)
        for namespace, name in doomed:
            if not self._is_leader():
                raise errors.NotLeaderError("not leading: retention stopped")
            await self._gw.delete_recovery(namespace, name)
            self.metrics.pruned.inc()
        if doomed:
            log.info("recovery_records_pruned", deleted=len(doomed), kept=len(items) - len(doomed))
        return len(doomed)


def retained(items: list[dict[str, Any]], *, now: dt.datetime, max_age_seconds: float,
             per_target: int) -> list[tuple[str, str]]:
    """(namespace, name) of the recoveries retention deletes: too old, or past the newest `per_target` of a target."""
    doomed: list[tuple[str, str]] = []
    groups: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    for item in items:
        meta = item.get("metadata") or {}
        created = str(meta.get("creationTimestamp") or "")
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        try:
            age = (now - dt.datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
        except ValueError:
            age = 0.0
        if age > max_age_seconds:
            doomed.append(ref)
            continue
        target = (meta.get("labels") or {}).get(recoveries.TARGET_LABEL) or f"{ref[0]}/{ref[1]}"
        groups[target].append((created, ref[0], ref[1]))
    for members in groups.values():
        members.sort(reverse=True)
        doomed += [(ns, name) for _, ns, name in members[per_target:]]
    return doomed


def _kind_unserved(exc: errors.NotFoundError) -> bool:
    """A 404 on a Recovery's create that says its kind is not served, not that the namespace is missing."""
    body = exc.body if isinstance(exc.body, dict) else {}
    details = body.get("details") or {}
    return str(details.get("kind") or "") not in ("namespaces",)


_JUDGED = {ledgerentries.Verdict.HEALTHY: (recoveries.Phase.RECOVERED, "ValidatedHealthy"),
           ledgerentries.Verdict.FAULTY: (recoveries.Phase.RECOVERED, "ValidationFailed"),
           ledgerentries.Verdict.UNVALIDATED: (recoveries.Phase.REFUSED, "NotValidated")}
"""A suspect node's Recovery after its verdict: validated healthy (left schedulable), failed (the cordon has a
Recovery of its own), or not validated (left schedulable)."""


class Records:
    """The coordinator hook noting every outcome's Recovery (`Recorder.note`)."""

    def __init__(self, recorder: Recorder, *, verifying: Callable[[], bool]) -> None:
        self.recorder = recorder
        self._verifying = verifying

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        note = self.recorder.note
        if isinstance(step, st.RecordOnly) and recoveries.target_of(step) is not None:
            note(step, recoveries.Phase.RECORDED, cause="RecordOnly", message=step.why, acted=False)
            return []
        if isinstance(step, st.RequestValidation) and step.purpose is st.Purpose.SUSPECT \
                and isinstance(outcome, st.Done) and not outcome.noop:
            note(step, recoveries.Phase.VALIDATING, message=f"suspect: {step.evidence}; {outcome.detail}",
                 acted=False)
            return []
        if isinstance(step, st.Judge):
            phase, cause = _JUDGED[step.verdict]
            note(step, phase, cause=cause, message=step.text)
            return []
        if isinstance(step, st.Emit | st.CallPerson | st.Drain | st.RequestRemediation | st.LatchBreaker
                      | st.ResetBreaker | st.RequestValidation | st.Report | st.RecordOnly):
            return []
        if isinstance(outcome, st.Held):
            until = clock_.rfc3339(dt.datetime.fromtimestamp(outcome.until, dt.UTC))
            also = ""
            if outcome.joined is not None and isinstance(step, st.Hold):
                # one held restart covers both faults: its Recovery (the first fault's) says so, and follows it
                also = f"; also for {step.cause.reason} from {step.cause.detector} (fault {step.cause.id})"
                step = dataclasses.replace(step, restart=dataclasses.replace(step.restart, cause=outcome.joined))
            note(step, recoveries.Phase.HELD, cause=outcome.code.value,
                 message=f"{outcome.text}; held until {until}{also}", acted=False)
        elif isinstance(outcome, st.Refused):
            if outcome.code is st.Code.INTENT_REFUSED or (outcome.audit and not (isinstance(step, st.Refuse) and not step.audit)):
                note(step, recoveries.Phase.REFUSED, cause=outcome.code.value, message=outcome.text, acted=False)
        elif isinstance(outcome, st.Failed):
            if isinstance(step, st.Resume):
                note(step, recoveries.Phase.FAILED, cause="DeleteFailed", message=outcome.error)
            elif isinstance(step, st.Restart):
                note(step, recoveries.Phase.ACTING, cause="DeleteFailed",
                     message=f"taking pods away failed and is retried: {outcome.error}")
        elif not outcome.noop:
            if isinstance(step, st.Restart | st.Resume):
                verified = self._verifying()
                note(step, recoveries.Phase.VERIFYING if verified else recoveries.Phase.RECOVERED,
                     cause="" if verified else "NotVerified",
                     message=f"took {model.counted(outcome.removed, 'pod')} away"
                     + ("" if verified else "; recovery.verify.enabled is off"))
            elif isinstance(step, st.Cordon | st.Uncordon | st.TaintDevice | st.UntaintDevice):
                note(step, recoveries.Phase.RECOVERED, message=f"{recoveries.decision(step)} done")
        return []
