"""The fleet replay's world: the physics of faults, Kubernetes' own behaviour, and a clock of events.

Owns `World`, a discrete-event simulation of one fleet under one policy: nodes and their GPUs, jobs
placed one pod per node, the trace's onsets and what follows from them, and the accounting the report
reads (`state`). It is the same for every policy; only the policy (`policy.Policy`) differs. What it models:

* **Faults** (`taxonomy`): a persistent fault fails the job on its node at once and again
  `recur_minutes` (mean, exponential) after every later start of a job there, until the node is
  isolated and repaired; a transient one strikes once (a `notready` one takes the node away for
  `down_hours`); a software bug fails the job it was found in, wherever it runs, `bug_minutes` after each
  start, `bug_failures` times. Every draw comes from a generator seeded by (seed, fault, occurrence), so
  a fault behaves alike under every policy when the same things happen to it.
* **Signals**: an `xid` fault shows its XID to the node's agent and exits the rank on the node; `exit`
  only exits it; `nccl` shows nothing until every rank exits at the NCCL watchdog's timeout; `link`
  shows the node's agent one RDMA port going down and up (the GPU's rail), and every rank exits at the
  watchdog's timeout; `notready`
  takes the node's Ready condition. When no policy restarts a job, the ranks left waiting on a dead peer
  exit at the watchdog's timeout. An XID raised in a process's context (13, 31, 43, 45, 68, 109) appears
  only while a job runs on the GPU; the others appear on idle GPUs too. A `dcgm` fault fails the node's
  hourly diagnostic while it lasts.
* **Kubernetes alone**: the kubelet restarts exited containers in place with its back-off (10 s doubling
  to 300 s), so a job that nobody restarts resumes on the same nodes once every rank has exited (the
  watchdog's timeout plus the back-off), cordoned or not; pods on a NotReady node are replaced after
  `eviction_seconds`. A policy's restart deletes every pod: replacements come `pod_stop_seconds` later
  on the same nodes where they are still schedulable and on the lowest-numbered free ones otherwise
  (a pod lost on a NotReady node only once it is evicted, unless the policy `force_deletes`), and the
  job trains again `restart_minutes` after that; without enough free nodes it waits.
* **People**: a persistent fault left in service is found by a person `person_hours` after its first
  interruption (a dead node after its onset), who cordons the node and restarts its job; a cordoned
  node, once empty, is back `repair_hours` later, repaired (or found healthy) and un-cordoned.
* **Training time**: a job checkpoints every `checkpoint_minutes`; a stop loses the work since the last
  checkpoint (`Interruption.rework`); productive time is run time minus that.

The loop: `await run()` pops events in time order; before each it lets the policy `advance` to that
time (a policy running real code on virtual time does its work there, and may act earlier: then the
loop looks again, and pops the event only once the policy says it reached its time, so an event never
happens before what the policy did up to it). Policies act through `restart_job` and `cordon`, at `now`. It fails only on a bug.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections.abc import Callable, Sequence

from kcover.sim.fleet import policy as pol
from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace as trace_

PROCESS_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs raised in a process's GPU context: seen only while something runs on the GPU."""
BACKOFF_INITIAL = 10.0
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0
"""The kubelet's CrashLoopBackOff: 10 s doubling to 300 s, forgotten after ten minutes of running."""
EXIT_CODE = 1
WATCHDOG_EXIT_CODE = 134
"""A rank aborted by the NCCL watchdog (SIGABRT)."""


