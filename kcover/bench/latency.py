"""Fault-to-detection and fault-to-action latency, the watch-delivery floor, and API cost per recovery.

Owns one scenario run against any API server (the simulated one in a child process, or a real
cluster): it seeds through the API, runs a whole controller (cache, detectors, bus, recovery engine;
no Lease, so its renewals do not pollute the request counts) and, for XIDs, a whole node agent with
the fake NVML backend, in this process, and times from the fault's write to

* detection: the detector's `CollectorEvent` arriving on a bench subscription of the controller's bus;
* action: the controller's client receiving the API server's answer to the action's write
  (DeleteCollection of the job's pods, or the cordon write of the node).

Faults: a container terminated with `Error` (pod-status), a DRA device turned `Unhealthy`
(dra-health), and XID 79 in the fake NVML (agent -> Node condition and need-recovery Event ->
controller -> cordon). Each sample uses its own job or node, so cooldowns never interfere. The
floor is the same server delivering a plain status write to a plain aiohttp watch, interleaved
with the faults. Settings are the product defaults except where noted in `bench_settings`.

How it fails: a sample that sees no detection or action within `sample_timeout` raises
`errors.KcoverError` (the bench failed, exit 1); API errors propagate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kcover import errors, metrics, model, serving, settings
from kcover.agent import running as agent_running
from kcover.bench import objects, rawapi, seeding
from kcover.controller import running as controller_running
from kcover.kube import client as client_
from kcover.kube import retrying, transport
from kcover.nvml import fake

log = structlog.get_logger()

NS = "kcover-bench"
CONDITION = "KcoverGPUHealthy"


class TimedClient(client_.KubeClient):
    """The real client, noting when the API server answered each write (instrumentation, not a fake)."""

    def __init__(self, api: transport.Transport, *, request_timeout: float = 30.0) -> None:
        super().__init__(api, request_timeout=request_timeout)
        self.writes: list[tuple[float, str, str, str]] = []
        """(perf_counter at the answer, method, path, labelSelector)."""
        self.changed = asyncio.Event()

    async def request(self, method: str, path: str, *, query: client_.Query | None = None, body: Any = None,
                      content_type: str | None = None, timeout: float | None = None, deadline: float | None = None,
                      fence: retrying.Fence | None = None, retry: bool = True,
                      answer: Callable[[errors.KubeError], bool] | None = None) -> Any:
        result = await super().request(method, path, query=query, body=body, content_type=content_type,
                                       timeout=timeout, deadline=deadline, fence=fence, retry=retry, answer=answer)
        if method != "GET":
            selector = str(dict(query or {}).get("labelSelector", "")) if isinstance(query, Mapping) else ""
            self.writes.append((time.perf_counter(), method, path, selector))
            self.changed.set()
        return result

    async def first(self, match: Callable[[str, str, str], bool], *, since: float, timeout: float) -> float:
        """The answer time of the first write after `since` that `match(method, path, selector)`."""
        return await self.when(lambda writes: next((at for at, m, p, s in writes if match(m, p, s)), None),
                               since=since, timeout=timeout)

    async def when(self, done: Callable[[list[tuple[float, str, str, str]]], float | None], *, since: float,
                   timeout: float) -> float:
        """The time `done` finds in the writes answered after `since` (waiting until it finds one)."""
        async with asyncio.timeout(timeout):
            while True:
                found = done([w for w in self.writes if w[0] >= since])
                if found is not None:
                    return found
                self.changed.clear()
                await self.changed.wait()


def restarted(job: seeding.Job, *, spared: Sequence[str] = ()) -> Callable[[list[tuple[float, str, str, str]]], float | None]:
    """When the restart of `job` was answered: its DeleteCollection (a selector naming the job), or the
    last of one DELETE per pod (the executor deletes the recorded pods one by one, uid preconditions) but
    the `spared` ones (a pod that failed under `restartPolicy: Never` is left to its controller)."""
    base = seeding.pods_path(job.namespace)
    label = f"{objects.JOB_NAME}={job.name}"
    taken = [p for p in job.pods if p not in spared]

    def answered(writes: list[tuple[float, str, str, str]]) -> float | None:
        per_pod: dict[str, float] = {}
        for at, method, path, selector in writes:
            if method != "DELETE":
                continue
            if path == base and label in selector.split(","):
                return at
            name = path.removeprefix(base + "/")
            if name in taken and name != path:
                per_pod.setdefault(name, at)
        return max(per_pod.values()) if len(per_pod) == len(taken) else None
    return answered


class BusRecorder:
    """First arrival (perf_counter) of an event per target name on a bus subscription."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.events: dict[str, model.CollectorEvent] = {}
        self.changed = asyncio.Event()

    async def consume(self, sub: Any) -> None:
        async for event in sub:
            now = time.perf_counter()
            name = f"{event.target.namespace}/{event.target.name}" if event.target.namespace else event.target.name
            if name not in self.arrivals and event.severity is model.Severity.ERROR:
                self.arrivals[name] = now
                self.events[name] = event
                self.changed.set()

    async def arrival(self, name: str, *, timeout: float) -> float:
        async with asyncio.timeout(timeout):
            while name not in self.arrivals:
                self.changed.clear()
                await self.changed.wait()
        return self.arrivals[name]


