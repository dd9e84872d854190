"""Controller replicas against a real HTTP API server (every cluster backend: sim, a real kube-apiserver).

What a user sees: one replica leads (the Lease says which), every replica becomes ready once its
caches synced, only the leader's engine gets events, a stopped leader hands over at once, and a
reload applies tunables live. Real time with short lease timings: looptime cannot drive sockets.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import structlog

from kcover import errors, model, serving, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import recovering, running
from kcover.detectors import contract, registry
from kcover.kube import client as client_
from kcover.kube import leasing

Cluster = Any  # tests/backends.py's Cluster


class RecordingEngine:
    """An engine that records what it was handed (the engine proper is tested in tests/recovery)."""

    def __init__(self, deps: recovering.EngineDeps) -> None:
        self.deps = deps
        self.batches: list[list[model.CollectorEvent]] = []
        self.reconfigured: list[settings.RecoverySettings] = []

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        assert self.deps.is_leader()
        self.batches.append(list(events))

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        self.reconfigured.append(recovery)


def _settings(identity: str, namespace: str, *, retry_seconds: float | None = None, **lease: Any) -> settings.Settings:
    return settings.Settings.model_validate({
        "recovery": {"ledger_namespace": namespace, **({} if retry_seconds is None else {"retry_seconds": retry_seconds})},
        "lease": {"identity": identity, "namespace": namespace, "lease_duration_seconds": 2.0,
                  "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2, **lease},
        "detectors": {"entries": {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "watch_events": False},
    })


class Replica:
    def __init__(self, cluster: Cluster, identity: str, **lease: Any) -> None:
        self.kube = cluster.new_client()
        self.health = serving.Health()
        self.metrics = metrics_.Metrics()
        self.engines: list[RecordingEngine] = []
        self.controller = running.Controller(_settings(identity, cluster.namespace, **lease), client=self.kube, metrics=self.metrics,
                                             health=self.health, detector_registry=registry.discover(),
                                             engine_factory=self._engine)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.controller.run(self.stop), name=f"controller:{identity}")

    def _engine(self, deps: recovering.EngineDeps) -> RecordingEngine:
        engine = RecordingEngine(deps)
        self.engines.append(engine)
        return engine

    @property
    def engine(self) -> RecordingEngine:
        return self.engines[0]

    def ready(self) -> bool:
        return self.health.readiness()[0]

    async def shutdown(self) -> None:
        self.stop.set()
        await asyncio.wait({self.task})
        await self.kube.close()
        if not self.task.cancelled():
            self.task.result()


@pytest.fixture
async def replicas(cluster: Cluster) -> AsyncIterator[Callable[..., Replica]]:
    started: list[Replica] = []

    def start(identity: str, **lease: Any) -> Replica:
        replica = Replica(cluster, identity, **lease)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        if not replica.task.done():
            await replica.shutdown()


async def _until(predicate: Callable[[], bool], within: float) -> float:
    started = time.monotonic()
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (polling a plain predicate)
            await asyncio.sleep(0.01)
    return time.monotonic() - started


def _event(name: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="test", reason="ContainerError", severity=model.Severity.ERROR,
                                target=model.Target(kind=model.TargetKind.POD, namespace="team-a", name=name))


async def _holder(cluster: Cluster) -> str:
    async with cluster.new_client() as kube:
        lease = await kube.request("GET", leasing.lease_path(cluster.namespace, "kcover-controller"))
    return str(lease["spec"]["holderIdentity"])


async def test_one_leader_acts_followers_stay_ready(cluster: Cluster,
                                                    replicas: Callable[..., Replica]) -> None:
    a, b = replicas("a"), replicas("b")
    await _until(lambda: a.controller.is_leader() or b.controller.is_leader(), 5.0)
    await _until(lambda: a.ready() and b.ready(), 5.0)
    leader, follower = (a, b) if a.controller.is_leader() else (b, a)
    assert not follower.controller.is_leader()
    assert await _holder(cluster) == leader.controller.identity
    assert leader.metrics.is_leader._value.get() == 1
    assert follower.metrics.is_leader._value.get() == 0
    assert leader.health.readiness()[1]["cache"].endswith("synced")

    await leader.controller.bus.publish(_event("p1"))
    await follower.controller.bus.publish(_event("p1"))
    await _until(lambda: bool(leader.engine.batches), 2.0)
    await _until(lambda: follower.controller.held_while_following == 1, 2.0)
    assert [e.target.name for batch in leader.engine.batches for e in batch] == ["p1"]
    assert follower.engine.batches == []


async def test_stopped_leader_hands_over_and_the_successor_acts(cluster: Cluster,
                                                                replicas: Callable[..., Replica]) -> None:
    # client-go's default timings: the handover comes from the release, not from waiting out the Lease
    a = replicas("a", lease_duration_seconds=15.0, renew_deadline_seconds=10.0, retry_period_seconds=2.0)
    await _until(a.controller.is_leader, 5.0)
    b = replicas("b", lease_duration_seconds=15.0, renew_deadline_seconds=10.0, retry_period_seconds=2.0)
    await _until(b.ready, 5.0)
    await asyncio.sleep(0.5)  # b's campaign is under way and its watch open
    started = time.monotonic()
    await a.shutdown()
    await _until(b.controller.is_leader, 2.0)
    print(f"controller handover: {time.monotonic() - started:.3f} s")
    assert await _holder(cluster) == "b"
    await b.controller.bus.publish(_event("p2"))
    await _until(lambda: bool(b.engine.batches), 2.0)


async def test_reconfigure_applies_tunables_live_and_refuses_bad_detectors(
        cluster: Cluster, replicas: Callable[..., Replica]) -> None:
    a = replicas("a")
    await _until(a.controller.is_leader, 5.0)
    new = a.controller.settings.model_copy(deep=True)
    new.bus.dedupe_window_seconds = 0.0
    new.lease.retry_period_seconds = 0.3
    new.recovery.dry_run = True
    await a.controller.reconfigure(new, {"bus.dedupe_window_seconds", "lease.retry_period_seconds",
                                         "recovery.dry_run"})
    assert a.controller.elector is not None
    assert a.controller.elector.settings.retry_period_seconds == 0.3
    assert a.engine.reconfigured[-1].dry_run is True
    # dedupe off: the same event twice reaches the engine twice
    await a.controller.bus.publish(_event("p3"))
    await a.controller.bus.publish(_event("p3"))
    await _until(lambda: sum(len(b) for b in a.engine.batches) == 2, 2.0)

    bad = new.model_copy(deep=True)
    bad.detectors.entries = {"no-such-detector": settings.DetectorEntry()}
    bad.recovery.dry_run = False
    with pytest.raises(errors.ConfigError):
        await a.controller.reconfigure(bad, {"detectors.entries.no-such-detector"})
    assert a.engine.reconfigured[-1].dry_run is True
    assert a.controller.settings.recovery.dry_run is True


async def test_lost_leadership_cancels_the_batch_in_flight(cluster: Cluster,
                                                           replicas: Callable[..., Replica]) -> None:
    a = replicas("a")
    await _until(a.controller.is_leader, 5.0)
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(events: Sequence[model.CollectorEvent]) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    a.engine.handle = slow  # type: ignore[method-assign]
    await a.controller.bus.publish(_event("p4"))
    await asyncio.wait_for(entered.wait(), 2.0)
    # another holder writes the Lease (split brain, or an operator forcing a handover)
    async with cluster.new_client() as kube:
        path = leasing.lease_path(cluster.namespace, "kcover-controller")
        for _ in range(20):  # the leader renews every 0.2 s: retry on conflicts
            lease = await kube.request("GET", path)
            lease["spec"]["holderIdentity"] = "intruder"
            try:
                await kube.request("PUT", path, body=lease)
                break
            except errors.ConflictError:
                continue
    await asyncio.wait_for(cancelled.wait(), 2.0)
    assert not a.controller.is_leader()
    assert a.metrics.is_leader._value.get() == 0
    # the intruder does not renew: a leads again and is handed the cancelled batch once more (a Lease that
    # flapped back to the same replica used to lose the faults of the batch it cancelled)
    del a.engine.handle  # the recording handler again
    await _until(lambda: any(ev.target.name == "p4" for batch in a.engine.batches for ev in batch), 8.0)
    assert a.controller.is_leader()


async def test_what_a_follower_held_while_nobody_led_is_replayed_however_long_that_lasted(
        cluster: Cluster, replicas: Callable[..., Replica]) -> None:
    """A holder that stops renewing (dead, or cut off with the API server) keeps the Lease for its duration;
    events observed meanwhile were acted on by nobody, so the successor replays them even when the gap is
    longer than twice its own Lease duration (held events used to be aged from now and were dropped)."""
    async with cluster.new_client() as kube:
        now = clock_.micro_time(clock_.utcnow())
        await kube.request("POST", leasing.lease_path(cluster.namespace), body={
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kcover-controller", "namespace": cluster.namespace},
            "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 6, "acquireTime": now, "renewTime": now,
                     "leaseTransitions": 0}})
    b = replicas("b")
    await _until(lambda: b.controller.cache.synced, 5.0)
    await b.controller.bus.publish(_event("p7"))
    await asyncio.sleep(0.5)
    assert not b.controller.is_leader()
    assert b.controller.held_while_following >= 1
    took = await _until(b.controller.is_leader, 10.0)
    assert took > 4.0, "the gap outlasted twice the 2 s Lease duration"
    await _until(lambda: any(ev.target.name == "p7" for batch in b.engine.batches for ev in batch), 2.0)


@pytest.mark.parametrize(("margin", "retry", "replayed"), [(6.0, 1.0, True), (0.0, 1.0, False), (0.0, 6.0, True)],
                         ids=["within-the-margin", "no-margin", "within-the-retry-time"])
async def test_a_fault_the_dead_leader_may_not_have_seen_is_replayed_within_the_margin(
        cluster: Cluster, replicas: Callable[..., Replica], margin: float, retry: float, replayed: bool) -> None:
    """A follower saw a fault that the leader, renewing for 5 s more (more than twice the 2 s Lease), never
    saw (its cache behind), and the leader then died without releasing the Lease. The successor replays what
    it saw up to twice the Lease duration and `lease.replay_margin_seconds` before the dead leader's last
    renewal: with a 6 s margin the fault is acted on; with none it counts as the old leader's and is dropped
    (so the horizon still holds). A chaos run lost a fault so, its leader's watch seconds behind.

    Or up to `recovery.retry_seconds` when that is longer: a leader retrying a fault whose first write kept
    failing (the ledger's kind not served) while it renewed kept it in its memory only, and died with it; a
    6 s retry time replays the 5 s old fault without any margin."""
    a = replicas("a", replay_margin_seconds=margin, retry_seconds=retry)
    await _until(a.controller.is_leader, 5.0)
    b = replicas("b", replay_margin_seconds=margin, retry_seconds=retry)
    await _until(lambda: b.controller.cache.synced, 5.0)
    await b.controller.bus.publish(_event("p9"))  # b's bus only: a never sees it
    await asyncio.sleep(5.0)
    assert a.controller.is_leader()
    assert b.controller.held_while_following >= 1
    assert a.controller.elector is not None
    a.controller.elector.release_on_exit = False  # as SIGKILL: the Lease is not released
    a.task.cancel()
    await _until(b.controller.is_leader, 10.0)
    await asyncio.sleep(1.0)  # the term's first batch
    assert any(ev.target.name == "p9" for batch in b.engine.batches for ev in batch) is replayed
    assert not any(ev.target.name == "p9" for batch in a.engine.batches for ev in batch)
    if not replayed:  # not dropped unsaid: counted (and logged as held_events_not_replayed)
        assert b.controller.held_dropped >= 1


class _Crasher:
    roles = frozenset({contract.Role.CONTROLLER})
    config_model = contract.EmptyConfig

    def __init__(self, name: str, config: Any, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: Any, stop: asyncio.Event) -> None:
        raise RuntimeError("sensor on fire")


async def test_a_failed_optional_plugin_leaves_an_event_on_the_lease_and_the_replica_ready(cluster: Cluster) -> None:
    cfg = _settings("a", cluster.namespace)
    cfg = cfg.model_copy(update={"detectors": settings.DetectorsSettings.model_validate(
        {"entries": {**cfg.detectors.model_dump()["entries"], "crasher": {"enabled": True}}})})
    reg = registry.Registry([registry.DetectorInfo("crasher", "x:Crasher", "a-plugin", "0", _Crasher)])  # type: ignore[arg-type]
    health = serving.Health()
    async with cluster.new_client() as kube:
        ctl = running.Controller(cfg, client=kube, metrics=metrics_.Metrics(), health=health, detector_registry=reg,
                                 engine_factory=RecordingEngine)
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop))
        try:
            found: list[dict[str, Any]] = []

            async def seen() -> bool:
                listed = await kube.request("GET", f"/api/v1/namespaces/{cluster.namespace}/events")
                found[:] = [e for e in listed.get("items") or [] if e.get("reason") == "KcoverDetectorFailed"]
                return bool(found)

            deadline = time.monotonic() + 10
            while not await seen() and time.monotonic() < deadline:  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.2)
            assert len(found) == 1, "one Event, not one per restart"
            event = found[0]
            assert event["involvedObject"]["kind"] == "Lease"
            assert event["involvedObject"]["name"] == "kcover-controller"
            assert event["type"] == "Warning"
            assert "optional detector crasher failed on a (RuntimeError: sensor on fire)" in event["message"]
            assert ctl.supervisor.describe()["crasher"]["state"] == "failed"
            await _until(lambda: health.readiness()[0], 5.0)  # an optional plugin leaves the replica ready
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def test_an_optional_plugin_that_cannot_be_imported_leaves_the_replica_starting_and_ready(
        cluster: Cluster) -> None:
    """Enabled, a plugin whose import raises runs as failed (a `KcoverDetectorFailed` Event, the import error
    in /readyz's text) and the replica starts, leads and is ready; marked `required: true`, it is refused
    at start, as a required detector that cannot run is."""
    broken = importlib.metadata.EntryPoint(name="broken", value="kcover_no_such_plugin_module:Detector",
                                           group=registry.GROUP)
    cfg = _settings("a", cluster.namespace)
    entries = cfg.detectors.model_dump()["entries"]
    with_broken = cfg.model_copy(update={"detectors": settings.DetectorsSettings.model_validate(
        {"entries": {**entries, "broken": {"enabled": True}}})})
    health = serving.Health()
    async with cluster.new_client() as kube:
        ctl = running.Controller(with_broken, client=kube, metrics=metrics_.Metrics(), health=health,
                                 detector_registry=registry.Registry(entry_points=[broken]),
                                 engine_factory=RecordingEngine)
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop))
        try:
            await _until(lambda: ctl.is_leader() and ctl.supervisor.health().get("broken") == "failed", 10.0)
            await _until(lambda: health.readiness()[0], 5.0)
            assert "ModuleNotFoundError" in health.readiness()[1]["detectors"]
            failed: list[dict[str, Any]] = []
            # the Event is written after the detector is marked failed (its failure hook): wait for it
            deadline = time.monotonic() + 10
            while not failed and time.monotonic() < deadline:
                listed = await kube.request("GET", f"/api/v1/namespaces/{cluster.namespace}/events")
                failed = [e for e in listed.get("items") or [] if e.get("reason") == "KcoverDetectorFailed"]
                await asyncio.sleep(0.2)
            assert [e["involvedObject"]["kind"] for e in failed] == ["Lease"]
            assert "optional detector broken failed" in failed[0]["message"]
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
        required = cfg.model_copy(update={"detectors": settings.DetectorsSettings.model_validate(
            {"entries": {**entries, "broken": {"enabled": True, "required": True}}})})
        with pytest.raises(errors.ConfigError, match=r"detectors\.entries\.broken: detector 'broken'"):
            running.Controller(required, client=kube, metrics=metrics_.Metrics(), health=serving.Health(),
                               detector_registry=registry.Registry(entry_points=[broken]),
                               engine_factory=RecordingEngine)


@pytest.mark.sim_only("injects API faults")
async def test_readiness_says_when_a_cache_stops_syncing_and_again_when_it_syncs(cluster: Cluster) -> None:
    """A reflector that keeps failing (every list and watch of pods answered 500) turns /readyz to not
    ready after `kube.stall_seconds`, naming the collection; ready again once it lists."""
    cfg = _settings("a", cluster.namespace)
    cfg = cfg.model_copy(update={"kube": cfg.kube.model_copy(update={
        "stall_seconds": 0.6, "retry_deadline_seconds": 0.0, "backoff_initial_seconds": 0.05,
        "backoff_max_seconds": 0.1})})
    health = serving.Health()
    async with cluster.new_client() as kube:
        ctl = running.Controller(cfg, client=kube, metrics=metrics_.Metrics(), health=health,
                                 detector_registry=registry.discover(), engine_factory=RecordingEngine)
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop))
        try:
            await _until(lambda: health.readiness()[0], 10.0)
            faults = cluster.sim.faults
            faults.resources = frozenset({"pods"})
            faults.error_rate = 1.0
            faults.drop_watches("pods")
            await _until(lambda: not health.readiness()[0], 10.0)
            assert "pods" in health.readiness()[1]["cache"]
            ready, text = ctl.cache.readiness()
            assert not ready
            assert text.startswith("stopped syncing: pods (failing for "), text
            assert "500" in text, text
            faults.reset()
            await _until(lambda: health.readiness()[0], 10.0)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


# ------------------------------------------------------------------------------------------------ end to end

async def _seed_job(kube: client_.KubeClient, ML: str) -> dict[str, Any]:
    job: dict[str, Any] = await kube.request(
        "POST", f"/apis/kubeflow.org/v1/namespaces/{ML}/pytorchjobs",
        body={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
              "metadata": {"name": "train", "namespace": ML, "labels": {"kcover.io/cascading-recovery": "true"}},
              "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure"}}}})
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train",
             "uid": job["metadata"]["uid"], "controller": True}
    for i in range(2):
        await kube.request("POST", f"/api/v1/namespaces/{ML}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"train-worker-{i}", "namespace": ML, "ownerReferences": [owner],
                         "labels": {"training.kubeflow.org/job-name": "train",
                                    "training.kubeflow.org/operator-name": "pytorchjob-controller"}},
            "spec": {"nodeName": f"gpu-{i}", "restartPolicy": "OnFailure",
                     "containers": [{"name": "pytorch", "image": "trainer"}]}})
    return job


async def test_only_the_leader_restarts_a_failed_job_and_saves_its_logs(
        cluster: Cluster, tmp_path: Any) -> None:
    """Logs are served on the sim only: a real kube-apiserver proxies pods/log to a kubelet, and none runs,
    so there the restart must go ahead without them."""
    ML = cluster.namespace
    async with cluster.new_client() as kube:
        await _seed_job(kube, ML)
        if cluster.sim is not None:
            cluster.sim.append_log(ML, "train-worker-1", "pytorch", "step 41\nNCCL watchdog timeout\n")
        base = _settings("x", ML).model_dump()
        base["detectors"]["entries"]["pod-status"]["enabled"] = True
        base["recovery"]["save_logs"]["directory"] = str(tmp_path)
        stops, tasks, controllers = [], [], []
        for identity in ("a", "b"):
            cfg = settings.Settings.model_validate({**base, "lease": {**base["lease"], "identity": identity}})
            ctl = running.Controller(cfg, client=kube, metrics=metrics_.Metrics(), health=serving.Health())
            stop = asyncio.Event()
            stops.append(stop)
            controllers.append(ctl)
            tasks.append(asyncio.create_task(ctl.run(stop), name=f"controller:{identity}"))
        try:
            await _until(lambda: any(c.is_leader() for c in controllers) and all(c.cache.synced for c in controllers),
                         5.0)
            pod = await kube.request("GET", f"/api/v1/namespaces/{ML}/pods/train-worker-1")
            now = clock_.rfc3339(clock_.utcnow())
            pod["status"] = {"phase": "Running", "containerStatuses": [{
                "name": "pytorch", "ready": False, "restartCount": 1, "image": "trainer", "imageID": "",
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}}]}
            await kube.request("PUT", f"/api/v1/namespaces/{ML}/pods/train-worker-1/status", body=pod)

            async def pods_left() -> list[dict[str, Any]]:
                listed = await kube.request("GET", f"/api/v1/namespaces/{ML}/pods")
                return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

            async with asyncio.timeout(10):
                while await pods_left():  # noqa: ASYNC110  (polling the API server)
                    await asyncio.sleep(0.1)
            events = await kube.request("GET", f"/api/v1/namespaces/{ML}/events")
            reasons = [e.get("reason") for e in events["items"]]
            assert reasons.count("KcoverRestartedWorkload") == 1
            if cluster.sim is not None:
                saved = [p for p in tmp_path.iterdir() if p.is_dir()]
                assert len(saved) == 1
                assert (saved[0] / "train-worker-1" / "pytorch.log").read_text() == "step 41\nNCCL watchdog timeout\n"
            follower = next(c for c in controllers if not c.is_leader())
            assert follower.held_while_following >= 1
        finally:
            for stop in stops:
                stop.set()
            await asyncio.wait(tasks)
            for task in tasks:
                task.result()


class CrashingResumeEngine(RecordingEngine):
    """An engine whose term's first pass over the ledger raises something unexpected once."""

    def __init__(self, deps: recovering.EngineDeps) -> None:
        super().__init__(deps)
        self.resumes = 0

    async def resume(self) -> None:
        self.resumes += 1
        if self.resumes == 1:
            raise RuntimeError("an unexpected bug in the term's first pass")


async def test_a_crash_in_the_terms_first_pass_is_logged_and_the_leader_goes_on(cluster: Cluster) -> None:
    """The term's first pass (the ledger's pending restarts, held restarts, validations) raised out of the
    consumer and the whole controller stopped without a word: the other replica, if any, was next, and a
    run with both hitting it had no controller left. Now it is logged (`recovery_resume_crashed`) and the
    batch is still handled; the periodic pass runs it again."""
    kube = cluster.new_client()
    engines: list[CrashingResumeEngine] = []

    def factory(deps: recovering.EngineDeps) -> CrashingResumeEngine:
        engines.append(CrashingResumeEngine(deps))
        return engines[-1]

    cfg = _settings("a", cluster.namespace)
    cfg.recovery.resume_interval_seconds = 0.2
    controller = running.Controller(cfg, client=kube, metrics=metrics_.Metrics(), health=serving.Health(),
                                    detector_registry=registry.discover(), engine_factory=factory)
    stop = asyncio.Event()
    with structlog.testing.capture_logs() as logged:
        task = asyncio.create_task(controller.run(stop), name="controller:a")
        try:
            await _until(controller.is_leader, 5.0)
            await controller.bus.publish(_event("p4"))
            await _until(lambda: bool(engines and engines[0].batches), 5.0)
            await _until(lambda: engines[0].resumes >= 2, 5.0)
            assert not task.done()
        finally:
            stop.set()
            await asyncio.wait({task})
            await kube.close()
    task.result()
    crashed = [e for e in logged if e["event"] == "recovery_resume_crashed"]
    assert len(crashed) == 1
    assert not [e for e in logged if e["event"] == "controller_crashed"]


async def test_a_controller_that_crashes_says_why_before_it_ends(cluster: Cluster) -> None:
    """An unexpected error out of a batch ends the controller (a bug, not a fault to ride out); it says so in
    its log (`controller_crashed`, naming the error) before the process goes, instead of only in a traceback."""
    kube = cluster.new_client()
    engines: list[RecordingEngine] = []

    def factory(deps: recovering.EngineDeps) -> RecordingEngine:
        engines.append(RecordingEngine(deps))

        async def broken(events: Sequence[model.CollectorEvent]) -> None:
            raise RuntimeError("a bug in the engine")

        engines[-1].handle = broken  # type: ignore[method-assign]
        return engines[-1]

    controller = running.Controller(_settings("a", cluster.namespace), client=kube, metrics=metrics_.Metrics(),
                                    health=serving.Health(), detector_registry=registry.discover(),
                                    engine_factory=factory)
    with structlog.testing.capture_logs() as logged:
        task = asyncio.create_task(controller.run(asyncio.Event()), name="controller:a")
        try:
            await _until(controller.is_leader, 5.0)
            await controller.bus.publish(_event("p5"))
            await asyncio.wait_for(asyncio.wait({task}), 10.0)
        finally:
            await kube.close()
    with pytest.raises(BaseExceptionGroup):
        task.result()
    (crashed,) = [e for e in logged if e["event"] == "controller_crashed"]
    assert crashed["errors"] == ["RuntimeError: a bug in the engine"]
