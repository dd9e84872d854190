"""Verification after a restart: follow the workload until it runs again, measure MTTR, report a stall.

Owns the recoveries being followed and what they became. After the executor restarted a unit, the
`Verifier` follows it through the cluster cache's change stream: the restart is *recovered* when as
many pods as before the restart run again (phase Running, not terminating) and none of them is one
of the old uids, or *finished* when the workload completed meanwhile. Recovered, the time from the
fault (the cause's `observed_at`, when kcover first saw it) to that moment is kcover's MTTR: it is
observed in `kcover_recovery_mttr_seconds` at once (synchronously, in the cache callback, so the
figure is as exact as the cache's view of the cluster) and kept in `history` with the recovery.
Past `recovery.verify.deadline_seconds` without that, the recovery is *Stalled*: `diagnose()` reads
the cause from the pods the cache holds (Pending and unschedulable with the scheduler's message, an
image pull error, a crash again, the operator not recreating pods) and the escalation ladder's last
step, a person, follows (`kcover_recovery_stalled_total{cause}`, `kcover_escalation_steps_total`).

The decisions (`assess`, `diagnose`) are pure functions of the cache's projections. `Verify` is the
coordinator hook that starts following a restart once it is done. The Events (`KcoverRecoveryVerified`,
`KcoverRecoveryStalled`, `KcoverEscalated`) are the `Emit` steps `flush()` returns, which the leader's
periodic pass (`recovery.resume_interval_seconds`) runs, because the cache callback may not await. Memory: at most `recovery.verify.max_followed` recoveries, the oldest
dropped (logged); `history` keeps the last `HISTORY` outcomes. A new leader does not follow the
restarts of the old one (documented in the runbook). It never raises into the cache.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from kcover import settings
from kcover.kube import caching, indexing
from kcover.kube import projections as proj
from kcover.recovery import steps as st

log = structlog.get_logger()

HISTORY = 1000
"""Outcomes kept in `Verifier.history` (newest last)."""
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CRASH_REASONS = frozenset({"CrashLoopBackOff", "RunContainerError", "CreateContainerError"})
WORKLOAD_STEPS = ("restart", "stop", "person")
"""`kcover_escalation_steps_total{ladder="workload"}` steps: restart again, stop restarting, call a person."""
MTTR_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)



class Outcome(enum.StrEnum):
    RECOVERED = "recovered"
    FINISHED = "finished"
    STALLED = "stalled"


class StallCause(enum.StrEnum):
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL = "ImagePullError"
    CRASHED_AGAIN = "CrashedAgain"
    NOT_RECREATED = "OperatorNotRecreating"
    NOT_RUNNING = "NotRunning"


@dataclass
class Followed:
    """One restart being followed."""

    key: str
    """The restart unit's ledger key."""
    workload: st.WorkloadRef
    selector: st.Selector
    what: str
    old_uids: frozenset[str]
    expected: int
    """Pods the unit had before the restart: that many must run again."""
    fault_at: float
    """Epoch seconds kcover first observed the fault (the cause's `observed_at`)."""
    restarted_at: float
    deadline: float
    fault: str
    """The fault in words, for the Events."""
    node: str = ""


@dataclass(frozen=True)
class Record:
    """What one followed restart became: the recovery's history entry."""

    key: str
    what: str
    outcome: Outcome
    at: float
    mttr_seconds: float | None = None
    """Fault to running again (None unless recovered)."""
    cause: StallCause | None = None
    detail: str = ""


def live_pods(followed: Followed, pods: Iterable[proj.Pod]) -> list[proj.Pod]:
    """The unit's pods now: matching its selector, not terminating."""
    return [p for p in pods if not p.deleting and followed.selector.matches(p.labels)]


def assess(followed: Followed, pods: Sequence[proj.Pod], workload: proj.Workload | None) -> Outcome | None:
    """RECOVERED when `expected` pods run with none of the old uids, FINISHED when the workload
    completed, else None (not yet)."""
    if workload is not None and workload.finished:
        return Outcome.FINISHED
    live = live_pods(followed, pods)
    running = [p for p in live if p.phase == "Running" and p.uid not in followed.old_uids]
    if len(running) >= max(followed.expected, 1) and not any(p.uid in followed.old_uids for p in live):
        return Outcome.RECOVERED
    return None


