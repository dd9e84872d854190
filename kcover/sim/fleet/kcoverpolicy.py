"""kcover in the fleet replay: the real controller on the in-process simulated API server, on virtual time.

Owns `KcoverPolicy`, the `policy.Policy` whose decisions are kcover's own. It builds a
`controller.running.Controller` as the product does (cache, bus, detector supervisor, and the engine
from `controller.recovering.build`: plan, coordinator, gateway, ledger, hooks), over a `SimServer(listen=
False)` whose clock is the virtual loop's (`virtualtime`), and keeps that server a mirror of the world:
the fleet's nodes (with the agent pods and the healthy agent condition a running agent leaves), its
PyTorchJobs and their pods, each rank's exit as the kubelet writes it, Ready conditions, and the agents'
reports (`agents`: their real XID policy, DCGM reading and reporter). kcover's writes come back to the
world from what the server holds, never from what kcover says it did: a job pod kcover started deleting
is the job's restart (once per generation of its pods), a node it cordoned (spec.unschedulable with its
`kcover.io/cordoned-by` annotation) a cordon, its un-cordon an un-cordon. A coordinator hook of its own
(`Observer`) counts every step's outcome, for the figures only the engine knows (refusals by code,
holds, the breaker).

What runs as in production: the cache's reflectors (watch timeouts long, as nothing times out on a
quiet virtual day), the pod-status and event-watcher detectors under their supervisor, the bus, the
engine. What the replay drives instead of its own loop, with the reason:
* the node-condition detector: its loop ticks every `tick_seconds` (2 s) for ever, 2.3 million wake-ups
  in 54 days; the replay calls its change handler from the cache and its re-check every `tick_seconds`
  only while a node is waiting out a duration (`_waiting`), which is when the tick does anything;
* the engine's periodic pass (`resume`, every `recovery.resume_interval_seconds`) runs at that interval
  while the ledger holds held or pending restarts or the engine has faults to retry, drains or
  validations open, and not otherwise (a pass with none of those does nothing);
* the Recovery writer's loop (a 0.5 s poll) is replaced by `recorder.flush()` after every batch and pass.
Settings differ from the defaults only where the replay needs it, each said in `REPLAY_SETTINGS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from kcover import metrics as metrics_
from kcover import serving, settings, validationcodec
from kcover.agent import reporting
from kcover.aio import clock as clock_
from kcover.controller import recovering
from kcover.controller import running as controller_running
from kcover.detectors import contract, node_condition
from kcover.kube import caching, indexing, projecting, retrying, watching
from kcover.kube import projections as proj
from kcover.nvml import xid_policy
from kcover.recovery import steps as st
from kcover.sim import behaviour, tables
from kcover.sim import server as simserver
from kcover.sim.fleet import agents as agents_
from kcover.sim.fleet import state
from kcover.sim.fleet import world as world_

log = structlog.get_logger()

START = dt.datetime(2025, 6, 1, 0, 0, 0, tzinfo=dt.UTC)
"""Wall time at the replay's second 0."""
NAMESPACE = "ml"
CONTAINER = "pytorch"
KIND_KEY = "pytorchjobs.kubeflow.org"
REPLAY_SETTINGS: dict[str, Any] = {
    # one replica: leader election is not what is measured, and a Lease renewed every 2 s for 54 days is
    # 2.3 million writes
    "lease": {"enabled": False},
    # the fleet runs PyTorchJobs only: the other kinds' reflectors would list and watch nothing (the cache
    # freezes the GC after its first sync, as the product's does: `running.replay` unfreezes it after)
    "kube": {"workload_kinds": [KIND_KEY]},
    # copying logs writes files and decides nothing; verification decides nothing either (it writes the
    # Recovered/Stalled Events) and re-reads every pod of the unit on each pod change: a 1,024-pod
    # restart is about a million selector matches, which is most of the replay's time (docs/performance.md)
    "recovery": {"save_logs": {"enabled": False}, "verify": {"enabled": False}},
    # driven by the replay (see the module docstring); no DRA devices in the fleet
    "detectors": {"entries": {"node-condition": {"enabled": False}, "dra-health": {"enabled": False}}},
}
REFLECTORS = watching.ReflectorOptions(watch_timeout_seconds=7 * 86400, inactivity_timeout_seconds=14 * 86400.0)
_NODE_MARK = "@node@"
_TIME_MARK = "@time@"
EVENT_TTL_SECONDS = 3600.0
"""The API server's default --event-ttl: Events older than this are deleted (every hour)."""


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


