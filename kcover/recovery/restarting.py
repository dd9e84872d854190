"""Restarts, carried out: the fenced ledger intent, the logs, the pods taken away, and a successor finishing them.

Owns the `Restart` and `Resume` steps' execution. A restart is: `admission.restart` again inside the
ledger write of the unit's entry (its resourceVersion the fence; the intent recorded in the same write)
-> the pods' logs (`save_logs`, optional) -> every member taken away, evicted or deleted as the kind says
(`kinds.Removal`), each with its uid as precondition, at most `recovery.delete_concurrency` deletes or
`recovery.evict_concurrency` evictions at once (so a 2,048-pod job is about 2,048 / 16 or 2,048 / 32 round
trips deep, not 2,048) -> the intent completed (no write: the
unit's next write drops it). A restart therefore costs one ledger write plus one request per pod, and
lists nothing.

`resume_steps()` turns the ledger's pending intents into `Resume` steps (the leader's periodic pass, and
the start of a term); `Restarter.resume()` vets each against the cluster (`vet`: the ledger is data, not
commands), then finishes it (claiming an earlier leader's intent with one fenced write), forgets it when
its pods are already gone, or, past its validity (`recovery.workload_cooldown_seconds`), refunds its
restart time and fails it (`Failed`, which the audit hook reports as `KcoverRecoveryFailed`).

How it fails: an API error while taking pods away is a `Failed` outcome and the intent stays pending
(the resume pass tries again while it is valid); `errors.NotLeaderError` from the gateway's fence
propagates to the coordinator's caller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable, Sequence

import structlog

from kcover import errors, kinds, model, settings
from kcover.aio import clock as clock_
from kcover.kube import gateway, ownership
from kcover.kube import projections as proj
from kcover.recovery import (
    admission,
    judging,
    ledger,
    ledgerentries,
    logsaving,
    planinputs,
    restartunits,
    targets,
)
from kcover.recovery import steps as st
from kcover.recovery.steps import Code

log = structlog.get_logger()


def in_flight(rs: settings.RecoverySettings, removal: kinds.Removal) -> int:
    """Removals of one restart in flight at once, as the settings say for `removal`."""
    return rs.evict_concurrency if removal is kinds.Removal.EVICT else rs.delete_concurrency

RESUMED_DETECTOR = "kcover-ledger"
"""`CollectorEvent.detector` of a cause read back from the ledger: a restart a successor finishes, a suspect's
validation a leader opens again (`engine`)."""

SaveLogs = Callable[[st.WorkloadRef, Sequence[proj.Pod]], Awaitable[str | None]]
"""`save_logs(workload, pods)` returns where the logs went (or None); see `recovery.logsaving`."""


def place_of(step: st.Restart) -> str:
    """Where the restart's fault was, as the ledger records it (`<node>` or `<node>/<device>`)."""
    return "" if step.judged else judging.place_of(step.node, step.cause.fault)


def _intent(step: st.Restart, *, identity: str, epoch: int, now: float) -> ledgerentries.Intent:
    w = step.workload
    uids = list(dict.fromkeys([*([step.pod.uid] if step.pod is not None else []), *(m.uid for m in step.members)]))
    fault = f"{step.cause.reason} from {step.cause.detector} on {step.cause.target.describe()}"
    return ledgerentries.Intent(id=uuid.uuid4().hex[:12], fault=step.cause.id, leader=identity, epoch=epoch, at=now,
                                workload=(w.kind, w.api_version, w.namespace, w.name, w.uid), selector=step.selector.render(),
                                pod=(step.pod.namespace, step.pod.name, step.pod.uid) if step.pod is not None else None,
                                uids=tuple(uids[:ledgerentries.MAX_INTENT_UIDS]), complete=len(uids) <= ledgerentries.MAX_INTENT_UIDS,
                                message=model.fit(f"{step.what} after {fault}: {step.cause.message}", 300), unit=step.unit)