def diagnose(followed: Followed, pods: Sequence[proj.Pod]) -> tuple[StallCause, str]:
    """Why a restarted unit is not running again, read from its pods (most specific cause first)."""
    live = [p for p in live_pods(followed, pods) if p.uid not in followed.old_uids]
    for pod in live:
        if pod.unschedulable:
            return StallCause.UNSCHEDULABLE, f"Pod {pod.namespace}/{pod.name} is Pending: {pod.unschedulable}"
    for pod in live:
        for c in pod.containers:
            if c.waiting is not None and c.waiting[0] in IMAGE_PULL_REASONS:
                return StallCause.IMAGE_PULL, (f"Pod {pod.namespace}/{pod.name} container {c.name}: "
                                               f"{c.waiting[0]}: {c.waiting[1]}".rstrip(": "))
    for pod in live:
        for c in pod.containers:
            crashed = c.waiting is not None and c.waiting[0] in CRASH_REASONS
            failed = next((t for t in (c.terminated, c.last_terminated) if t is not None and t.exit_code != 0), None)
            if crashed or failed is not None or pod.phase == "Failed":
                how = (f"{c.waiting[0]}" if crashed and c.waiting else
                       f"exited with code {failed.exit_code} ({failed.reason})" if failed is not None else "Failed")
                return StallCause.CRASHED_AGAIN, f"Pod {pod.namespace}/{pod.name} container {c.name} {how}"
    if len(live) < followed.expected:
        return StallCause.NOT_RECREATED, (f"{len(live)} of {followed.expected} pods exist again: the workload's "
                                          "operator has not recreated the others")
    phases = collections.Counter(p.phase or "Unknown" for p in live)
    return StallCause.NOT_RUNNING, "pods " + ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))