@dataclass
class Samples:
    detect: list[float] = field(default_factory=list)
    act: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))


@dataclass
class Result:
    kinds: dict[str, Samples]
    floor: list[float]
    floor_write: list[float]
    """The floor's own write (a merge-patch), from sending to the answer: the "+ 1 write" of the target."""
    api_requests: dict[str, dict[str, dict[str, int]]]
    """Scenario -> process ("controller", "agent") -> "<VERB> <resource>" -> count."""


def bench_settings(log_dir: str, *, node: str = "", namespace: str = NS,
                   workload_kinds: Sequence[str] = ("pytorchjobs.kubeflow.org",)) -> settings.Settings:
    """Product defaults, but: no Lease (one replica; keeps renewals out of the counts), only the
    PyTorchJob workload kind (the others' CRDs may be absent; the fleet bench adds its background kind), a
    breaker that lets every sample node be cordoned and every sample job restarted (`objects.BREAKER_OFF`),
    its own ledger and the agent's Node Events in the bench namespace (never an installed kcover's), and the
    log sink in a temporary folder."""
    return settings.Settings.model_validate({
        "lease": {"enabled": False},
        "kube": {"workload_kinds": list(workload_kinds)},
        "recovery": {**objects.BREAKER_OFF, "ledger_namespace": namespace, "ledger_name": "kcover-bench-ledger",
                     "save_logs": {"directory": log_dir}},
        "agent": {"node_name": node, "event_namespace": namespace},
        "detectors": {"entries": {"dcgm": {"enabled": False}}},
    })


def diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0) > 0}


class Floor:
    """A plain watch on the bench namespace's pods; times a status write's delivery."""

    def __init__(self, api: rawapi.RawApi, pod: str, *, namespace: str = NS) -> None:
        self.api = api
        self.pod = pod
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def watch(self, resource_version: str) -> None:
        query = {"resourceVersion": resource_version, "fieldSelector": f"metadata.name={self.pod}"}
        async for at, event in self.api.watch(seeding.pods_path(self.namespace), query):
            seq = ((event.get("object") or {}).get("metadata", {}).get("annotations") or {}).get("kcover.io/bench-seq")
            if seq is not None and seq not in self.seen:
                self.seen[seq] = at
                self.changed.set()

    async def sample(self, seq: int, *, timeout: float) -> tuple[float, float]:
        """(delivery, write answered), seconds from sending the write."""
        key = str(seq)
        started = time.perf_counter()
        await self.api.request("PATCH", f"{seeding.pods_path(self.namespace)}/{self.pod}",
                               body={"metadata": {"annotations": {"kcover.io/bench-seq": key}}},
                               content_type=client_.MERGE_PATCH)
        answered = time.perf_counter() - started
        async with asyncio.timeout(timeout):
            while key not in self.seen:
                self.changed.clear()
                await self.changed.wait()
        return self.seen[key] - started, answered


COST_SCENARIO = "pod_error_restart_4_pods"
"""The API cost of one fault, as issue 30 counts it: a pod error in a 4-pod job whose pods restart in place
(`restartPolicy: OnFailure`), every request until the controller has been quiet for `SETTLED_SECONDS` (the
Recovery record written off the critical path included)."""
COST_SCENARIO_NEVER = "pod_error_restart_4_pods_never"
"""The same in a 4-pod job whose pods run under `restartPolicy: Never` (a PyTorchJob replica with
`ExitCode`; a JobSet's or a batch Job's pods are so too): the failed pod is terminal and left to its
controller, its log with it, so the restart takes the other three and reads no log."""
SETTLED_SECONDS = 1.0