def replay_settings(overrides: Mapping[str, Any] | None = None) -> settings.Settings:
    """kcover's defaults with `REPLAY_SETTINGS`, then `overrides` (`--set`)."""
    return settings.Settings.model_validate(_merge(REPLAY_SETTINGS, overrides or {}))


def pod_name(job: str, rank: int) -> str:
    return f"{job}-master-0" if rank == 0 else f"{job}-worker-{rank - 1}"


@dataclass
class Observer:
    """A coordinator hook counting every step's outcome (step name, result: `done`, `failed` or a code)."""

    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)

    def after(self, step: st.Step, outcome: st.Outcome) -> list[st.Step]:
        key = (st.name_of(step), st.result_of(outcome))
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        return []


class KcoverPolicy:
    name = "kcover"
    force_deletes = False

    def __init__(self, params: state.Params, *, overrides: Mapping[str, Any] | None = None) -> None:
        self.params = params
        self.settings = replay_settings(overrides)
        self.observer = Observer()
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._actions: list[tuple[float, str, int | str, str]] = []
        self._acted = asyncio.Event()
        self._kick = asyncio.Event()
        self._pods: dict[str, tuple[str, int]] = {}
        """Live pod uid -> (job, rank); dropped once a deletion of it was taken as its job's restart."""
        self._uids: dict[tuple[str, int], str] = {}
        self._ranks: dict[str, tuple[str, int]] = {}
        """Pod name -> (job, rank)."""
        self._jobs_raw: dict[str, dict[str, Any]] = {}
        self._pod_raw: dict[tuple[str, int], bytes] = {}
        self.agents: dict[int, agents_.Agent] = {}
        self.passes = 0
        self.batches = 0
        self.seconds: dict[str, float] = {"engine_batches": 0.0, "engine_passes": 0.0, "mirror": 0.0}
        """Wall seconds inside the engine's batches and passes (plans, writes, what other tasks ran meanwhile)
        and inside the mirror's writes: where the replay's time goes (`kcover_*_seconds` in the report)."""

    # ------------------------------------------------------------------------------------------ building

    async def attach(self, world: world_.World) -> None:
        self.world = world
        self.clock = clock_.FakeClock(START, follow_loop=True)
        self.srv = await self._stack.enter_async_context(
            simserver.SimServer(listen=False, clock=self.clock, seed=self.params.seed, bookmark_interval=86400.0,
                               liveness_interval=86400.0))
        self.store = self.srv.store
        self._seed()
        cfg = self.settings
        self.kube = self.srv.client(retry=retrying.policy_from(cfg.kube))
        self._stack.push_async_callback(self.kube.close)
        self.metrics = metrics_.Metrics(role=metrics_.CONTROLLER, process=False)
        cache = caching.ClusterCache(self.kube, workload_kinds=caching.workload_kinds(cfg.kube.workload_kinds),
                                     watch_events=cfg.kube.watch_events, options=REFLECTORS,
                                     controls=(cfg.recovery.ledger_namespace, cfg.recovery.controls_name))
        self.controller = controller_running.Controller(cfg, client=self.kube, metrics=self.metrics,
                                                        health=serving.Health(), clock=self.clock, cache=cache)
        self.cache = cache
        engine = self.controller.engine
        assert isinstance(engine, recovering.LeaderEngine)
        self.engine = engine
        self.engine.inner.coordinator.hooks.insert(0, self.observer)
        self.xid_policy = xid_policy.load(cfg.agent.xid_policy_file)
        self.agent_metrics = metrics_.Metrics(role=metrics_.AGENT, process=False)
        self._conditions = self._node_condition_detector()
        self._spawn(cache.run(self._stop), "cache")
        await cache.wait_synced()
        self._spawn(self.controller.supervisor.run(self._stop), "detectors")
        self._spawn(self._watch_pods(), "watch-pods")
        self._spawn(self._watch_nodes(), "watch-nodes")
        self._spawn(self._consume(), "consume")
        self._spawn(self._passes(), "passes")
        self._spawn(self._expire_events(), "event-ttl")
        await asyncio.sleep(1.0)  # the detectors subscribe to the cache
        await self.engine.resume()  # the term's first pass, as the controller runs it
        await self.engine.recorder.flush()

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=f"fleet:kcover:{name}"))

    def _seed(self) -> None:
        store, now = self.store, clock_.rfc3339(self.clock.now())
        agent_ns = self.settings.agent.event_namespace
        for namespace in sorted({NAMESPACE, agent_ns, self.settings.recovery.ledger_namespace}):
            if not store.namespace_exists(namespace):
                store.create("namespaces", {"metadata": {"name": namespace}, "status": {"phase": "Active"}})
        gpus = str(self.params.gpus_per_node)
        for node in self.world.nodes:
            resources = {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": gpus, "pods": "110"}
            store.create("nodes", {
                "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name,
                                                           "nvidia.com/gpu.present": "true"}},
                "spec": {},
                "status": {"capacity": resources, "allocatable": resources, "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": now},
                    {"type": self.settings.agent.condition_type, "status": "True", "reason": reporting.HEALTHY_REASON,
                     "message": "kcover agent sees no GPU fault on this node", "lastTransitionTime": now}]}})
            store.create("pods", {
                "metadata": {"name": f"kcover-agent-{node.name}", "namespace": agent_ns,
                             "labels": {"app.kubernetes.io/name": "kcover", "app.kubernetes.io/component": "agent"}},
                "spec": {"nodeName": node.name, "containers": [{"name": "agent", "image": "kcover-agent"}]},
                "status": {"phase": "Running"}})
        for job in self.world.jobs.values():
            body = store.create(KIND_KEY, {
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": job.name, "namespace": NAMESPACE, "labels": {proj.OPT_IN_LABEL: "true"}},
                "spec": {"pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": self._template()},
                    **({"Worker": {"replicas": job.size - 1, "restartPolicy": "OnFailure",
                                   "template": self._template()}} if job.size > 1 else {})}}})
            self._jobs_raw[job.name] = body
            for rank, where in enumerate(job.ranks):
                assert where is not None
                self._create_pod(job.name, rank, where, now)

    def _template(self) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": CONTAINER, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                         "resources": {"limits": {"nvidia.com/gpu": str(self.params.gpus_per_node)}}}]}}

    def _create_pod(self, job: str, rank: int, node: int, now: str) -> None:
        """The pod the operator recreates for the rank, bound to `node`, as its kubelet runs it. The shape is
        `behaviour`'s, built once per rank (`_pod_raw`) and stamped with the node and the time."""
        raw = self._pod_raw.get((job, rank))
        if raw is None:
            rtype, index = ("Master", 0) if rank == 0 else ("Worker", rank - 1)
            pod = behaviour.replica_pod(self._jobs_raw[job], "PyTorchJob", rtype, index, self._template())
            pod["spec"]["nodeName"] = _NODE_MARK
            pod["status"] = behaviour.running_status(pod, _TIME_MARK)
            raw = self._pod_raw[(job, rank)] = orjson.dumps(pod)
        body = orjson.loads(raw.replace(_NODE_MARK.encode(), world_.node_name(node).encode())
                            .replace(_TIME_MARK.encode(), now.encode()))
        created = self.store.create("pods", body)
        uid = created["metadata"]["uid"]
        self._pods[uid] = (job, rank)
        self._uids[(job, rank)] = uid
        self._ranks[created["metadata"]["name"]] = (job, rank)

    def _node_condition_detector(self) -> node_condition.NodeConditionDetector:
        config = node_condition.NodeConditionConfig.model_validate(
            self.settings.detectors.entries["node-condition"].config)
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=self.metrics, clock=self.clock,
                                           cluster=self.cache, gateway=self.kube,
                                           namespace=self.settings.recovery.ledger_namespace,
                                           agent_condition_type=self.settings.agent.condition_type)
        detector = node_condition.NodeConditionDetector("node-condition", config, context)
        detector._bus = self.controller.bus
        wake = asyncio.Event()

        def on_change(kind: indexing.Kind, old: Any, new: Any) -> None:
            detector._on_change(kind, old, new)
            if detector._waiting:
                wake.set()

        self.cache.subscribe(on_change, replay=False)

        async def ticks() -> None:
            while True:
                await wake.wait()
                wake.clear()
                while detector._waiting:
                    await asyncio.sleep(config.tick_seconds)
                    detector._recheck_waiting(self.cache)

        self._spawn(ticks(), "node-condition")
        return detector

    # ------------------------------------------------------------------------------------------ kcover's work

    async def _consume(self) -> None:
        sub = self.controller.subscription
        while batch := await sub.get_batch():
            started = time.perf_counter()
            await self.engine.handle(batch)
            await self.engine.recorder.flush()
            self.seconds["engine_batches"] += time.perf_counter() - started
            self.batches += 1
            self._kick.set()

    def _outstanding(self) -> bool:
        inner = self.engine.inner
        ledger = self.engine.ledger
        return bool(ledger.held() or ledger.pending() or inner.kept or inner.coordinator.drainer.drains
                    or inner.coordinator.validations.open)

    async def _passes(self) -> None:
        interval = self.settings.recovery.resume_interval_seconds
        while True:
            await self._kick.wait()
            self._kick.clear()
            while self._outstanding():
                await asyncio.sleep(interval)
                started = time.perf_counter()
                await self.engine.resume()
                await self.engine.recorder.flush()
                self.seconds["engine_passes"] += time.perf_counter() - started
                self.passes += 1

    async def _expire_events(self) -> None:
        while True:
            await asyncio.sleep(EVENT_TTL_SECONDS)
            cutoff = self.clock.now() - dt.timedelta(seconds=EVENT_TTL_SECONDS)
            for event in list(self.store.iter_objects("events")):
                meta = event["metadata"]
                stamp = event.get("eventTime") or event.get("lastTimestamp") or meta.get("creationTimestamp")
                with contextlib.suppress(ValueError, KeyError):
                    if stamp and clock_.parse_time(str(stamp)) < cutoff:
                        self.store.delete("events", meta["namespace"], meta["name"])

    # ------------------------------------------------------------------------------------------ what kcover wrote

    async def _watch_pods(self) -> None:
        watcher = self.store.watch("pods", tables.Filter(namespace=NAMESPACE), self.store.resource_version)
        while (change := await watcher.queue.get()) is not None:
            if change.type != "MODIFIED" or change.old is None:
                continue
            if b'"deletionTimestamp"' not in change.new.raw or b'"deletionTimestamp"' in change.old.raw:
                continue
            rank = self._ranks.get(change.new.name)
            uid = self._uids.get(rank) if rank is not None else None
            # the pod by that name now is the one terminating when its uid is in the object (none of its
            # owner's uids is a pod's): read without decoding the object
            found = self._pods.get(uid) if uid is not None and uid.encode() in change.new.raw else None
            if found is None:
                continue  # a pod of a generation whose restart was already taken
            job = found[0]
            for other in [u for u, (j, _) in self._pods.items() if j == job]:
                del self._pods[other]
            self._act("restart", job, "")

    async def _watch_nodes(self) -> None:
        watcher = self.store.watch("nodes", tables.Filter(), self.store.resource_version)
        while (change := await watcher.queue.get()) is not None:
            if change.type != "MODIFIED" or change.old is None:
                continue
            new, old = projecting.node(change.new.obj()), projecting.node(change.old.obj())
            index = int(new.name.rsplit("-", 1)[1])
            request = validationcodec.decode_validation_request(dict(new.annotations))
            if request is not None and request != validationcodec.decode_validation_request(dict(old.annotations)):
                self._agent(index).validate(request)
            if new.unschedulable and new.cordoned_by_kcover and not old.cordoned_by_kcover:
                self._act("cordon", index, proj.get(new.annotations, proj.CORDON_REASON) or "")
            elif old.cordoned_by_kcover and not new.cordoned_by_kcover and not new.unschedulable \
                    and self.world.nodes[index].cordoned_by == "policy":
                self._act("uncordon", index, "")

    def _act(self, kind: str, target: int | str, detail: str) -> None:
        self._actions.append((asyncio.get_running_loop().time(), kind, target, detail))
        self._acted.set()

    async def advance(self, until: float) -> bool:
        loop = asyncio.get_running_loop()
        while True:
            if self._actions:
                actions, self._actions = self._actions, []
                for at, kind, target, detail in actions:
                    self.world.now = max(self.world.now, at)
                    if kind == "restart":
                        await self.world.restart_job(str(target))
                    elif kind == "cordon":
                        await self.world.cordon(int(target), cause=detail)
                    else:
                        await self.world.uncordon(int(target))
                return False
            if loop.time() >= until:
                return True
            self._acted.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acted.wait(), until - loop.time())

    # ------------------------------------------------------------------------------------------ the mirror

    async def notify(self, notice: state.Notice, cause: state.Fault | None) -> None:
        started = time.perf_counter()
        try:
            await self._mirror(notice)
        finally:
            self.seconds["mirror"] += time.perf_counter() - started

    async def _mirror(self, notice: state.Notice) -> None:
        now = clock_.rfc3339(self.clock.now())
        if isinstance(notice, state.RankExited):
            name = pod_name(notice.job, notice.rank)
            with contextlib.suppress(Exception):
                self.store.mutate("pods", NAMESPACE, name, lambda pod: pod.update(status=behaviour.failed_container_status(
                    pod, CONTAINER, now, exit_code=notice.exit_code, message=notice.message)))
        elif isinstance(notice, state.Placed):
            for rank, node in notice.ranks:
                name = pod_name(notice.job, rank)
                old = self._uids.pop((notice.job, rank), None)
                if old is not None:
                    self._pods.pop(old, None)
                with contextlib.suppress(Exception):
                    self.store.delete("pods", NAMESPACE, name, grace_seconds=0)
                self._create_pod(notice.job, rank, node, now)
        elif isinstance(notice, state.XidSeen):
            await self._agent(notice.node).xid(notice.gpu, notice.xid)
        elif isinstance(notice, state.LinkDown):
            await self._agent(notice.node).link_down(notice.port)
        elif isinstance(notice, state.DiagResult):
            await self._agent(notice.node).diag()
        elif isinstance(notice, state.NodeReadiness):
            self.store.mutate("nodes", "", world_.node_name(notice.node), lambda n: _set_ready(n, notice.ready, now))
        elif isinstance(notice, state.PersonCordoned):
            self.store.mutate("nodes", "", world_.node_name(notice.node),
                              lambda n: n.setdefault("spec", {}).update(unschedulable=True))
        elif isinstance(notice, state.NodeReturned):
            self.store.mutate("nodes", "", world_.node_name(notice.node), lambda n: self._uncordoned(n))
            agent = self.agents.get(notice.node)
            if agent is not None:
                await agent.repaired()

    def _uncordoned(self, node: dict[str, Any]) -> None:
        """What a person does returning a node: `kubectl uncordon` and kcover's taint and annotations off."""
        spec = node.setdefault("spec", {})
        spec.pop("unschedulable", None)
        taints = [t for t in spec.get("taints") or [] if t.get("key") != self.settings.recovery.taint_key]
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        annotations = node["metadata"].get("annotations") or {}
        node["metadata"]["annotations"] = {k: v for k, v in annotations.items() if not k.startswith("kcover.io/cordon")}

    def _agent(self, index: int) -> agents_.Agent:
        agent = self.agents.get(index)
        if agent is None:
            async def pods() -> list[str]:
                job = self.world.nodes[index].job
                if not job:
                    return []
                ranks = self.world.jobs[job].ranks
                return [f"{NAMESPACE}/{pod_name(job, ranks.index(index))}"] if index in ranks else []

            agent = self.agents[index] = agents_.Agent(
                world_.node_name(index), self.params.gpus_per_node, client=self.kube, clock=self.clock,
                config=self.settings, policy=self.xid_policy, metrics=self.agent_metrics, pods=pods,
                diag_fails=lambda: self.world.diag_fails(index))
        return agent

    async def close(self) -> None:
        self._stop.set()
        await self.controller.bus.close(drain_timeout_seconds=0.0)
        for agent in self.agents.values():
            await agent.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()


def _set_ready(node: dict[str, Any], ready: bool, now: str) -> None:
    status = node.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
    conditions.insert(0, {"type": "Ready", "status": "True" if ready else "Unknown",
                          "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                          "message": "" if ready else "Kubelet stopped posting node status.",
                          "lastTransitionTime": now})
    status["conditions"] = conditions
    taints = behaviour.ready_taints(node)
    if taints is not None:
        spec = node.setdefault("spec", {})
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
