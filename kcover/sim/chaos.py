"""`kcover sim chaos`: many faults at random times on a cluster whose API server misbehaves, and an account
of what was lost.

Owns the chaos scenario: it injects `faults` workload faults (a container exits with Error) and node
faults (NVML XID 79 on a GPU, which the agent reports and the controller answers with a cordon and
restarts) at random times, while the simulated API server answers 429s and 500s at the configured
rates, adds latency to every request, drops every watch now and then and forces 410s by compacting
history, restarts itself (same store, same port), and the leader replica is killed (Lease not
released) every `kill_every` faults and replaced by a fresh replica.

It counts from what the cluster holds, not from what kcover says it did: a job's restart is seen when
none of the pods it had remain (sampled continuously), a refusal is a `KcoverRecoverySkipped` or
`KcoverRecoveryFailed` Event on the job or node. A fault is *recovered* when its job restarted after it
was injected (a node fault when its node was cordoned and each of its jobs restarted), *refused* when
kcover said why not, and *lost* when neither happened within `RESOLVE_SECONDS` after it was injected
(it is counted then, mid-run, so that its jobs take faults again).
A restart with no fault injected since the job's previous restart is a *duplicate* when it came within
twice the cooldown of that restart, and touched pods *wrongly* otherwise. A stalled run (no job at rest
for 20 s) logs `chaos_stalled` with why each job is busy (`Chaos.why_busy`).

A fault is injected only into a job at rest (every pod Running, its last restart older than the cooldown,
no fault pending on it): two faults inside one cooldown are one recovery by design, not a loss. A node
fault needs every job at rest, not only those with pods on the node now: every job spans every node, and
one coming back from a restart lands its pods on the faulty node too, where kcover rightly restarts them
for the node's fault (counted as a duplicate when the node fault's jobs left it out). So once one is
drawn, no workload fault is injected until the jobs are at rest (at most `NODE_WAIT_SECONDS`); before
that rule runs injected no node fault at all.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover.aio import clock as clock_
from kcover.sim import cluster as cluster_
from kcover.sim import playing

log = structlog.get_logger()

NS = cluster_.NAMESPACE
SAMPLE_SECONDS = 0.02
COOLDOWN_SECONDS = 10.0
"""The chaos cluster's workload cooldown: longer than a failover (4 s Lease), shorter than the default 60 s."""
NODE_WAIT_SECONDS = 30.0
"""How long a drawn node fault holds workload faults back so that every job comes to rest."""
LEADER_WAIT_SECONDS = 30.0
"""How long a leader kill waits for a replica to hold the Lease."""
RESOLVE_SECONDS = 60.0
"""How long a fault may take to be answered before it counts as lost."""


@dataclass(frozen=True)
class Options:
    faults: int = 200
    throttle_rate: float = 0.05
    error_rate: float = 0.02
    latency_seconds: float = 0.2
    kill_every: int = 20
    """Kill the leader (Lease not released) with every this many faults; 0 never."""
    apiserver_restart_every: int = 50
    """Restart the API server with every this many faults; 0 never."""
    watch_drop_every: int = 10
    compact_every: int = 25
    node_fault_share: float = 0.1
    interval_seconds: tuple[float, float] = (0.05, 0.6)
    """Random wait before each fault."""


@dataclass
class Fault:
    kind: str
    target: str
    jobs: tuple[str, ...]
    injected: float
    record: playing.FaultRecord
    node: str = ""
    outcome: str = ""
    """"" until answered, then recovered or refused; lost when nothing answered it within RESOLVE_SECONDS."""
    joined: dict[str, float] = field(default_factory=dict)
    """A node fault's jobs that put a pod on its node after it was injected and before its cordon (a restart
    for another fault recreating them there), with when that was seen (at the earliest when the restart that
    made the pod was seen): the node's restart of them answers this fault from then."""

    def since(self, job: str) -> float:
        """When this fault began to call for a restart of `job`."""
        return self.joined.get(job, self.injected)