async def measure(kubeconfig: str, *, samples: int, xid_samples: int, sample_timeout: float = 30.0,
                  run_id: str = "", controller_kubeconfig: str = "", cost_pods: int = 4,
                  workload_kinds: Sequence[str] = ("pytorchjobs.kubeflow.org",), job_kind: str = "PyTorchJob") -> Result:
    """Seed, run controller (and agents), and take `samples` pod/DRA/floor and `xid_samples` XID samples, and
    the cost of one fault in a job of `cost_pods` pods (0: not taken).

    `run_id` suffixes the namespace and node names: a real API server without kube-controller-manager
    never finishes deleting a namespace, so a second run needs a new one. `controller_kubeconfig`: the
    controller's (and agents') credentials, if not the bench's own (a ServiceAccount's token, so the API
    server's priority and fairness treats them as it treats an installed kcover). `job_kind`: the Kubeflow kind
    of the sample jobs, whose pods the bench writes (on a cluster that runs the training operator, one it does
    not manage: the operator would create pods of the same names)."""
    with tempfile.TemporaryDirectory(prefix="kcover-bench-logs-") as log_dir:
        async with await rawapi.open_api(kubeconfig) as api:
            return await _measure(api, controller_kubeconfig or kubeconfig, log_dir, samples=samples,
                                  xid_samples=xid_samples, sample_timeout=sample_timeout, run_id=run_id,
                                  cost_pods=cost_pods, workload_kinds=workload_kinds, job_kind=job_kind)


def namespace_of(run_id: str) -> str:
    return f"{NS}-{run_id}" if run_id else NS


async def _measure(api: rawapi.RawApi, kubeconfig: str, log_dir: str, *, samples: int,
                   xid_samples: int, sample_timeout: float, run_id: str, cost_pods: int,
                   workload_kinds: Sequence[str], job_kind: str) -> Result:
    started = time.perf_counter()
    ns = namespace_of(run_id)
    suffix = f"-{run_id}" if run_id else ""
    await seeding.namespaces(api, [ns])
    gpu_nodes = [f"bench-gpu-{i}{suffix}" for i in range(16)]
    xid_nodes = [f"bench-xid-{i}{suffix}" for i in range(xid_samples)]
    await seeding.nodes(api, gpu_nodes + xid_nodes)
    for node in xid_nodes:
        await seeding.running_pod(api, objects.agent_pod(ns, node))
    specs = ([(ns, f"pe-{i}", 2) for i in range(samples)] + [(ns, f"dra-{i}", 2) for i in range(samples)]
             + [(ns, "floor", 1)])
    jobs = await seeding.jobs(api, specs[:samples], node_names=gpu_nodes, kind=job_kind)
    jobs += await seeding.jobs(api, specs[samples:], node_names=gpu_nodes, dra=True, kind=job_kind)
    floor_pod = jobs[-1].pods[0]
    # on nodes of its own: the samples' restarts on the shared nodes make them suspect (three different
    # workloads), and a suspect node's validation request is not the cost of one fault
    cost_nodes = [f"bench-cost-{i}{suffix}" for i in range(2 * cost_pods)]
    await seeding.nodes(api, cost_nodes)
    cost = ((await seeding.jobs(api, [(ns, "cost", cost_pods)], node_names=cost_nodes[:cost_pods], kind=job_kind))[0]
            if cost_pods else None)
    cost_never = ((await seeding.jobs(api, [(ns, "cost-never", cost_pods)], node_names=cost_nodes[cost_pods:],
                                      kind=job_kind, restart_policy="ExitCode"))[0] if cost_pods else None)
    log.info("bench_latency_seeded", seconds=round(time.perf_counter() - started, 1))

    config = bench_settings(log_dir, namespace=ns, workload_kinds=workload_kinds)
    kube = TimedClient(await client_.open_transport(kubeconfig))
    controller = controller_running.Controller(config, client=kube, metrics=metrics.Metrics(),
                                               health=serving.Health())
    recorder = BusRecorder()
    sub = controller.bus.subscribe("bench", capacity=100_000)
    floor = Floor(api, floor_pod, namespace=ns)
    listed = await api.request("GET", seeding.pods_path(ns), query={"limit": "1"})
    result = Result(kinds={"pod_error": Samples(), "dra_unhealthy": Samples(), "xid": Samples()}, floor=[],
                    floor_write=[], api_requests={})
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            run = tg.create_task(controller.run(stop), name="bench:controller")
            tg.create_task(recorder.consume(sub), name="bench:bus-recorder")
            watch = tg.create_task(floor.watch(listed["metadata"]["resourceVersion"]), name="bench:floor-watch")
            try:
                async with asyncio.timeout(120):
                    await controller.cache.wait_synced()
                await asyncio.sleep(0.5)  # detectors subscribe right after the sync
                await _pod_faults(api, kube, controller, recorder, floor, jobs, result, samples=samples,
                                  timeout=sample_timeout)
                if cost is not None and cost_never is not None:
                    result.api_requests[COST_SCENARIO] = {"controller": await _cost(api, kube, cost,
                                                                                    timeout=sample_timeout)}
                    result.api_requests[COST_SCENARIO_NEVER] = {"controller": await _cost(
                        api, kube, cost_never, timeout=sample_timeout, never=True)}
                await _xid_faults(kubeconfig, log_dir, kube, controller, recorder, xid_nodes, result,
                                  timeout=sample_timeout)
            finally:
                stop.set()
                watch.cancel()
            await run
    finally:
        await kube.close()
    return result


