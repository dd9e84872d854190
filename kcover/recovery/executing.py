"""Executors: carry out planned actions against the API, idempotently, only while leading.

Owns the writes recovery makes and their order. A restart is: preconditions from the cache (the
faulting pod still belongs to the same workload uid) -> ledger record (resourceVersion precondition,
the fencing write) -> preconditions again -> optional log save -> ONE DeleteCollection of the unit's
pods (or, when the labels were not safe, uid-preconditioned deletes of the verified pods) -> an Event.
A cordon is: ledger record -> read the Node -> set `spec.unschedulable`, add kcover's taint(s) and
annotations, never touching other taints -> PUT with the resourceVersion (retried on 409) -> an Event.
An un-cordon reverses only what kcover's annotation says kcover did, and leaves the node unschedulable
when a person took the cordon over (`cordoning.taken_over`).

The ledger record of a restart is a pending intent (`ledger.Intent`: leader, epoch, fault, selector,
faulting pod, pod uids); it is dropped by the next ledger write once the delete succeeded, so a restart
costs three writes (ledger, DeleteCollection, Event) and no LIST. `resume()`, run by a new leader, finishes
the intents an earlier leader recorded within the cooldown but did not carry out: when a recorded pod is
still in the cache (same uid, not terminating) it claims the intent (one fenced ledger write), checks the
preconditions again, deletes and writes the Event (three writes, as the leader would have); when the
pods are gone or replaced it only forgets the intent (no write).

Every write is preceded by `is_leader()`; a replica that lost the Lease raises `errors.NotLeaderError`.
Dry run writes only the audit Events; it honours cooldowns and budgets through the ledger's in-memory
dry-run records, so a repeating fault gives one dry-run Event per cooldown, as the real run would act once. Every action and audited refusal leaves a core/v1 Event on the
object concerned and is counted in `kcover_actions{action,result}`.

Failures: API errors other than the ones handled (404 on pods already gone, 409 on nodes) propagate
as `errors.KubeError` to the engine, which logs and counts them. A failed Event write is logged and
never fails the action it records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from kcover import errors, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import client as kube_client
from kcover.kube import projections as proj
from kcover.kube import retrying
from kcover.recovery import (
    actions,
    adapters,
    auditing,
    cordoning,
    deleting,
    devicetainting,
    ledger,
    policy,
    vetting,
)

log = structlog.get_logger()

REPORTING_CONTROLLER = "kcover.io/controller"
SaveLogs = Callable[[actions.WorkloadRef, Sequence[proj.Pod]], Awaitable[str | None]]
"""`save_logs(workload, pods)` returns where the logs went (or None); see `recovery.logsaving`."""

NODE_WRITE_ATTEMPTS = 5
RESUMED_DETECTOR = "kcover-ledger"
"""`CollectorEvent.detector` of the cause a successor gives a restart it finishes from the ledger."""


class Outcome(enum.StrEnum):
    DONE = "done"
    SKIPPED = "skipped"
    DRY_RUN = "dry_run"


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    action: actions.Action
    detail: str = ""
    deleted: int = 0


class Executor:
    """Carries out actions. One per controller; `settings` may be replaced on reload."""

    def __init__(self, kube: kube_client.KubeClient, snapshot: policy.ClusterSnapshot, ledger_: ledger.Ledger, *,
                 recovery: settings.RecoverySettings, metrics_: metrics.Metrics, clock: clock_.Clock,
                 identity: str, is_leader: Callable[[], bool], save_logs: SaveLogs | None = None,
                 epoch: Callable[[], int] = lambda: 1, fence: retrying.Fence | None = None) -> None:
        self._kube = kube
        self._snapshot = snapshot
        self._ledger = ledger_
        self.settings = recovery
        self._metrics = metrics_
        self._clock = clock
        self.identity = identity
        self._is_leader = is_leader
        self._save_logs = save_logs
        self._epoch = epoch
        self._fence = fence
        """Bounds every write's attempts to this replica's term (`LeaderElector`); None without election."""
        self._in_flight: set[str] = set()
        """Ids of the intents being carried out here now: `resume()` leaves them to the task doing them."""
        self._failures: dict[str, str] = {}
        """Intent id -> why its last attempt here failed (for the KcoverRecoveryFailed Event)."""
        self.devices = devicetainting.DeviceTaints(
            kube, options=lambda: self.settings.device_taints,
            metrics_=metrics_, clock=clock, guard=self._guard, fence=fence)
        """kcover's DeviceTaintRules and whether the API server serves them (`devicetainting`)."""
        self._deleter = deleting.PodDeleter(kube, guard=self._guard, fence=fence,
                                            concurrency=lambda: self.settings.delete_concurrency)
        """The restart's pod writes (`deleting`)."""

    # ---------------------------------------------------------------------------------------- plumbing

    def _guard(self) -> None:
        if not self._is_leader():
            raise errors.NotLeaderError("not leading: recovery write refused")

    def _count(self, action: actions.Action, result: str) -> None:
        self._metrics.actions.labels(action=actions.action_name(action), result=result).inc()

    def _observe(self, cause: model.CollectorEvent) -> None:
        delay = (self._clock.now() - cause.observed_at).total_seconds()
        self._metrics.fault_to_action.observe(max(delay, 0.0))

    async def emit(self, about: actions.ObjectRef, *, reason: str, action: str, message: str,
                   warning: bool = False) -> None:
        """Write one core/v1 Event (with eventTime) on `about`; failures are logged, not raised."""
        body = auditing.event_body(about, reason=reason, action=action, message=message, warning=warning,
                                   now=self._clock.now(), controller=REPORTING_CONTROLLER, instance=self.identity)
        namespace = body["metadata"]["namespace"]
        try:
            self._guard()
            await self._kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body, fence=self._fence)
        except errors.ConflictError:
            pass  # AlreadyExists: an attempt whose answer was lost did write it (the name is the same)
        except errors.KubeError as exc:
            log.warning("recovery_event_failed", reason=reason, object=about.describe(), error=str(exc))

    # ---------------------------------------------------------------------------------------- dispatch

    async def execute(self, action: actions.Action) -> Result:
        if isinstance(action, actions.RestartWorkload):
            return await self.restart(action)
        if isinstance(action, actions.CordonNode):
            return await self.cordon(action)
        if isinstance(action, actions.UncordonNode):
            return await self.uncordon(action)
        if isinstance(action, actions.TaintDevice):
            return await self.taint_device(action)
        if isinstance(action, actions.UntaintDevice):
            return await self.untaint_device(action)
        if isinstance(action, actions.RecordOnly):
            return await self.report(action)
        return await self.skip(action)

    async def skip(self, action: actions.Skip) -> Result:
        self._count(action, action.code.value)
        if action.code is actions.SkipCode.BREAKER_OPEN:
            self._metrics.breaker_open.set(1)
        log.info("recovery_skipped", code=action.code.value, text=action.text, cause=action.cause.id,
                 audit=action.audit)
        if action.audit and action.about is not None:
            await self.emit(action.about, reason="KcoverRecoverySkipped", action="Skip", warning=True,
                            message=f"{action.code.value}: {action.text} (fault {action.cause.reason} "
                                    f"from {action.cause.detector}: {action.cause.message})")
        return Result(Outcome.SKIPPED, action, action.text)

    async def _refuse(self, action: actions.Action, code: actions.SkipCode, text: str,
                      about: actions.ObjectRef | None, *, audit: bool = True) -> Result:
        cause = getattr(action, "cause", None)
        if cause is None:
            self._count(action, code.value)
            log.info("recovery_skipped", code=code.value, text=text)
            return Result(Outcome.SKIPPED, action, text)
        result = await self.skip(actions.Skip(code, text, cause, about=about, audit=audit))
        return Result(Outcome.SKIPPED, action, result.detail)

    async def report(self, action: actions.RecordOnly) -> Result:
        self._count(action, "dry_run" if self.settings.dry_run else "done")
        if action.about is not None:
            await self.emit(action.about, reason="KcoverFaultReported", action="Report", warning=True,
                            message=f"{action.cause.detector} reported {action.text}")
        return Result(Outcome.DONE, action)

    # ---------------------------------------------------------------------------------------- restart

    def _precondition(self, action: actions.RestartWorkload) -> str:
        """'' when the faulting pod still belongs to the workload (from the cache), else why not."""
        if action.pod is None:
            return ""
        pod = self._snapshot.pod(action.pod.uid)
        if pod is None:
            return f"Pod {action.pod.namespace}/{action.pod.name} is gone from the cache"
        resolved = adapters.resolve(self._snapshot, pod)
        if not isinstance(resolved, adapters.Resolved) or resolved.workload.uid != action.workload.uid:
            return (f"Pod {pod.namespace}/{pod.name} no longer belongs to {action.workload.describe()} "
                    f"(uid {action.workload.uid})")
        return ""

    def _members(self, action: actions.RestartWorkload) -> list[proj.Pod]:
        w = action.workload
        if action.selector.pods is not None:
            found = [self._snapshot.pod(ref.uid) for ref in action.selector.pods]
            return [p for p in found if p is not None]
        return list(adapters.members(self._snapshot, action.selector, w.namespace, w.uid).verified)

    def _intent(self, action: actions.RestartWorkload, now: float, message: str) -> ledger.Intent:
        w = action.workload
        uids: list[str] = [action.pod.uid] if action.pod is not None else []
        if action.selector.pods is not None:
            uids += [ref.uid for ref in action.selector.pods]
        else:
            uids += [p.uid for p in self._snapshot.pods_of_workload(w.uid)
                     if not p.deleting and action.selector.matches(p.labels)]
        uids = list(dict.fromkeys(uids))[:ledger.MAX_INTENT_UIDS]
        pods = (None if action.selector.pods is None
                else tuple((r.namespace, r.name, r.uid) for r in action.selector.pods))
        pod = (action.pod.namespace, action.pod.name, action.pod.uid) if action.pod is not None else None
        return ledger.Intent(id=uuid.uuid4().hex[:12], fault=action.cause.id, leader=self.identity,
                             epoch=self._epoch(), at=now, workload=(w.kind, w.api_version, w.namespace, w.name, w.uid),
                             selector=action.selector.render(), pods=pods, pod=pod, uids=tuple(uids),
                             message=model.fit(message, 300), unit=action.unit)

    async def restart(self, action: actions.RestartWorkload) -> Result:
        rs = self.settings
        w = action.workload
        what = w.describe() + (f" {action.unit}" if action.unit else "")
        fault = f"{action.cause.reason} from {action.cause.detector} on {action.cause.target.describe()}"
        now = self._clock.now().timestamp()
        if rs.dry_run:
            def remember(state: ledger.State) -> tuple[actions.SkipCode, str, bool] | None:
                refusal = (_replayed(state, action.cause, action.ledger_key, what)
                           or policy.restart_refusal(action.ledger_key, state.history(), rs, now, what=what))
                if refusal is None:
                    state.restarts.setdefault(action.ledger_key, []).append(now)
                    state.remember(action.cause.signal, action.ledger_key, now)
                return refusal

            dry_refusal = self._ledger.dry_update(remember, now=now)
            if dry_refusal is not None:
                code, text, audit = dry_refusal
                return await self._refuse(action, code, f"dry run: {text}", w, audit=audit)
            self._count(action, "dry_run")
            await self.emit(w, reason="KcoverRestartedWorkload", action="DryRunRestart",
                            message=f"dry run: would restart {what} (pods {action.selector.render()}) after {fault}")
            return Result(Outcome.DRY_RUN, action)
        problem = self._precondition(action)
        if problem:
            return await self._refuse(action, actions.SkipCode.PRECONDITION_FAILED, problem, w)
        intent = self._intent(action, now, f"{what} after {fault}: {action.cause.message}")

        def record(state: ledger.State) -> tuple[actions.SkipCode, str, bool] | None:
            held = state.intents.get(action.ledger_key)
            if held is not None and held.id == intent.id:
                return None  # an earlier attempt of this very write landed, its answer was lost
            refusal = (_replayed(state, action.cause, action.ledger_key, what)
                       or policy.restart_refusal(action.ledger_key, state.history(), rs, now, what=what))
            if refusal is None:
                state.restarts.setdefault(action.ledger_key, []).append(now)
                state.notes[action.ledger_key] = model.fit(what, 120)
                state.intents[action.ledger_key] = intent
                state.remember(action.cause.signal, action.ledger_key, now)
            return refusal

        self._in_flight.add(intent.id)
        try:
            refusal = await self._ledger.update(record, now=now)
            if refusal is not None:
                code, text, audit = refusal
                return await self._refuse(action, code, text, w, audit=audit)
            return await self._carry_out(action, intent, what=what,
                                         why=f"after {fault}: {action.cause.message}")
        finally:
            self._in_flight.discard(intent.id)

    async def _carry_out(self, action: actions.RestartWorkload, intent: ledger.Intent, *, what: str,
                         why: str, resumed: bool = False) -> Result:
        """Preconditions again, logs, the delete, the Event; the intent is then complete.

        A `resumed` intent (retried, or finished for an earlier leader) was vetted against the cluster
        (`vetting.problem`) and some of its pods still live: an earlier attempt may have deleted the
        faulting pod already, so its absence is no reason to stop half way (that left a job with part of
        its pods restarted and the fault unanswered)."""
        rs = self.settings
        w = action.workload
        problem = self._precondition(action)
        if problem and resumed and action.pod is not None and self._snapshot.pod(action.pod.uid) is None:
            problem = ""
        if problem:
            self._ledger.complete(action.ledger_key, intent.id)
            return await self._refuse(action, actions.SkipCode.PRECONDITION_FAILED, problem, w)
        where = ""
        if self._save_logs is not None and rs.save_logs.enabled:
            try:
                async with asyncio.timeout(rs.save_logs.timeout_seconds):
                    where = await self._save_logs(w, self._members(action)) or ""
            except (Exception, TimeoutError) as exc:  # the hook is foreign code; CancelledError passes
                log.warning("recovery_save_logs_failed", workload=what, error=repr(exc))
                if not rs.save_logs.proceed_on_failure:
                    self._ledger.complete(action.ledger_key, intent.id)
                    return await self._refuse(action, actions.SkipCode.SAVE_LOGS_FAILED,
                                              f"saving logs of {what} failed ({exc!r}); not restarting", w)
        try:
            deleted = await self._deleter.delete(action, intent)
        except errors.KubeError as exc:
            # the intent stays pending in the ledger: the leader's periodic resume tries again while it is
            # valid, and a KcoverRecoveryFailed Event says so if it never succeeds
            self._failures[intent.id] = model.fit(str(exc), 300)
            self._count(action, "failed_attempt")
            log.warning("restart_attempt_failed", workload=what, intent=intent.id, error=str(exc)[:300])
            raise
        self._failures.pop(intent.id, None)
        self._ledger.complete(action.ledger_key, intent.id)
        self._count(action, "done")
        self._observe(action.cause)
        self._metrics.breaker_open.set(0)
        log.info("job_restarted", workload=what, uid=w.uid, deleted=deleted, selector=action.selector.render(),
                 cause=action.cause.id, intent=intent.id)
        saved = f"; logs saved to {where}" if where else ""
        await self.emit(w, reason="KcoverRestartedWorkload", action="RestartWorkload", warning=True,
                        message=f"restarted {what}: deleted {deleted} pods ({action.selector.render()}) {why}{saved}")
        return Result(Outcome.DONE, action, deleted=deleted)

    # ---------------------------------------------------------------------------------------- failover

    def _live(self, intent: ledger.Intent) -> list[str]:
        """Uids the intent names that are still in the cache and not terminating: the delete did not happen."""
        out = []
        for uid in intent.uids:
            pod = self._snapshot.pod(uid)
            if pod is not None and not pod.deleting:
                out.append(uid)
        return out

    async def resume(self) -> list[Result]:
        """Finish the restarts recorded (pending) but not carried out: an earlier leader's, or this leader's own
        whose delete failed. Run when a term starts and then periodically, with the ledger loaded and the
        cache synced. An intent stays valid for the workload cooldown; one that is still not carried out
        then is given up: its restart is taken off the budget and a KcoverRecoveryFailed Event says why."""
        if self.settings.dry_run:
            return []
        now = self._clock.now().timestamp()
        out: list[Result] = []
        for key, intent in sorted(self._ledger.pending().items(), key=lambda item: item[1].at):
            if intent.id in self._in_flight:
                continue  # being carried out by the task that recorded or resumed it
            self._in_flight.add(intent.id)
            try:
                problem = vetting.problem(key, intent, self._snapshot, self.settings) if self._live(intent) else ""
                if problem:
                    dropped = await self._drop(key, intent, problem, now)
                    if dropped is not None:
                        out.append(dropped)
                    continue
                if now - intent.at >= self.settings.workload_cooldown_seconds:
                    result = await self._give_up(key, intent, now)
                    if result is not None:
                        out.append(result)
                    continue
                out.append(await self._finish(key, intent, now))
            except errors.NotLeaderError:
                raise
            except errors.KubeError as exc:  # one intent's failure must not keep the others from finishing
                log.warning("restart_intent_resume_failed", key=key, intent=intent.id, error=str(exc))
            finally:
                self._in_flight.discard(intent.id)
        return out

    async def _drop(self, key: str, intent: ledger.Intent, problem: str, now: float) -> Result | None:
        """An intent the cluster disagrees with (`vetting.problem`): removed from the ledger (its restart time
        refunded), counted as `IntentRefused` and reported by an Event on the ledger ConfigMap."""
        action = intent_action(key, intent)

        def drop(state: ledger.State) -> str | None:
            current = state.intents.get(key)
            if current is None or current.id != intent.id:
                return "another replica handled it"
            del state.intents[key]
            times = state.restarts.get(key, [])
            if intent.at in times:
                times.remove(intent.at)
            return None

        if await self._ledger.update(drop, now=now) is not None:
            return None
        self._count(action, actions.SkipCode.INTENT_REFUSED.value)
        log.warning("restart_intent_refused", key=key, intent=intent.id, leader=intent.leader, problem=problem)
        ledger_ref = actions.ObjectRef("ConfigMap", "v1", self._ledger.name, self._ledger.namespace)
        await self.emit(ledger_ref, reason="KcoverIntentRefused", action="RestartWorkload", warning=True,
                        message=f"dropped the pending restart {intent.id} under {key} (recorded by "
                                f"{intent.leader or 'unknown'}): {problem}; nothing was deleted")
        return Result(Outcome.SKIPPED, action, f"refused: {problem}")

    async def _give_up(self, key: str, intent: ledger.Intent, now: float) -> Result | None:
        """An intent past its validity: done if its pods are gone, else refunded and reported as failed."""
        action = intent_action(key, intent)
        if not self._live(intent):
            self._ledger.complete(key, intent.id)
            return None
        why = self._failures.pop(intent.id, "") or "its pods are still running and no attempt succeeded in time"

        def refund(state: ledger.State) -> str | None:
            current = state.intents.get(key)
            if current is None or current.id != intent.id:
                return "another replica finished it"
            del state.intents[key]
            times = state.restarts.get(key, [])
            if intent.at in times:
                times.remove(intent.at)  # a restart that did not happen does not use up the budget
            return None

        taken = await self._ledger.update(refund, now=now)
        if taken is not None:
            return None
        what = action.workload.describe() + (f" {intent.unit}" if intent.unit else "")
        self._count(action, "failed")
        log.error("restart_failed", workload=what, intent=intent.id, leader=intent.leader, cause=intent.fault,
                  error=why)
        await self.emit(action.workload, reason="KcoverRecoveryFailed", action="RestartWorkload", warning=True,
                        message=f"could not restart {what} within {self.settings.workload_cooldown_seconds:.0f}s "
                                f"({why}); the restart was not counted against its budget. Fault: {intent.message}")
        return Result(Outcome.SKIPPED, action, f"failed: {why}")

    async def _finish(self, key: str, intent: ledger.Intent, now: float) -> Result:
        action = intent_action(key, intent)
        what = action.workload.describe() + (f" {intent.unit}" if intent.unit else "")
        if not self._live(intent):
            self._ledger.complete(key, intent.id)
            log.info("restart_intent_done", workload=what, intent=intent.id, leader=intent.leader)
            return Result(Outcome.SKIPPED, action, "already carried out: its pods are gone or replaced")
        if (intent.leader, intent.epoch) == (self.identity, self._epoch()):
            log.info("restart_intent_retried", workload=what, intent=intent.id, age_seconds=round(now - intent.at, 3))
            return await self._carry_out(action, intent, what=what, why=f"(retried) after {intent.message}",
                                         resumed=True)
        claimed = dataclasses.replace(intent, leader=self.identity, epoch=self._epoch())

        def claim(state: ledger.State) -> str | None:
            current = state.intents.get(key)
            if current is None or current.id != intent.id or current.leader != intent.leader:
                return "another replica took it over"
            state.intents[key] = claimed
            return None

        taken = await self._ledger.update(claim, now=now)
        if taken is not None:
            log.info("restart_intent_taken", workload=what, intent=intent.id)
            return Result(Outcome.SKIPPED, action, taken)
        if not self._live(intent):
            self._ledger.complete(key, intent.id)
            return Result(Outcome.SKIPPED, action, "already carried out: its pods are gone or replaced")
        log.warning("restart_intent_resumed", workload=what, intent=intent.id, leader=intent.leader,
                    epoch=intent.epoch, age_seconds=round(now - intent.at, 3), cause=intent.fault)
        recorded = dt.datetime.fromtimestamp(intent.at, dt.UTC)
        return await self._carry_out(action, claimed, what=what,
                                     why=f"(finishing the restart {intent.leader} recorded at "
                                         f"{recorded:%H:%M:%S}Z and did not carry out) after {intent.message}",
                                     resumed=True)

    # ---------------------------------------------------------------------------------------- nodes

    def _taints(self, reason: str) -> list[dict[str, str]]:
        value = _label_value(reason)
        out = [{"key": self.settings.taint_key, "value": value, "effect": "NoSchedule"}]
        if self.settings.taint_no_execute:
            out.append({"key": self.settings.taint_key, "value": value, "effect": "NoExecute",
                        "timeAdded": clock_.rfc3339(self._clock.now())})
        return out

    async def cordon(self, action: actions.CordonNode) -> Result:
        rs = self.settings
        about = policy.node_ref(action.node)
        fault = f"{action.cause.reason} from {action.cause.detector}"
        now = self._clock.now().timestamp()

        def record(state: ledger.State) -> tuple[actions.SkipCode, str] | None:
            replayed = _replayed(state, action.cause, f"n.{action.node}", f"Node {action.node}")
            if replayed is not None:
                return replayed[0], replayed[1]
            last = state.cordons.get(action.node)
            if last is not None and now - last < rs.node_cooldown_seconds:
                return actions.SkipCode.COOLDOWN, f"Node {action.node} was cordoned {now - last:.0f}s ago"
            state.cordons[action.node] = now
            state.cordon_reasons[action.node] = model.fit(action.reason, 120)
            state.remember(action.cause.signal, f"n.{action.node}", now)
            return None

        if rs.dry_run:
            dry_refusal = self._ledger.dry_update(record, now=now)
            if dry_refusal is not None:
                return await self._refuse(action, dry_refusal[0], f"dry run: {dry_refusal[1]}", about, audit=False)
            self._count(action, "dry_run")
            await self.emit(about, reason="KcoverCordonedNode", action="DryRunCordon",
                            message=f"dry run: would cordon Node {action.node} after {fault}: {action.reason}")
            return Result(Outcome.DRY_RUN, action)
        refusal = await self._ledger.update(record, now=now)
        if refusal is not None:
            return await self._refuse(action, refusal[0], refusal[1], about, audit=False)
        ours = self._taints(action.cause.reason)
        mine = {(t["key"], t["effect"]) for t in ours}

        def cordon(node: dict[str, Any]) -> str:
            meta = node.setdefault("metadata", {})
            annotations = meta.setdefault("annotations", {}) or {}
            meta["annotations"] = annotations
            if annotations.get(proj.CORDONED_BY) == "kcover":
                return f"Node {action.node} is already cordoned by kcover"
            spec = node.setdefault("spec", {})
            kept = [t for t in spec.get("taints") or [] if (t.get("key"), t.get("effect")) not in mine]
            spec["taints"] = kept + ours
            spec["unschedulable"] = True
            annotations[proj.CORDONED_BY] = "kcover"
            annotations[proj.CORDON_TAINTS] = cordoning.record(kept, rs.taint_key)
            annotations[proj.CORDON_REASON] = model.fit(f"{fault}: {action.reason}", model.MESSAGE_MAX)
            annotations[proj.CORDONED_AT] = clock_.rfc3339(self._clock.now())
            return ""

        node, refused = await self._rewrite_node(action.node, cordon)
        about = policy.node_ref(action.node, str(node.get("metadata", {}).get("uid", "")))
        if refused:
            return await self._refuse(action, actions.SkipCode.ALREADY_CORDONED, refused, about, audit=False)
        self._count(action, "done")
        self._observe(action.cause)
        log.info("node_cordoned", node=action.node, reason=action.reason, cause=action.cause.id)
        await self.emit(about, reason="KcoverCordonedNode", action="CordonNode", warning=True,
                        message=f"cordoned Node {action.node} (taint {rs.taint_key}) after {fault}: {action.reason}")
        return Result(Outcome.DONE, action)

    async def _rewrite_node(self, name: str, change: Callable[[dict[str, Any]], str]) -> tuple[dict[str, Any], str]:
        """Read-modify-write a Node with its resourceVersion as the precondition, retrying on 409.

        `change` edits the object in place and returns "" to have it written, or why it must not be
        (then nothing is written). What `change` leaves alone, such as others' taints, is kept.
        """
        path = f"/api/v1/nodes/{name}"
        for _attempt in range(NODE_WRITE_ATTEMPTS):
            node: dict[str, Any] = await self._kube.request("GET", path)
            refused = change(node)
            if refused:
                return node, refused
            self._guard()
            try:
                await self._kube.request("PUT", path, body=node, fence=self._fence)
            except errors.ConflictError:
                continue
            return node, ""
        raise errors.KubeError(f"Node {name}: still conflicting after {NODE_WRITE_ATTEMPTS} attempts", status=409)

    async def uncordon(self, action: actions.UncordonNode) -> Result:
        rs = self.settings
        about = policy.node_ref(action.node)
        if rs.dry_run:
            self._count(action, "dry_run")
            await self.emit(about, reason="KcoverUncordonedNode", action="DryRunUncordon",
                            message=f"dry run: would un-cordon Node {action.node}")
            return Result(Outcome.DRY_RUN, action)
        taken = ""

        def uncordon(node: dict[str, Any]) -> str:
            nonlocal taken
            meta = node.setdefault("metadata", {})
            annotations = meta.get("annotations") or {}
            if annotations.get(proj.CORDONED_BY) != "kcover":
                return f"Node {action.node} was not cordoned by kcover"
            taken = cordoning.taken_over(node, rs.taint_key)  # then the person's cordon stays
            for key in (proj.CORDONED_BY, proj.CORDON_REASON, proj.CORDONED_AT, proj.CORDON_TAINTS):
                annotations.pop(key, None)
            meta["annotations"] = annotations
            spec = node.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != rs.taint_key]
            if not taken:
                spec.pop("unschedulable", None)
            return ""

        node, refused = await self._rewrite_node(action.node, uncordon)
        about = policy.node_ref(action.node, str(node.get("metadata", {}).get("uid", "")))
        if refused:
            return await self._refuse(action, actions.SkipCode.NOT_CORDONED_BY_KCOVER, refused, about, audit=False)
        if taken:
            self._count(action, "handed_over")
            log.info("node_cordon_handed_over", node=action.node, why=taken)
            state = "cordoned" if (node.get("spec") or {}).get("unschedulable") else "schedulable"
            await self.emit(about, reason="KcoverCordonHandedOver", action="HandOver",
                            message=f"Node {action.node}: its fault cleared, but {taken}; kcover removed only its own "
                                    f"taint and annotations and left the node {state}")
            return Result(Outcome.DONE, action, taken)
        self._count(action, "done")
        log.info("node_uncordoned", node=action.node)
        await self.emit(about, reason="KcoverUncordonedNode", action="UncordonNode",
                        message=f"un-cordoned Node {action.node}: its fault cleared")
        return Result(Outcome.DONE, action)

    # ---------------------------------------------------------------------------------------- devices

    async def taint_device(self, action: actions.TaintDevice) -> Result:
        """Taint one DRA device; where the server has no DeviceTaintRules, do the node-level fallback instead
        and say so once (Event `KcoverDeviceTaintsUnavailable`, metric `kcover_device_taints_served 0`)."""
        dev = action.device.resource_id
        about = policy.node_ref(action.node)
        outcome = await self.devices.taint(action.device, node=action.node, reason=action.reason,
                                           cause=action.cause.id, dry_run=self.settings.dry_run)
        if outcome is devicetainting.Outcome.UNSERVED:
            self._count(action, "fallback")
            if not self.devices.unserved_said:
                self.devices.unserved_said = True
                await self.emit(about, reason="KcoverDeviceTaintsUnavailable", action="FallBack", warning=True,
                                message=f"the API server serves no DeviceTaintRules (resource.k8s.io, KEP-5055): "
                                        f"device {dev} and later device faults are answered at node level")
            log.info("device_taint_fallback", device=dev, node=action.node, steps=len(action.fallback))
            for step in action.fallback:
                await self.execute(step)
            return Result(Outcome.SKIPPED, action, "device taints not served: node-level fallback")
        self._count(action, outcome.value)
        if outcome is devicetainting.Outcome.FOREIGN:
            log.warning("device_taint_rule_foreign", device=dev, rule=devicetainting.rule_name(action.device))
            return Result(Outcome.SKIPPED, action, "a DeviceTaintRule of that name is not kcover's")
        if outcome is devicetainting.Outcome.EXISTS:
            return Result(Outcome.DONE, action, "already tainted by kcover")
        dry = outcome is devicetainting.Outcome.DRY_RUN
        self._observe(action.cause)
        log.info("device_tainted", device=dev, node=action.node, dry_run=dry)
        await self.emit(about, reason="KcoverTaintedDevice", action="DryRunTaintDevice" if dry else "TaintDevice",
                        message=f"{'dry run: would taint' if dry else 'tainted'} device {dev} on Node {action.node} "
                                f"({self.settings.device_taints.effect.value}, DeviceTaintRule "
                                f"{devicetainting.rule_name(action.device)}); the node stays schedulable: "
                                f"{action.reason}")
        return Result(Outcome.DRY_RUN if dry else Outcome.DONE, action)

    async def untaint_device(self, action: actions.UntaintDevice) -> Result:
        """Remove kcover's own rule of a device that is healthy again; anyone else's rule stays."""
        dev = action.device.resource_id
        outcome = await self.devices.untaint(action.device, dry_run=self.settings.dry_run)
        self._count(action, outcome.value)
        if outcome not in (devicetainting.Outcome.REMOVED, devicetainting.Outcome.DRY_RUN):
            return Result(Outcome.SKIPPED, action, outcome.value)
        dry = outcome is devicetainting.Outcome.DRY_RUN
        log.info("device_untainted", device=dev, node=action.node, dry_run=dry)
        if action.node:
            await self.emit(policy.node_ref(action.node), reason="KcoverUntaintedDevice",
                            action="DryRunUntaintDevice" if dry else "UntaintDevice",
                            message=f"{'dry run: would remove' if dry else 'removed'} kcover's DeviceTaintRule of "
                                    f"device {dev} on Node {action.node}: the device is healthy again")
        return Result(Outcome.DRY_RUN if dry else Outcome.DONE, action)