@dataclass
class Tally:
    injected: int = 0
    workload_faults: int = 0
    node_faults: int = 0
    recovered: int = 0
    refused: int = 0
    lost: int = 0
    duplicates: int = 0
    wrongly_touched_pods: int = 0
    restarts: int = 0
    leader_kills: int = 0
    apiserver_restarts: int = 0
    watch_drops: int = 0
    compactions: int = 0
    api_retries: int = 0
    crashed: int = 0
    """kcover replicas and agents whose run ended with an error (not killed by the run)."""
    detail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "detail"} | {"lost_detail": self.detail[:20]}


OVERRIDES: dict[str, Any] = {
    # the breaker's window limits at the chaos budget (half the nodes cordoned); a restart held for its node's
    # verdict runs within half of RESOLVE_SECONDS when no answer comes
    "recovery": {"workload_cooldown_seconds": COOLDOWN_SECONDS, "max_restarts_per_window": 10_000,
                 "max_cordoned_fraction": 0.5, "max_cordons_per_window_fraction": 1.0,
                 "node_cooldown_seconds": 3600.0, "judgement": {"verdict_wait_seconds": 30.0}},
}


class Chaos:
    def __init__(self, run: playing.Run, options: Options, rng: random.Random) -> None:
        self.run = run
        self.c = run.cluster
        self.o = options
        self.rng = rng
        self.loop = asyncio.get_running_loop()
        self.faults: list[Fault] = []
        self.base: dict[str, set[str]] = {job: self.c.pod_uids(job) for job in self.c.jobs}
        """Per job, the pods (not being deleted) of its current generation."""
        self.restarted_at: dict[str, list[float]] = {job: [] for job in self.c.jobs}
        self.tally = Tally()
        self._replicas = 0

    # ------------------------------------------------------------------------------------ observing

    def _sample(self) -> None:
        now = self.loop.time()
        for job in self.c.jobs:
            live = {str(p["metadata"]["uid"]) for p in self.c.job_pods(job) if not p["metadata"].get("deletionTimestamp")}
            if live and not (live & self.base[job]):
                self.restarted_at[job].append(now)  # none of the pods it had is left: restarted
                self.base[job] = live
            elif live > self.base[job]:
                self.base[job] = live  # the operator is still creating this generation's pods
        for fault in self.faults:
            if fault.kind != "node" or fault.outcome or self._cordoned(fault.node):
                continue
            for job in self.c.jobs:
                # only a pod of the generation counted (`base`): a new pod that lands on the node while its
                # job's restart is still under way (an old pod not yet deleted) joins when that restart is
                # seen, in this sample or a later one, so the join never comes before the restart that made it
                if job not in fault.jobs and any(p["spec"].get("nodeName") == fault.node
                                                 and not p["metadata"].get("deletionTimestamp")
                                                 and str(p["metadata"]["uid"]) in self.base[job]
                                                 for p in self.c.job_pods(job)):
                    fault.jobs, fault.joined[job] = (*fault.jobs, job), now

    async def sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._sample()
            await asyncio.sleep(SAMPLE_SECONDS)

    def _at_rest(self, job: str, now: float) -> bool:
        pods = self.c.job_pods(job)
        restarts = self.restarted_at[job]
        return (len(pods) == self.c.size.pods_per_job
                and all((p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                        and not _failed(p) for p in pods)
                and (not restarts or now - restarts[-1] > COOLDOWN_SECONDS + 0.5)
                and not any(f.outcome == "" and job in f.jobs for f in self.faults)
                and {str(p["metadata"]["uid"]) for p in pods} == self.base[job])

    def why_busy(self, job: str, now: float) -> str:
        """Why `job` is not at rest ('' when it is): what a stalled run logs (`chaos_stalled`)."""
        pods = self.c.job_pods(job)
        if len(pods) != self.c.size.pods_per_job:
            return f"{len(pods)} of {self.c.size.pods_per_job} pods"
        for p in pods:
            name = p["metadata"]["name"]
            if p["metadata"].get("deletionTimestamp"):
                return f"{name} terminating"
            if (p.get("status") or {}).get("phase") != "Running":
                return f"{name} {(p.get('status') or {}).get('phase')}"
            if _failed(p):
                return f"{name} failed"
        restarts = self.restarted_at[job]
        if restarts and now - restarts[-1] <= COOLDOWN_SECONDS + 0.5:
            return "in cooldown"
        pending = [f for f in self.faults if f.outcome == "" and job in f.jobs]
        if pending:
            return f"fault on {pending[0].target} pending {now - pending[0].injected:.0f}s"
        if {str(p["metadata"]["uid"]) for p in pods} != self.base[job]:
            return "pods of an earlier generation left beside new ones"
        return ""

    # ------------------------------------------------------------------------------------ injecting

    async def _inject_workload(self) -> bool:
        now = self.loop.time()
        jobs = [j for j in self.c.jobs if self._at_rest(j, now)]
        if not jobs:
            return False
        job = self.rng.choice(jobs)
        pod = self.rng.choice(self.c.running_pods(job))
        name = str(pod["metadata"]["name"])
        record = self.run.fault("container-error", f"Pod {NS}/{name}", "container pytorch exits with code 1")
        self.faults.append(Fault("workload", name, (job,), now, record))
        self.c.kubelets.fail_container(NS, name, cluster_.CONTAINER, exit_code=1, reason="Error",
                                       message="chaos: worker exited")
        self.tally.workload_faults += 1
        return True

    async def _inject_node(self) -> bool:
        now = self.loop.time()
        if not self._node_possible():
            return False
        if not all(self._at_rest(j, now) for j in self.c.jobs):
            return False  # a job coming back from a restart lands its pods on every node, this one too
        cordoned = [n for n in self.c.nodes if self._cordoned(n)]
        nodes = [n for n in self.c.nodes if n not in cordoned and not any(f.node == n for f in self.faults)]
        self.rng.shuffle(nodes)
        for node in nodes:
            jobs = tuple(self.c.jobs_on_node(node))
            if jobs:
                record = self.run.fault("gpu-xid-79", f"Node {node}", "NVML reports XID 79 on GPU 0")
                self.faults.append(Fault("node", node, jobs, now, record, node=node))
                self.c.agents[node].nvml.xid(79, 0)
                self.tally.node_faults += 1
                return True
        return False

    def _node_possible(self) -> bool:
        """Another node fault is within the chaos budget (half the nodes, counting those cordoned)."""
        cordoned = [n for n in self.c.nodes if self._cordoned(n)]
        return len(cordoned) + sum(1 for f in self.faults if f.kind == "node") < int(len(self.c.nodes) * 0.5) \
            and any(n not in cordoned and not any(f.node == n for f in self.faults) for n in self.c.nodes)

    def _cordoned(self, node: str) -> bool:
        return bool(self.c.srv.store.get("nodes", "", node)["spec"].get("unschedulable"))

    async def _kill_leader(self) -> None:
        """Kill the replica leading now; while the Lease is between holders (a renewal that missed its
        deadline on a loaded machine), wait for the next one, up to LEADER_WAIT_SECONDS."""
        deadline = self.loop.time() + LEADER_WAIT_SECONDS
        while (leader := self.c.leader()) is None and self.loop.time() < deadline:  # noqa: ASYNC110  (polling replicas)
            await asyncio.sleep(0.1)
        if leader is None:
            self.run.note("kill", f"no replica led for {LEADER_WAIT_SECONDS:g}s: none killed")
            return
        self.c.kill(leader)
        self._replicas += 1
        self.c.start_replica(f"kcover-controller-chaos-{self._replicas}")
        self.tally.leader_kills += 1
        self.run.note("kill", f"leader {leader.identity} killed (Lease not released); a new replica started")

    # ------------------------------------------------------------------------------------ accounting

    def _resolve(self, *, final: bool = False) -> None:
        """Answer the pending faults from what the cluster holds now. A refusal counts once it has stood for
        twice the cooldown (or at the end): a fault refused and then recovered after all is recovered."""
        for fault in self.faults:
            if fault.outcome:
                continue
            refusal = self._refusal(fault)
            if fault.kind == "node":
                done = self._cordoned(fault.node) and all(
                    any(t > fault.since(j) for t in self.restarted_at[j]) for j in fault.jobs)
            else:
                done = any(t > fault.injected for t in self.restarted_at[fault.jobs[0]])
            if done:
                fault.outcome = "recovered"
                fault.record.recovered_at = clock_.utcnow()
            elif refusal is not None and (final or (clock_.utcnow() - refusal.at).total_seconds() > 2 * COOLDOWN_SECONDS):
                fault.outcome = "refused"
            elif refusal is None and self.loop.time() - fault.injected > RESOLVE_SECONDS:
                # lost: counted now, so that its jobs come to rest again and the run goes on (a lost
                # fault used to hold them busy for good and stall the run)
                fault.outcome = "lost"
                log.warning("chaos_fault_lost", kind=fault.kind, target=fault.target, jobs=list(fault.jobs),
                            waited=round(self.loop.time() - fault.injected, 1),
                            cordoned=self._cordoned(fault.node) if fault.node else None,
                            restarted_since=[j for j in fault.jobs
                                             if any(t > fault.since(j) for t in self.restarted_at[j])])

    def _refusal(self, fault: Fault) -> cluster_.ApiEvent | None:
        names = (*fault.jobs, fault.node)

        def refused(e: cluster_.ApiEvent) -> bool:
            return e.reason in (playing.SKIPPED, "KcoverRecoveryFailed") and e.name in names

        return self.c.api_event(refused, fault.record.injected_at)

    def _count_restarts(self) -> None:
        """Every restart seen must answer a fault injected before it; the others are duplicates or wrong."""
        for job, times in self.restarted_at.items():
            injected = sorted(f.since(job) for f in self.faults if job in f.jobs)
            previous = -1e9
            for at in times:
                self.tally.restarts += 1
                # `previous <= t`: a job joins a node fault at the earliest in the sample that sees the restart
                # that made its pod on the node (`_sample`): that join comes after that restart
                waiting = [t for t in injected if previous <= t < at]
                if not waiting:
                    if at - previous < COOLDOWN_SECONDS * 2:
                        self.tally.duplicates += 1
                        self.tally.detail.append(f"duplicate restart of {job} {at - previous:.1f}s after the last "
                                                 f"(seen at {self._wall(at):%H:%M:%S.%f}; {self._last_fault(job, at)})")
                    else:
                        self.tally.wrongly_touched_pods += self.c.size.pods_per_job
                        self.tally.detail.append(f"restart of {job} with no fault (seen at {self._wall(at):%H:%M:%S.%f})")
                previous = at

    def _last_fault(self, job: str, at: float) -> str:
        """The job's last fault before `at`, and when it called for the job's restart (to tell a miscount
        from kcover acting twice)."""
        before = [f for f in self.faults if job in f.jobs and f.since(job) < at]
        if not before:
            return "no fault on it before"
        last = max(before, key=lambda f: f.since(job))
        joined = f", joined {at - last.since(job):.3f}s before" if job in last.joined else ""
        return f"last fault on it: {last.kind} on {last.target} {at - last.injected:.3f}s before{joined}"

    def _wall(self, at: float) -> dt.datetime:
        """The wall-clock time of loop time `at` (to find a restart in kcover's logs)."""
        return clock_.utcnow() - dt.timedelta(seconds=self.loop.time() - at)

    # ------------------------------------------------------------------------------------ the play

    async def play(self) -> Tally:
        c, o = self.c, self.o
        stop = asyncio.Event()
        sampler = asyncio.create_task(self.sampler(stop), name="chaos:sampler")
        faults = c.srv.faults
        faults.throttle_rate, faults.error_rate, faults.latency_seconds = o.throttle_rate, o.error_rate, o.latency_seconds
        faults.throttle_style = "status"
        self.run.note("chaos", f"API server: {o.throttle_rate:.0%} 429, {o.error_rate:.0%} 500, "
                               f"{o.latency_seconds * 1000:.0f} ms added latency")
        try:
            n = 0
            stalled_since = self.loop.time()
            wanting_node, wanted_at = False, 0.0
            while n < o.faults:
                await asyncio.sleep(self.rng.uniform(*o.interval_seconds))
                self._resolve()
                node = (wanting_node or self.rng.random() < o.node_fault_share) and self._node_possible()
                injected = False
                if node:
                    # every job spans every node: a node fault needs them all at rest, so no workload fault
                    # is injected while one is wanted (for up to NODE_WAIT_SECONDS)
                    if not wanting_node:
                        wanting_node, wanted_at = True, self.loop.time()
                    injected = await self._inject_node()
                    if injected or self.loop.time() - wanted_at >= NODE_WAIT_SECONDS:
                        wanting_node = False
                    elif not injected:
                        continue
                else:
                    wanting_node = False
                if not injected and not await self._inject_workload():
                    now = self.loop.time()
                    if now - stalled_since > 20.0:
                        stalled_since = now
                        log.warning("chaos_stalled", injected=n, jobs={j: self.why_busy(j, now) for j in self.c.jobs})
                    continue
                stalled_since = self.loop.time()
                n += 1
                self.tally.injected = n
                if o.kill_every and n % o.kill_every == 0:
                    await self._kill_leader()
                if o.watch_drop_every and n % o.watch_drop_every == 0:
                    self.tally.watch_drops += 1
                    faults.drop_watches()
                if o.compact_every and n % o.compact_every == 0:
                    self.tally.compactions += 1
                    faults.compact("pods")
                if o.apiserver_restart_every and n % o.apiserver_restart_every == 0:
                    self.tally.apiserver_restarts += 1
                    self.run.note("chaos", "API server restarted (down 1 s)")
                    await c.srv.restart(1.0)
            deadline = self.loop.time() + RESOLVE_SECONDS
            while self.loop.time() < deadline and any(not f.outcome for f in self.faults):
                await asyncio.sleep(0.1)
                self._resolve()
                if all(f.outcome or self._refusal(f) is not None for f in self.faults):
                    break
            await asyncio.sleep(COOLDOWN_SECONDS)  # anything acting twice acts within this
            self._resolve(final=True)
        finally:
            faults.reset()
            stop.set()
            await sampler
        self._count_restarts()
        t = self.tally
        for fault in self.faults:
            if fault.outcome == "recovered":
                t.recovered += 1
            elif fault.outcome == "refused":
                t.refused += 1
            else:
                t.lost += 1
                t.detail.append(f"lost: {fault.kind} on {fault.target} (jobs {', '.join(fault.jobs)})")
        for name, task in [(r.identity, r.task) for r in c.replicas] + [(n, a.task) for n, a in c.agents.items()]:
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                t.crashed += 1
                t.detail.append(playing.clip(f"crashed: {name}: {task.exception()!r}", 300))
        t.api_retries = int(sum(sum(r.kube.retry_stats.retries.values()) for r in c.replicas)
                            + sum(sum(a.kube.retry_stats.retries.values()) for a in c.agents.values()))
        return t


def _failed(pod: dict[str, Any]) -> bool:
    """A container terminated (or waiting after a termination): the pod has a fault now."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if "terminated" in (status.get("state") or {}) or status.get("restartCount"):
            return True
    return False


async def play(run: playing.Run, options: Options, seed: int) -> Tally:
    """Play chaos on `run`'s cluster; records checks (0 lost, 0 duplicates, 0 wrongly touched) and returns the tally."""
    tally = await Chaos(run, options, random.Random(seed)).play()
    run.check(f"{tally.injected} faults injected ({tally.workload_faults} workload, {tally.node_faults} node)",
              tally.injected == options.faults)
    run.check(f"no fault lost ({tally.lost}; recovered {tally.recovered}, refused {tally.refused})", tally.lost == 0,
              "; ".join(tally.detail[:5]))
    run.check(f"no duplicate recovery ({tally.duplicates})", tally.duplicates == 0)
    run.check(f"no pod wrongly touched ({tally.wrongly_touched_pods})", tally.wrongly_touched_pods == 0)
    run.check(f"no kcover replica or agent crashed ({tally.crashed})", tally.crashed == 0,
              playing.clip("; ".join(d for d in tally.detail if d.startswith("crashed")), 500))
    run.note("chaos", f"tally: {tally.as_dict()}", dt.datetime.now(dt.UTC))
    return tally