class World:
    def __init__(self, params: st.Params, taxonomy: tax.Taxonomy, onsets: Sequence[trace_.Onset],
                 policy: pol.Policy) -> None:
        self.params = params
        self.taxonomy = taxonomy
        self.classes = taxonomy.by_name()
        self.policy = policy
        self.now = 0.0
        self.nodes = [st.Node(i, node_name(i)) for i in range(params.nodes)]
        self.jobs: dict[str, st.Job] = {}
        self.faults: list[st.Fault] = []
        self.interruptions: list[st.Interruption] = []
        self.cordons: list[st.CordonRecord] = []
        self.restarts: dict[str, int] = {"policy": 0, "person": 0, "kubernetes": 0}
        self.unneeded_restarts = 0
        """Restarts by the policy of a job that was running fine."""
        self.repeated_restarts = 0
        """Restarts by the policy of a job that was already being restarted."""
        self.cordoned_series: list[tuple[float, int]] = [(0.0, 0)]
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = 0
        self._free: set[int] = set(range(params.nodes))
        self._pending: list[str] = []
        self._onsets = list(onsets)
        self._place_initial()

    # ------------------------------------------------------------------------------------------ scheduling

    def at(self, when: float, action: Callable[[], object]) -> None:
        """Run `action` at `when` (never before now); awaitables it returns are awaited."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, action))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def _rng(self, *key: object) -> random.Random:
        return random.Random("/".join(str(k) for k in (self.params.seed, *key)))

    async def run(self) -> None:
        await self.policy.attach(self)
        for onset in self._onsets:
            if onset.time <= self.params.horizon:
                self.at(onset.time, functools.partial(self._onset, onset))
        while True:
            when = self._heap[0][0] if self._heap else math.inf
            last = when > self.params.horizon
            reached = await self.policy.advance(self.params.horizon if last else when)
            if not reached or (self._heap and self._heap[0][0] < when) or self.now > when:
                continue  # the policy acted before `when`: look again, and let it go on to `when`
            if last:
                break
            _, _, action = heapq.heappop(self._heap)
            self.now = when
            result = action()
            if hasattr(result, "__await__"):
                await result
        self.now = self.params.horizon
        self._finish()
        await self.policy.close()

    async def _tell(self, notice: st.Notice, cause: st.Fault | None = None) -> None:
        if cause is not None and cause.first_signal is None and not isinstance(notice, st.Placed):
            cause.first_signal = self.now
        await self.policy.notify(notice, cause)

    # ------------------------------------------------------------------------------------------ placement

    def _place_initial(self) -> None:
        self.jobs = st.initial_jobs(self.params)
        for job in self.jobs.values():
            for node in (n for n in job.ranks if n is not None):
                self.nodes[node].job = job.name
                self._free.discard(node)

    def _release(self, job: st.Job, rank: int) -> None:
        node = job.ranks[rank]
        if node is None:
            return
        job.ranks[rank] = None
        n = self.nodes[node]
        n.job = ""
        n.emptied_at = self.now
        self._free.add(node)
        self._maybe_repair(n)

    def _place(self, job: st.Job, *, keep_unusable: bool = False) -> list[tuple[int, int]] | None:
        """Give every rank a node: its own where usable (or kept), free usable ones otherwise. None: not enough."""
        moving = [r for r, node in enumerate(job.ranks)
                  if node is None or (not (keep_unusable and self.nodes[node].ready) and not self.nodes[node].usable)]
        for rank in moving:
            self._release(job, rank)
        free = sorted(n for n in self._free if self.nodes[n].usable)
        if len(free) < len(moving):
            return None
        placed = []
        for rank, node in zip(moving, free, strict=False):
            job.ranks[rank] = node
            self.nodes[node].job = job.name
            self._free.discard(node)
            placed.append((rank, node))
        return placed

    # ------------------------------------------------------------------------------------------ faults

    async def _onset(self, onset: trace_.Onset) -> None:
        cls = self.classes[onset.fault_class]
        fault = st.Fault(len(self.faults), onset, cls)
        self.faults.append(fault)
        node = self.nodes[onset.node]
        node.last_fault = fault
        job = self.jobs.get(node.job) if node.job else None
        if cls.physics is tax.Physics.FOLLOWS_JOB:
            if job is None:
                fault.active = False
                return
            bounds = self.taxonomy.bug_failures
            fault.job, fault.failures_left = job.name, self._rng("bug", fault.id).randint(bounds.min, bounds.max)
            job.bug = fault
            if job.state is st.JobState.RUNNING:
                await self._strike(job, fault, onset.node)
            return
        if cls.physics is tax.Physics.PERSISTENT:
            node.faults.append(fault)
            if cls.dcgm:
                self.at(self._next_diag(node.index), lambda: self._diag(node.index))
        if onset.signal is tax.SignalKind.NOTREADY:
            await self._node_down(node, fault)
            if cls.physics is tax.Physics.TRANSIENT:
                fault.active = False
                self.at(self.now + cls.down_hours * 3600, lambda: self._node_back(node.index))
            else:
                self.at(self.now + self.params.person_hours * 3600, lambda: self._person(fault))
            return
        if job is not None and job.state is st.JobState.RUNNING:
            await self._strike(job, fault, onset.node)
            return
        if onset.signal is tax.SignalKind.XID and onset.xid is not None and onset.xid not in PROCESS_XIDS:
            await self._tell(st.XidSeen(node.index, onset.gpu or 0, onset.xid), fault)
        if cls.physics is tax.Physics.TRANSIENT:
            fault.active = False  # it struck no job: gone

    async def _strike(self, job: st.Job, fault: st.Fault, node: int) -> None:
        """`fault` stops `job` (running) now, signalled as the fault's signal says."""
        onset = fault.onset
        repeat = fault.persistent and fault.interruptions > 0
        fault.interruptions += 1
        if fault.first_interruption is None:
            fault.first_interruption = self.now
            if fault.persistent and not fault.node_dead:
                self.at(self.now + self.params.person_hours * 3600, lambda: self._person(fault))
        if fault.cls.physics is tax.Physics.TRANSIENT:
            fault.active = False
        if fault.cls.physics is tax.Physics.FOLLOWS_JOB:
            fault.failures_left -= 1
            if fault.failures_left <= 0:
                fault.active = False
                job.bug = None
        rank = job.ranks.index(node) if node in job.ranks else 0
        self.nodes[node].last_fault = fault
        nccl = self.params.nccl_timeout_minutes * 60
        down = self._stop(job, fault, repeat=repeat,
                          signal_at=self.now + nccl if onset.signal is tax.SignalKind.NCCL else self.now)
        run = job.run
        if onset.signal is tax.SignalKind.XID and onset.xid is not None:
            await self._tell(st.XidSeen(node, onset.gpu or 0, onset.xid), fault)
        if onset.signal is tax.SignalKind.LINK:
            await self._tell(st.LinkDown(node, onset.gpu or 0), fault)
        if onset.signal in (tax.SignalKind.XID, tax.SignalKind.EXIT):
            await self._tell(st.RankExited(job.name, rank, node, EXIT_CODE,
                                           f"{fault.cls.label or fault.cls.name}: the rank exited"), fault)
            others = [r for r in range(job.size) if r != rank]
        else:
            others = list(range(job.size)) if onset.signal in (tax.SignalKind.NCCL, tax.SignalKind.LINK) else \
                [r for r in range(job.size) if r != rank]
        self.at(self.now + nccl, lambda: self._watchdog(job, run, others, fault))
        self.at(self.now + nccl + self._backoff(job), lambda: self._in_place(job, run, down))

    def _stop(self, job: st.Job, fault: st.Fault | None, *, repeat: bool, signal_at: float) -> st.Interruption:
        ran = self.now - job.started_at
        checkpoint = self.params.checkpoint_minutes * 60
        rework = ran - math.floor(ran / checkpoint) * checkpoint if checkpoint > 0 else 0.0
        job.productive += ran - rework
        job.progress.append((self.now, job.productive))
        if ran >= BACKOFF_RESET:
            job.streak = 0
        down = st.Interruption(job.name, self.now, fault, repeat=repeat, signal_at=signal_at, rework=rework)
        self.interruptions.append(down)
        job.state, job.down = st.JobState.DOWN, down
        job.run += 1
        return down

    def _backoff(self, job: st.Job) -> float:
        return min(BACKOFF_MAX, BACKOFF_INITIAL * 2.0 ** job.streak)

    async def _watchdog(self, job: st.Job, run: int, ranks: list[int], fault: st.Fault) -> None:
        """Ranks still waiting on a dead peer abort (nobody restarted the job since)."""
        if job.run != run:
            return
        for rank in ranks:
            node = job.ranks[rank]
            if node is not None and self.nodes[node].ready:
                await self._tell(st.RankExited(job.name, rank, node, WATCHDOG_EXIT_CODE,
                                               "NCCL watchdog timeout: a collective did not complete"), fault)

    async def _in_place(self, job: st.Job, run: int, down: st.Interruption) -> None:
        """Kubernetes' own recovery: every rank restarted in place; lost pods replaced once evicted."""
        if job.run != run:
            return
        job.streak += 1
        job.run += 1
        self.restarts["kubernetes"] += 1
        down.decided_at, down.by = self.now, "kubernetes"
        await self._start(job, keep_cordoned=True)

    async def _start(self, job: st.Job, *, keep_cordoned: bool) -> None:
        """Place the job's pods (waiting for evictions and free nodes) and train again after the restart cost."""
        lost = [self.nodes[n] for n in job.ranks if n is not None and not self.nodes[n].ready]
        if lost and not self.policy.force_deletes:
            blocked = max((n.notready_since or self.now) + self.params.eviction_seconds for n in lost)
            if blocked > self.now:
                run = job.run
                job.state = st.JobState.RESTARTING
                self.at(blocked, lambda: self._start(job, keep_cordoned=keep_cordoned) if job.run == run else None)
                return
        moved = self._place(job, keep_unusable=keep_cordoned)
        if moved is None:
            job.state = st.JobState.PENDING
            if job.pending_since is None:
                job.pending_since = self.now
            if job.name not in self._pending:
                self._pending.append(job.name)
            return
        if job.pending_since is not None and job.down is not None:
            job.down.pending += self.now - job.pending_since
        job.pending_since = None
        job.state = st.JobState.RESTARTING
        # a restart in place keeps the pods that were not lost; any other restart deleted them all
        placed = moved if keep_cordoned else [(r, n) for r, n in enumerate(job.ranks) if n is not None]
        if placed:
            await self._tell(st.Placed(job.name, tuple(placed)))
        run = job.run
        self.at(self.now + self.params.restart_minutes * 60, lambda: self._resume(job, run))

    def _resume(self, job: st.Job, run: int) -> None:
        if job.run != run or job.state is not st.JobState.RESTARTING:
            return
        job.state, job.started_at = st.JobState.RUNNING, self.now
        if job.down is not None:
            job.down.resumed_at = self.now
            job.down = None
        for node in {n for n in job.ranks if n is not None}:
            for fault in self.nodes[node].faults:
                if fault.active:
                    delay = self._rng("recur", fault.id, fault.interruptions).expovariate(
                        1.0 / (fault.cls.recur_minutes * 60))
                    self.at(self.now + delay, functools.partial(self._recur, job, run, fault, node))
        if job.bug is not None and job.bug.active:
            bug = job.bug
            delay = self._rng("bug", bug.id, bug.interruptions).expovariate(1.0 / (self.taxonomy.bug_minutes * 60))
            self.at(self.now + delay, lambda: self._recur(job, run, bug, self._bug_node(job, bug)))

    def _bug_node(self, job: st.Job, bug: st.Fault) -> int:
        """Which rank a bug crashes this time: any of the job's, drawn per occurrence."""
        nodes = [n for n in job.ranks if n is not None]
        return nodes[self._rng("bug-rank", bug.id, bug.interruptions).randrange(len(nodes))]

    async def _recur(self, job: st.Job, run: int, fault: st.Fault, node: int) -> None:
        if job.run != run or job.state is not st.JobState.RUNNING or not fault.active:
            return
        if fault.cls.physics is not tax.Physics.FOLLOWS_JOB and node not in job.ranks:
            return
        await self._strike(job, fault, node)

    # ------------------------------------------------------------------------------------------ nodes

    async def _node_down(self, node: st.Node, fault: st.Fault) -> None:
        went = node.ready
        node.ready, node.notready_since = False, self.now if went else node.notready_since
        job = self.jobs.get(node.job) if node.job else None
        if job is not None and job.state is st.JobState.RUNNING:
            await self._strike(job, fault, node.index)
        if went:
            await self._tell(st.NodeReadiness(node.index, False), fault)
        self.at(self.now + self.params.eviction_seconds, lambda: self._evict(node.index))

    async def _evict(self, index: int) -> None:
        node = self.nodes[index]
        if node.ready or not node.job:
            return
        job = self.jobs[node.job]
        if job.state is st.JobState.RUNNING:
            return  # not this job's fault (it left and came back): nothing lost here
        self._release(job, job.ranks.index(index))

    async def _node_back(self, index: int) -> None:
        node = self.nodes[index]
        if node.ready or any(f.node_dead for f in node.faults):
            return
        node.ready, node.notready_since = True, None
        await self._tell(st.NodeReadiness(index, True))
        await self._retry_pending()

    def _next_diag(self, index: int) -> float:
        interval = self.params.diag_interval_seconds
        phase = index * interval / max(1, self.params.nodes)
        return phase + math.ceil((self.now - phase) / interval + 1e-9) * interval

    def diag_fails(self, index: int) -> bool:
        """A `dcgmi diag` on the node now fails: a DCGM-visible fault lasts there."""
        return any(f.active and f.cls.dcgm for f in self.nodes[index].faults)

    async def _diag(self, index: int) -> None:
        node = self.nodes[index]
        bad = [f for f in node.faults if f.active and f.cls.dcgm]
        gpu = next((f.onset.gpu for f in bad if f.onset.gpu is not None), 0)
        await self._tell(st.DiagResult(index, gpu, failed=bool(bad)), bad[0] if bad else None)

    # ------------------------------------------------------------------------------------------ actions

    async def restart_job(self, name: str, *, by: str = "policy") -> None:
        """Delete every pod of the job now; replacements follow (see the module docstring). A job running
        fine loses its work since the last checkpoint (`unneeded_restarts`); one already restarting starts
        over (`repeated_restarts`)."""
        job = self.jobs[name]
        if job.state is st.JobState.RUNNING:
            self.unneeded_restarts += by == "policy"
            self._stop(job, None, repeat=False, signal_at=self.now)
        elif job.state is not st.JobState.DOWN:
            self.repeated_restarts += by == "policy"
            if name in self._pending:
                self._pending.remove(name)
        job.run += 1
        self.restarts[by] += 1
        if job.down is not None and job.down.decided_at is None:
            job.down.decided_at, job.down.by = self.now, by
        job.state = st.JobState.RESTARTING
        run = job.run
        self.at(self.now + self.params.pod_stop_seconds,
                lambda: self._start(job, keep_cordoned=False) if job.run == run else None)

    async def cordon(self, index: int, *, by: str = "policy", cause: str = "") -> None:
        node = self.nodes[index]
        if node.cordoned_by:
            return
        node.cordoned_by, node.cordoned_at = by, self.now
        bad = [f for f in node.faults if f.active]
        self.cordons.append(st.CordonRecord(index, self.now, by, healthy=not bad and node.ready, cause=cause,
                                            fault=node.last_fault))
        for fault in bad:
            if fault.isolated_at is None:
                fault.isolated_at, fault.isolated_by = self.now, by
        self._count_cordoned()
        if by == "person":
            await self._tell(st.PersonCordoned(index))
        self._maybe_repair(node)

    async def uncordon(self, index: int) -> None:
        """The policy returns a node it cordoned to service (kcover with `recovery.uncordon_enabled`)."""
        node = self.nodes[index]
        if node.cordoned_by != "policy" or node.repair_until is not None:
            return
        self._returned(node)
        await self._retry_pending()

    async def _person(self, fault: st.Fault) -> None:
        if not fault.active or fault.isolated_at is not None:
            return
        node = self.nodes[fault.onset.node]
        if node.cordoned_by:
            return
        await self.cordon(node.index, by="person", cause=f"a person found {fault.cls.name}")
        if node.job:
            await self.restart_job(node.job, by="person")

    def _maybe_repair(self, node: st.Node) -> None:
        if node.cordoned_by and not node.job and node.repair_until is None:
            node.repair_until = self.now + self.params.repair_hours * 3600
            self.at(node.repair_until, lambda: self._repaired(node.index))

    async def _repaired(self, index: int) -> None:
        node = self.nodes[index]
        had_dcgm = any(f.cls.dcgm for f in node.faults)
        for fault in node.faults:
            fault.active, fault.repaired_at = False, self.now
        node.faults = []
        self._returned(node)
        if not node.ready:
            node.ready, node.notready_since = True, None
            await self._tell(st.NodeReadiness(index, True))
        await self._tell(st.NodeReturned(index))
        if had_dcgm:
            self.at(self._next_diag(index), lambda: self._diag(index))
        await self._retry_pending()

    def _returned(self, node: st.Node) -> None:
        record = next((c for c in reversed(self.cordons) if c.node == node.index and c.returned_at is None), None)
        if record is not None:
            record.returned_at = self.now
            if record.healthy:
                record.idle_seconds = self.now - max(record.at, node.emptied_at or record.at)
        node.cordoned_by, node.cordoned_at, node.repair_until = "", None, None
        self._count_cordoned()

    async def _retry_pending(self) -> None:
        for name in list(self._pending):
            job = self.jobs[name]
            if job.state is not st.JobState.PENDING:
                self._pending.remove(name)
                continue
            before = len(self._pending)
            self._pending.remove(name)
            await self._start(job, keep_cordoned=False)
            if len(self._pending) >= before:
                break  # still no room: the later ones wait behind it

    def _count_cordoned(self) -> None:
        self.cordoned_series.append((self.now, sum(1 for n in self.nodes if n.cordoned_by)))

    # ------------------------------------------------------------------------------------------ the end

    def _finish(self) -> None:
        for job in self.jobs.values():
            if job.state is st.JobState.RUNNING:
                job.productive += self.now - job.started_at
            job.progress.append((self.now, job.productive))
        for record in self.cordons:
            if record.returned_at is None and record.healthy:
                node = self.nodes[record.node]
                record.idle_seconds = self.now - max(record.at, node.emptied_at or record.at) if not node.job else 0.0


def node_name(index: int) -> str:
    return f"node-{index:04d}"