class VerifyMetrics:
    """The verification and escalation metrics, on the controller's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.mttr = Histogram("kcover_recovery_mttr_seconds",
                              "Seconds from a fault (first observed) to its restarted workload running again.",
                              buckets=MTTR_BUCKETS, registry=registry)
        self.outcomes = Counter("kcover_recovery_verified", "Restarts followed to an end, by outcome "
                                "(recovered, finished, stalled).", ["outcome"], registry=registry)
        self.stalled = Counter("kcover_recovery_stalled", "Recoveries Stalled past recovery.verify.deadline_seconds, "
                               "by cause.", ["cause"], registry=registry)
        self.steps = Counter("kcover_escalation_steps", "Steps of the escalation ladder taken, by ladder "
                             "(workload, node) and step.", ["ladder", "step"], registry=registry)
        for step in WORKLOAD_STEPS:
            self.steps.labels(ladder="workload", step=step)  # at 0 before the first, so increase() sees it
        for outcome in Outcome:
            self.outcomes.labels(outcome=outcome.value)
        for cause in StallCause:
            self.stalled.labels(cause=cause.value)


class Verifier:
    """Follows restarted units through the cache; `flush()` writes what became of them."""

    def __init__(self, cache: caching.ClusterCache | None, metrics: VerifyMetrics, *,
                 settings_: Callable[[], settings.VerifySettings],
                 on_end: Callable[[Record], None] | None = None) -> None:
        self._cache = cache
        self._on_end = on_end
        """Told synchronously of every outcome (the Recovery resource's phase); must not raise or block."""
        self._metrics = metrics
        self._settings = settings_
        self.followed: dict[str, Followed] = {}
        """Ledger key -> the restart of that unit being followed (a newer restart replaces it)."""
        self.history: collections.deque[Record] = collections.deque(maxlen=HISTORY)
        self._unwritten: list[tuple[Record, st.WorkloadRef]] = []
        self._now: Callable[[], float] = lambda: 0.0
        self._subscribed = False

    def follow(self, followed: Followed, now: Callable[[], float]) -> None:
        """Start following one restart; `now()` is the clock's epoch seconds, read when it recovers."""
        self._now = now
        if self._cache is not None and not self._subscribed:
            self._cache.subscribe(self._on_change, replay=False)
            self._subscribed = True
        self.followed.pop(followed.key, None)
        self.followed[followed.key] = followed
        while len(self.followed) > self._settings().max_followed:
            oldest = next(iter(self.followed))
            log.warning("verify_dropped", workload=self.followed.pop(oldest).what)
        self._check(followed)

    def _on_change(self, kind: indexing.Kind, old: object, new: object) -> None:
        if not self.followed:
            return
        if kind is indexing.Kind.POD:
            # only the restarts whose unit the pod belongs to, before or after the change: `assess` counts the
            # pods its selector matches, so no other pod's change can change its outcome
            changed = [p for p in (old, new) if isinstance(p, proj.Pod)]
            if not changed:
                return
            namespace = changed[0].namespace
            for f in [f for f in self.followed.values()
                      if f.workload.namespace == namespace and any(f.selector.matches(p.labels) for p in changed)]:
                self._check(f)
        elif kind is indexing.Kind.WORKLOAD and isinstance(new, proj.Workload):
            for f in [f for f in self.followed.values() if f.workload.uid == new.uid]:
                self._check(f)

    def _pods(self, f: Followed) -> list[proj.Pod]:
        return list(self._cache.pods_of_workload(f.workload.uid)) if self._cache is not None else []

    def _check(self, f: Followed) -> None:
        if self._cache is None or self.followed.get(f.key) is not f:
            return
        outcome = assess(f, self._pods(f), self._cache.workload(f.workload.uid))
        if outcome is None:
            return
        now = self._now()
        del self.followed[f.key]
        mttr = max(now - f.fault_at, 0.0) if outcome is Outcome.RECOVERED else None
        if mttr is not None:
            self._metrics.mttr.observe(mttr)
        self._metrics.outcomes.labels(outcome=outcome.value).inc()
        record = Record(f.key, f.what, outcome, now, mttr_seconds=mttr)
        self.history.append(record)
        self._unwritten.append((record, f.workload))
        if self._on_end is not None:
            self._on_end(record)
        log.info("recovery_verified", workload=f.what, outcome=outcome.value,
                 mttr_seconds=None if mttr is None else round(mttr, 3),
                 since_restart_seconds=round(now - f.restarted_at, 3))

    def count_step(self, ladder: str, step: str) -> None:
        self._metrics.steps.labels(ladder=ladder, step=step).inc()

    def stalled(self, now: float) -> list[Record]:
        """Recoveries past their deadline: diagnosed, counted, and taken off the followed set."""
        out: list[Record] = []
        for f in [f for f in self.followed.values() if now >= f.deadline]:
            del self.followed[f.key]
            cause, detail = diagnose(f, self._pods(f))
            record = Record(f.key, f.what, Outcome.STALLED, now, cause=cause, detail=detail)
            self._metrics.outcomes.labels(outcome=Outcome.STALLED.value).inc()
            self._metrics.stalled.labels(cause=cause.value).inc()
            self.history.append(record)
            self._unwritten.append((record, f.workload))
            if self._on_end is not None:
                self._on_end(record)
            out.append(record)
            log.warning("recovery_stalled", workload=f.what, cause=cause.value, detail=detail)
        return out

    def flush(self, now: float) -> list[st.Step]:
        """Find the stalled recoveries; the Events of everything that ended since the last flush."""
        self.stalled(now)
        pending, self._unwritten = self._unwritten, []
        out: list[st.Step] = []
        for record, workload in pending:
            out += self._events(record, workload)
        return out

    def _events(self, record: Record, workload: st.WorkloadRef) -> list[st.Step]:
        if record.outcome is Outcome.RECOVERED:
            return [st.Emit(workload, "KcoverRecoveryVerified", "Verify", warning=False,
                            message=f"{record.what} runs again: every pod Running with a new uid, "
                                    f"{record.mttr_seconds:.3f}s after the fault (MTTR)")]
        if record.outcome is Outcome.FINISHED:
            return [st.Emit(workload, "KcoverRecoveryVerified", "Verify", warning=False,
                            message=f"{record.what} finished after its restart")]
        deadline = self._settings().deadline_seconds
        assert record.cause is not None
        self._metrics.steps.labels(ladder="workload", step="person").inc()
        return [st.Emit(workload, "KcoverRecoveryStalled", "Verify",
                        message=f"Stalled: {record.cause.value}: {record.what} is not running again {deadline:g}s "
                                f"after its restart: {record.detail}"),
                st.Emit(workload, "KcoverEscalated", "Person",
                        message=f"{record.what}: its restart stalled ({record.cause.value}) and kcover will not restart "
                                "it again for that: a person must look (see the KcoverRecoveryStalled Event)")]


class Verify:
    """The coordinator hook that follows every restart done until the workload runs again."""

    def __init__(self, verifier: Verifier, *, recovery: Callable[[], settings.RecoverySettings],
                 now: Callable[[], float]) -> None:
        self.verifier = verifier
        self._recovery = recovery
        self._now = now

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        if isinstance(outcome, st.Refused | st.Held) and outcome.code is st.Code.BUDGET_EXHAUSTED:
            self.verifier.count_step("workload", "stop")
        if not isinstance(outcome, st.Done) or outcome.noop:
            return []
        restart = step.restart if isinstance(step, st.Resume) else step
        if not isinstance(restart, st.Restart):
            return []
        self.verifier.count_step("workload", "restart")
        if not self._recovery().verify.enabled:
            return []
        now = self._now()
        old = {m.uid for m in restart.members} | ({restart.pod.uid} if restart.pod is not None else set())
        cause = restart.cause
        fault_at = step.intent.at if isinstance(step, st.Resume) else cause.observed_at.timestamp()
        self.verifier.follow(Followed(
            key=restart.unit_key, workload=restart.workload, selector=restart.selector, what=restart.what,
            old_uids=frozenset(old), expected=len(old), fault_at=fault_at, restarted_at=now,
            deadline=now + self._recovery().verify.deadline_seconds,
            fault=f"{cause.reason} from {cause.detector}", node=restart.node), self._now)
        return []