async def _pod_faults(api: rawapi.RawApi, kube: TimedClient, controller: controller_running.Controller,
                      recorder: BusRecorder, floor: Floor, jobs: list[seeding.Job], result: Result, *,
                      samples: int, timeout: float) -> None:
    by_name = {j.name: j for j in jobs}
    for i in range(samples):
        delivered, answered = await floor.sample(i, timeout=timeout)
        result.floor.append(delivered)
        result.floor_write.append(answered)
        for kind, job_name, status in (("pod_error", f"pe-{i}", objects.failed_status(1)),
                                       ("dra_unhealthy", f"dra-{i}", objects.unhealthy_status(1))):
            job = by_name[job_name]
            pod = job.pods[1]
            before = dict(kube.request_counts)
            t0 = time.perf_counter()
            await seeding.write_pod_status(api, job.namespace, pod, status)
            detected = await recorder.arrival(f"{job.namespace}/{pod}", timeout=timeout)
            acted = await kube.when(restarted(job), since=t0, timeout=timeout)
            result.kinds[kind].detect.append(detected - t0)
            result.kinds[kind].act.append(acted - t0)
            if i == 0:
                await asyncio.sleep(0.5)  # the Event and the ledger write follow the action
                result.api_requests[f"{kind}_restart"] = {"controller": diff(kube.request_counts, before)}
        await asyncio.sleep(0.05)


async def _cost(api: rawapi.RawApi, kube: TimedClient, job: seeding.Job, *, timeout: float,
                never: bool = False) -> dict[str, int]:
    """Every request one pod error in `job` costs, until the controller was quiet for `SETTLED_SECONDS`
    (`never`: the job's pods are under `restartPolicy: Never`)."""
    before = dict(kube.request_counts)
    t0 = time.perf_counter()
    failed = objects.failed_never_status(1) if never else objects.failed_status(1)
    await seeding.write_pod_status(api, job.namespace, job.pods[1], failed)
    await kube.when(restarted(job, spared=[job.pods[1]] if never else []), since=t0, timeout=timeout)
    async with asyncio.timeout(timeout):
        while True:
            seen = sum(kube.request_counts.values())
            await asyncio.sleep(SETTLED_SECONDS)
            if sum(kube.request_counts.values()) == seen:
                break
    return {k: v for k, v in diff(kube.request_counts, before).items() if not k.startswith("WATCH")}


async def _xid_faults(kubeconfig: str, log_dir: str, kube: TimedClient,
                      controller: controller_running.Controller, recorder: BusRecorder, nodes: list[str],
                      result: Result, *, timeout: float) -> None:
    for i, node in enumerate(nodes):
        agent_kube = TimedClient(await client_.open_transport(kubeconfig))
        nvml = fake.FakeNvml(8)
        agent = agent_running.Agent(bench_settings(log_dir, node=node, namespace=controller.settings.recovery.ledger_namespace), client=agent_kube, metrics=metrics.Metrics(),
                                    health=None, node=node, nvml=nvml)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop), name=f"bench:agent:{node}")
        try:
            await _until(lambda node=node: _condition(controller, node) == "True", timeout)  # type: ignore[misc]
            await asyncio.sleep(0.6)  # one NVML event wait: the detector is registered and waiting
            before_c, before_a = dict(kube.request_counts), dict(agent_kube.request_counts)
            t0 = time.perf_counter()
            nvml.xid(79, gpu_index=i % 8)
            written = await agent_kube.first(lambda m, p, s, node=node: p == f"/api/v1/nodes/{node}/status",  # type: ignore[misc]
                                             since=t0, timeout=timeout)
            detected = await recorder.arrival(node, timeout=timeout)
            acted = await kube.first(lambda m, p, s, node=node: p == f"/api/v1/nodes/{node}",  # type: ignore[misc]
                                     since=t0, timeout=timeout)
            samples = result.kinds["xid"]
            samples.detect.append(detected - t0)
            samples.act.append(acted - t0)
            samples.extra["condition_written"].append(written - t0)
            if i == 0:
                await asyncio.sleep(0.5)
                result.api_requests["xid_cordon"] = {"agent": diff(agent_kube.request_counts, before_a),
                                                     "controller": diff(kube.request_counts, before_c)}
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
            await agent_kube.close()
        if not task.done() or task.cancelled() or task.exception() is not None:
            raise errors.KcoverError(f"the bench agent for {node} did not stop cleanly")


def _condition(controller: controller_running.Controller, node: str) -> str:
    found = controller.cache.node(node)
    if found is None:
        return ""
    return next((c.status for c in found.conditions if c.type == CONDITION), "")


async def _until(predicate: Callable[[], bool], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110  (polling the controller's cache)
            await asyncio.sleep(0.01)