def vet(key: str, intent: ledgerentries.Intent, snapshot: planinputs.Snapshot,
        rs: settings.RecoverySettings) -> st.Restart | str:
    """The restart a pending intent stands for, rebuilt from the cluster as the cache shows it now, or why
    the cluster disagrees with it (then it is dropped: anyone allowed to write LedgerEntries could have
    written it). It must name a workload that exists with the recorded uid, kind, namespace and name, whose
    namespace is allowed, which is opted in, and whose unit `key` has a live pod with the recorded selector.
    The members are the unit's live pods the intent recorded (all of them, up to `ledgerentries.MAX_INTENT_UIDS`;
    past it, also those certainly created before the intent): a pod its controller created since is never
    taken away."""
    kind, api_version, namespace, name, uid = intent.workload
    what = f"{kind or '?'} {namespace or '?'}/{name or '?'} (uid {uid or 'unset'})"
    if not uid or not (key == f"w.{uid}" or key.startswith(f"w.{uid}.g")):
        return f"ledger key {key} does not belong to {what}"
    w = snapshot.workload(uid)
    if w is None:
        return f"{what} is not in the cluster"
    if (w.kind, w.namespace, w.name) != (kind, namespace, name):
        return f"the workload with uid {uid} is {w.kind} {w.namespace}/{w.name}, not {what}"
    if not targets.namespace_allowed(w.namespace, rs):
        return f"namespace {w.namespace} is not acted on (recovery.namespaces_allow/deny)"
    table = kinds.of(w.group, w.kind)
    if table is None:
        return f"{what} is not a kind kcover restarts"
    pods = [p for p in snapshot.pods_of_workload(uid) if not p.deleting]
    pods.sort(key=lambda p: intent.pod is None or p.uid != intent.pod[2])  # the faulting pod first
    opted = False
    ns = snapshot.namespace(w.namespace)
    for pod in pods:
        resolved = ownership.resolve(snapshot, pod)
        if not isinstance(resolved, ownership.Resolved) or resolved.workload.uid != uid:
            continue
        opted = opted or ownership.opted_in(pod, resolved, namespace=ns)
        unit = restartunits.unit_of(resolved, pod)
        if unit.key != key:
            continue
        if not ownership.opted_in(pod, resolved, namespace=ns):
            return f"{what} is not opted in ({proj.OPT_IN_LABEL})"
        if unit.selector.render() != intent.selector:
            return f"the recorded selector {intent.selector!r} is not {what}'s ({unit.selector.render()!r})"
        recorded = set(intent.uids)
        members = tuple(st.PodRef(p.namespace, p.name, p.uid) for p in pods
                        if unit.selector.matches(p.labels) and not p.terminal
                        and (p.uid in recorded or (not intent.complete and _created_before(p, intent.at))))
        cause = model.CollectorEvent(
            id=intent.fault or intent.id, detector=RESUMED_DETECTOR, severity=model.Severity.ERROR,
            reason="RestartIntentPending", message=intent.message,
            target=model.Target(kind=model.TargetKind.WORKLOAD, namespace=namespace, name=name, uid=uid,
                                workload_kind=kind),
            observed_at=dt.datetime.fromtimestamp(intent.at, dt.UTC))
        return st.Restart(workload=st.WorkloadRef(kind, api_version, name, namespace, uid), unit_key=key,
                          unit=intent.unit, selector=unit.selector, members=members, removal=table.removal,
                          pod=st.PodRef(*intent.pod) if intent.pod is not None else None, cause=cause)
    if pods and not opted:
        return f"{what} is not opted in ({proj.OPT_IN_LABEL})"
    return f"{what} has no live pod of the unit {key}"


def _created_before(pod: proj.Pod, at: float) -> bool:
    """The pod was certainly created before `at` (creationTimestamp has whole seconds)."""
    if not pod.created:
        return False
    try:
        return clock_.parse_time(pod.created).timestamp() + 1.0 <= at
    except ValueError:
        return False


def resume_steps(pending: dict[str, ledgerentries.Intent], busy: set[str]) -> list[st.Resume]:
    """One `Resume` per pending intent not being carried out here right now, oldest first."""
    return [st.Resume(key=key, intent=intent) for key, intent in sorted(pending.items(), key=lambda kv: kv[1].at)
            if intent.id not in busy]