def _replayed(state: ledger.State, cause: model.CollectorEvent, unit: str,
              what: str) -> tuple[actions.SkipCode, str, bool] | None:
    """A refusal when the ledger says this cause's signal already moved `unit` (a replay), else None."""
    at = state.acted_on(cause.signal, unit)
    if at is None:
        return None
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    return (actions.SkipCode.ALREADY_ACTED, f"{what}: signal {cause.signal} was already acted on at "
            f"{when:%Y-%m-%dT%H:%M:%SZ}; a signal moves a unit once", False)


_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def _label_value(text: str) -> str:
    """A taint value: at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric."""
    value = _NOT_LABEL.sub("-", text)[:63].strip("-._")
    return value or "fault"



def intent_action(key: str, intent: ledger.Intent) -> actions.RestartWorkload:
    """The restart a pending intent stands for, with a cause naming the ledger (for a successor to finish it)."""
    kind, api_version, namespace, name, uid = intent.workload
    labels = tuple((k, v) for k, _, v in (part.partition("=") for part in intent.selector.split(",") if part))
    pods = None if intent.pods is None else tuple(actions.PodRef(*p) for p in intent.pods)
    cause = model.CollectorEvent(
        id=intent.fault or intent.id, detector=RESUMED_DETECTOR, severity=model.Severity.ERROR,
        reason="RestartIntentPending", message=intent.message,
        target=model.Target(kind=model.TargetKind.WORKLOAD, namespace=namespace, name=name, uid=uid,
                            workload_kind=kind),
        observed_at=dt.datetime.fromtimestamp(intent.at, dt.UTC))
    return actions.RestartWorkload(
        workload=actions.WorkloadRef(kind, api_version, name, namespace, uid),
        selector=actions.MemberSelector(labels=labels, pods=pods), ledger_key=key,
        pod=actions.PodRef(*intent.pod) if intent.pod is not None else None, cause=cause, unit=intent.unit)