class Restarter:
    """Carries out `Restart` and `Resume` steps for one controller."""

    def __init__(self, gw: gateway.Gateway, ledger_: ledger.Ledger, snapshot: planinputs.Snapshot, *,
                 recovery: Callable[[], settings.RecoverySettings], clock: clock_.Clock, identity: str,
                 epoch: Callable[[], int], save_logs: SaveLogs | None = None) -> None:
        self._gw = gw
        self._ledger = ledger_
        self._snapshot = snapshot
        self._recovery = recovery
        self._clock = clock
        self.identity = identity
        self._epoch = epoch
        self._save_logs = save_logs
        self.busy: set[str] = set()
        """Ids of the intents being carried out here now: the resume pass leaves them to the task doing them."""
        self._failures: dict[str, str] = {}
        """Intent id -> why its last attempt here failed (for the KcoverRecoveryFailed Event)."""

    # ------------------------------------------------------------------------------------ restart

    async def restart(self, step: st.Restart) -> st.Outcome:
        rs = self._recovery()
        now = self._clock.now().timestamp()
        intent = _intent(step, identity=self.identity, epoch=self._epoch(), now=now)
        signal, key, place = step.cause.signal, step.unit_key, place_of(step)
        breaker = self._ledger.breaker()
        retention = rs.memory_seconds()

        def record(entry: ledgerentries.Entry, signals: dict[str, float]) -> admission.Refusal | None:
            assert isinstance(entry, ledgerentries.Unit)
            if entry.intent is not None and entry.intent.id == intent.id:
                return None  # an earlier attempt of this very write landed; its answer was lost
            refused = (admission.replayed(signals.get(f"{signal}|{key}") if signal else None, signal, step.what)
                       or admission.restart(entry, what=step.what, rs=rs, now=now, breaker_state=breaker,
                                            load=None))
            if refused is not None:
                return refused
            entry.trim(now - retention)
            entry.record(now, place, step.rank)
            entry.note = model.fit(step.what, 120)
            entry.intent = intent
            entry.held = None
            if signal:
                signals[f"{signal}|{key}"] = now
            return None

        self.busy.add(intent.id)
        try:
            refused = await self._ledger.update(key, record, now=now)
            if refused is not None:
                return st.Refused(step, refused.code, refused.text)
            return await self._carry_out(step, intent, step.members)
        finally:
            self.busy.discard(intent.id)

    async def _carry_out(self, step: st.Restart, intent: ledgerentries.Intent, members: Sequence[st.PodRef]) -> st.Outcome:
        rs = self._recovery()
        where = ""
        if self._save_logs is not None and rs.save_logs.enabled:
            pods = logsaving.chosen([p for p in (self._snapshot.pod(m.uid) for m in members) if p is not None],
                                    rs.save_logs.scope, faulting_pod=step.pod.uid if step.pod else "",
                                    faulting_node=step.node)
            try:
                async with asyncio.timeout(rs.save_logs.timeout_seconds):
                    where = await self._save_logs(step.workload, pods) or ""
            except (Exception, TimeoutError) as exc:  # the hook is foreign code; CancelledError passes
                log.warning("recovery_save_logs_failed", workload=step.what, error=repr(exc))
                if not rs.save_logs.proceed_on_failure:
                    await self._refund(step.unit_key, intent)
                    return st.Refused(step, Code.SAVE_LOGS_FAILED,
                                      f"saving logs of {step.what} failed ({exc!r}); not restarting")
        try:
            removed, held = await self._remove(members, step.removal, step.workload)
        except errors.NotLeaderError:
            raise
        except errors.KubeError as exc:
            why = model.fit(str(exc), 300)
            self._failures[intent.id] = why
            log.warning("restart_attempt_failed", workload=step.what, intent=intent.id, error=why)
            return st.Failed(step, why, recorded=True)
        if held:
            why = f"a PodDisruptionBudget refused the eviction of {held} of {len(members)} pods"
            self._failures[intent.id] = why
            log.warning("restart_attempt_held", workload=step.what, intent=intent.id, held=held, removed=removed)
            return st.Failed(step, why, recorded=True)
        self._failures.pop(intent.id, None)
        self._ledger.complete(step.unit_key, intent.id)
        log.info("job_restarted", workload=step.what, uid=step.workload.uid, removed=removed,
                 removal=step.removal.value, cause=step.cause.id, intent=intent.id)
        return st.Done(step, detail=f"logs saved to {where}" if where else "", removed=removed)

    async def _remove(self, members: Sequence[st.PodRef], removal: kinds.Removal,
                      workload: st.WorkloadRef) -> tuple[int, int]:
        """Take every member away, at most the kind's (or `recovery.evict_concurrency` or `delete_concurrency`, as
        the removal is) at once; (removed, held)."""
        table = kinds.of(workload.api_version.rpartition("/")[0], workload.kind)
        limit = (table.removal_concurrency if table is not None else None) or in_flight(self._recovery(), removal)
        remove = self._gw.evict_pod if removal is kinds.Removal.EVICT else self._gw.delete_pod
        counts = {gateway.Removal.REMOVED: 0, gateway.Removal.GONE: 0, gateway.Removal.HELD: 0}
        todo = iter(members)

        async def worker() -> None:
            for ref in todo:  # shared: each worker takes the next member once its last removal is answered
                counts[await remove(ref.namespace, ref.name, ref.uid)] += 1

        try:
            # `limit` workers, not a task per member: a 1,024-pod job is 16 tasks, taking the members in order
            async with asyncio.TaskGroup() as tg:
                for i in range(min(max(1, limit), len(members))):
                    tg.create_task(worker(), name=f"remove-pods:{workload.namespace}/{workload.name}:{i}")
        except BaseExceptionGroup as group:  # the first failure stands for the others
            raise group.exceptions[0] from None
        return counts[gateway.Removal.REMOVED], counts[gateway.Removal.HELD]

    async def _refund(self, key: str, intent: ledgerentries.Intent) -> bool:
        """Take a restart that did not happen off the unit's budget, with its intent; False if another replica
        changed the intent meanwhile."""
        def refund(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
            assert isinstance(entry, ledgerentries.Unit)
            if entry.intent is None or entry.intent.id != intent.id:
                return "another replica handled it"
            entry.intent = None
            entry.drop(intent.at)
            return None

        return await self._ledger.update(key, refund, now=self._clock.now().timestamp()) is None

    # ------------------------------------------------------------------------------------ resume

    def _live(self, intent: ledgerentries.Intent) -> bool:
        """A pod the intent names is still cached and not terminating: its removals did not (all) happen."""
        for uid in intent.uids:
            pod = self._snapshot.pod(uid)
            if pod is not None and not pod.deleting:
                return True
        return False

    async def resume(self, step: st.Resume) -> st.Outcome:
        rs = self._recovery()
        key, intent = step.key, step.intent
        now = self._clock.now().timestamp()
        self.busy.add(intent.id)
        try:
            live = self._live(intent)
            rebuilt = vet(key, intent, self._snapshot, rs) if live else ""
            if isinstance(rebuilt, str) and rebuilt:
                if not await self._refund(key, intent):
                    return st.Done(step, detail="another replica handled it", noop=True)
                log.warning("restart_intent_refused", key=key, intent=intent.id, leader=intent.leader, problem=rebuilt)
                return st.Refused(step, Code.INTENT_REFUSED, rebuilt)
            if not live:
                self._ledger.complete(key, intent.id)
                return st.Done(step, detail="already carried out: its pods are gone or replaced", noop=True)
            assert isinstance(rebuilt, st.Restart)
            if now - intent.at >= rs.workload_cooldown_seconds:
                why = self._failures.pop(intent.id, "") or "its pods are still running and no attempt succeeded in time"
                if not await self._refund(key, intent):
                    return st.Done(step, detail="another replica finished it", noop=True)
                log.error("restart_failed", workload=rebuilt.what, intent=intent.id, leader=intent.leader,
                          cause=intent.fault, error=why)
                return st.Failed(dataclasses.replace(step, restart=rebuilt), why, recorded=True)
            if (intent.leader, intent.epoch) != (self.identity, self._epoch()):
                claimed = dataclasses.replace(intent, leader=self.identity, epoch=self._epoch())

                def claim(entry: ledgerentries.Entry, signals: dict[str, float]) -> str | None:
                    assert isinstance(entry, ledgerentries.Unit)
                    current = entry.intent
                    if current is None or current.id != intent.id or current.leader != intent.leader:
                        return "another replica took it over"
                    entry.intent = claimed
                    return None

                taken = await self._ledger.update(key, claim, now=now)
                if taken is not None:
                    return st.Done(step, detail=taken, noop=True)
                intent = claimed
                log.warning("restart_intent_resumed", workload=rebuilt.what, intent=intent.id, leader=step.intent.leader,
                            age_seconds=round(now - intent.at, 3), cause=intent.fault)
            outcome = await self._carry_out(rebuilt, intent, rebuilt.members)
            resumed = dataclasses.replace(step, restart=rebuilt)
            if isinstance(outcome, st.Done):
                return st.Done(resumed, detail=outcome.detail, removed=outcome.removed)
            if isinstance(outcome, st.Failed):
                return st.Failed(resumed, outcome.error, recorded=True)
            return outcome
        finally:
            self.busy.discard(intent.id)
