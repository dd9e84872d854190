"""Trust and safety against every cluster backend: forged signals, replays, tampered ledger intents.

A tenant who may only create Events in its own namespace (on the real kube-apiserver: a ServiceAccount
bound to exactly that, its requests impersonated as it) tries every forged signal: Node Events with any
reporter and in every namespace it can reach, Events about another namespace's pods and workloads,
Events about its own workload, future-dated Events. The real controller (cache, detectors, Lease,
engine) runs meanwhile. What the API server ends up holding is asserted: no Node cordoned or tainted,
no pod deleted, no restart or cordon Event anywhere, and every refusal counted by reason and answered
in the tenant's own namespace only. On the simulated server (no RBAC) the same requests are made,
except those only RBAC stops. A controller restarted and then failed over within the staleness window
acts once on one Event; tampered ledger intents are dropped without deleting anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kcover import errors, serving, settings
from kcover import metrics as metrics_
from kcover.aio import clock as clock_
from kcover.controller import running
from kcover.kube import client as client_
from kcover.kube import retrying

Cluster = Any  # tests/backends.py's Cluster
Obj = dict[str, Any]

WAIT = 20.0
SETTLE = 1.5
LEASE = {"lease_duration_seconds": 2.0, "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2}
JOB_NAME = "training.kubeflow.org/job-name"
OPT_IN = "kcover.io/cascading-recovery"
ACTIONS = ("KcoverRestartedWorkload", "KcoverCordonedNode")
CLAIM = "gpu-claim"
DRIVER = "gpu.nvidia.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


async def _until(probe: Any, what: str, within: float = WAIT) -> Any:
    try:
        async with asyncio.timeout(within):
            while not (got := await probe()):  # noqa: ASYNC110  (polling the API server)
                await asyncio.sleep(0.1)
            return got
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def _node(kube: client_.KubeClient, name: str) -> Obj:
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    node: Obj = await kube.request("GET", f"/api/v1/nodes/{name}")
    resources = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources}
    return dict(await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node))


async def _job(cluster: Cluster, namespace: str, name: str, node: str, *, opted_in: bool = True,
               claim: bool = False) -> Obj:
    """A PyTorchJob with two running workers on `node` (`claim`: each worker's container uses a DRA claim)."""
    container: Obj = {"name": "pytorch", "image": "trainer"}
    spec: Obj = {"nodeName": node, "containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": "gpu"}]
        container["resources"] = {"claims": [{"name": CLAIM, "request": "gpu"}]}
    job: Obj = await cluster.client.request("POST", f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs", body={
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {OPT_IN: "true"} if opted_in else {}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": {
            "spec": spec}}}}})
    await cluster.harness.reconcile_jobs(namespace)
    for pod in await _pods(cluster, namespace, name):
        await cluster.harness.run_pod(namespace, pod["metadata"]["name"])
    return job


async def _pods(cluster: Cluster, namespace: str, job: str = "") -> list[Obj]:
    query = {"labelSelector": f"{JOB_NAME}={job}"} if job else None
    listed = await cluster.client.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
    return sorted(listed.get("items") or [], key=lambda p: str(p["metadata"]["name"]))


def _state(pods: list[Obj]) -> set[tuple[str, str, bool]]:
    return {(p["metadata"]["name"], p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in pods}


async def _events(cluster: Cluster, namespace: str) -> list[Obj]:
    return list((await cluster.client.request("GET", f"/api/v1/namespaces/{namespace}/events")).get("items") or [])


def _settings(cluster: Cluster, identity: str, **recovery: Any) -> settings.Settings:
    ns = cluster.namespace  # kcover's own (release) namespace in these tests
    return settings.Settings.model_validate({
        "recovery": {"ledger_namespace": ns, "max_cordoned_fraction": 1.0, "namespaces_deny": [],
                     "save_logs": {"enabled": False}, **recovery},
        "lease": {"namespace": ns, "identity": identity, **LEASE},
        "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"], "gc_freeze_after_sync": False},
        "bus": {"drain_timeout_seconds": 0.5},
        "detectors": {"entries": {"nvml": {"enabled": False}, "dcgm": {"enabled": False}}},
    })


@dataclasses.dataclass
class Replica:
    identity: str
    kube: client_.KubeClient
    metrics: metrics_.Metrics
    controller: running.Controller
    task: asyncio.Task[None]
    stop: asyncio.Event

    def sample(self, name: str, labels: dict[str, str]) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def rejected(self, reason: str) -> float:
        return self.sample("kcover_events_rejected_total", {"reason": reason})

    async def shutdown(self, *, kill: bool = False) -> None:
        if kill:  # as SIGKILL would: the Lease is not released
            assert self.controller.elector is not None
            self.controller.elector.release_on_exit = False
            self.task.cancel()
        else:
            self.stop.set()
        await asyncio.wait([self.task], timeout=10.0)
        await self.kube.close()


async def _start(cluster: Cluster, identity: str, **recovery: Any) -> Replica:
    kube = cluster.new_client()
    mets = metrics_.Metrics()
    ctl = running.Controller(_settings(cluster, identity, **recovery), client=kube, metrics=mets, health=serving.Health())
    stop = asyncio.Event()
    replica = Replica(identity, kube, mets, ctl, asyncio.create_task(ctl.run(stop), name=f"controller:{identity}"), stop)

    async def ready() -> bool:
        states = ctl.supervisor.health()
        return ctl.is_leader() and ctl.cache.synced and bool(states) and all(s == "running" for s in states.values())
    await _until(ready, f"controller {identity} to lead with a synced cache")
    await asyncio.sleep(0.3)  # detectors subscribe right after the cache synced
    return replica


@contextlib.asynccontextmanager
async def _tenant(cluster: Cluster, namespace: str) -> AsyncIterator[client_.KubeClient]:
    """A client acting as a ServiceAccount that may only create Events in `namespace` (RBAC on a real server;
    the simulated server has no authorization, so there it is a plain client)."""
    user = f"system:serviceaccount:{namespace}:forger"
    if cluster.sim is None:
        kube = cluster.client
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body={
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "forger"}})
        await kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "events-only"},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]})
        await kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "forger"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "events-only"},
            "subjects": [{"kind": "ServiceAccount", "name": "forger", "namespace": namespace}]})
    tenant = client_.from_configuration(cluster.configuration, retry=retrying.NO_RETRY,
                                        headers={"Impersonate-User": user} if cluster.sim is None else None)
    try:
        yield tenant
    finally:
        await tenant.close()


def _event(namespace: str, involved: Obj, *, name: str, reporter: str = "kcover.io/agent", instance: str = "",
           when: str | None = None, legacy: bool = False) -> Obj:
    """An Event annotated kcover.io/need-recovery, in the agent's shape (eventTime) or the legacy one."""
    now = when or clock_.rfc3339(clock_.utcnow())
    body: Obj = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": name, "namespace": namespace,
                              "annotations": {"kcover.io/need-recovery": "true",
                                              "kcover.io/recommended-action": "cordon-node-and-restart"}},
                 "involvedObject": involved, "reason": "GPUFailure", "message": "cordon and restart now",
                 "type": "Warning", "count": 1, "source": {"component": reporter, "host": instance},
                 "firstTimestamp": now, "lastTimestamp": now}
    if not legacy:
        body.update(eventTime=clock_.micro_time(clock_.utcnow()), reportingComponent=reporter,
                    reportingInstance=instance or "forger", action="Recover")
    return body


async def test_a_tenant_that_may_only_create_events_moves_nothing_outside_its_namespace(cluster: Cluster) -> None:
    suffix = secrets.token_hex(3)
    kcover_ns = cluster.namespace
    tenant_ns = await cluster.create_namespace(f"tenant-a-{suffix}")
    other_ns = await cluster.create_namespace(f"tenant-b-{suffix}")
    node = f"sec-{suffix}"
    node_uid = (await _node(cluster.client, node))["metadata"]["uid"]
    await cluster.harness.run_agent_pod(kcover_ns, node)  # the real agent runs there: its Events would count
    victim = await _job(cluster, other_ns, "victim", node)
    own = await _job(cluster, tenant_ns, "own", node)
    own_pod = (await _pods(cluster, tenant_ns, "own"))[0]
    before = {ns: _state(await _pods(cluster, ns)) for ns in (tenant_ns, other_ns)}
    victim_pod = (await _pods(cluster, other_ns, "victim"))[0]["metadata"]
    node_ref = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}

    attempts: list[tuple[str, str, Obj]] = [  # (what, namespace written to, Event)
        ("Node Event naming the agent, in the tenant's namespace", tenant_ns,
         _event(tenant_ns, {**node_ref, "namespace": tenant_ns}, name="node-agent", instance=node)),
        ("legacy Node Event with the agent's source", tenant_ns,
         _event(tenant_ns, {**node_ref, "namespace": tenant_ns}, name="node-legacy", instance=node, legacy=True)),
        ("Node Event from another reporter", tenant_ns,
         _event(tenant_ns, {**node_ref, "namespace": tenant_ns}, name="node-npd", reporter="node-problem-detector",
                instance=node)),
        ("Node Event in default", "default", _event("default", node_ref, name=f"node-default-{suffix}", instance=node)),
        ("Node Event in kcover's namespace", kcover_ns,
         _event(kcover_ns, {**node_ref, "namespace": kcover_ns}, name="node-kcover", instance=node)),
        ("Event about another namespace's pod", tenant_ns,
         _event(tenant_ns, {"apiVersion": "v1", "kind": "Pod", "namespace": other_ns, "name": victim_pod["name"],
                            "uid": victim_pod["uid"]}, name="cross-pod")),
        ("Event about another namespace's workload", tenant_ns,
         _event(tenant_ns, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": other_ns,
                            "name": "victim", "uid": victim["metadata"]["uid"]}, name="cross-job")),
        ("Event about its own workload", tenant_ns,
         _event(tenant_ns, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": tenant_ns,
                            "name": "own", "uid": own["metadata"]["uid"]}, name="own-job")),
        ("Event dated 2099 about its own pod", tenant_ns,
         _event(tenant_ns, {"apiVersion": "v1", "kind": "Pod", "namespace": tenant_ns,
                            "name": own_pod["metadata"]["name"]}, name="future", when="2099-01-01T00:00:00Z",
                legacy=True)),
        ("Event about its own pod with a stale uid", tenant_ns,
         _event(tenant_ns, {"apiVersion": "v1", "kind": "Pod", "namespace": tenant_ns,
                            "name": own_pod["metadata"]["name"], "uid": "recreated-long-ago"}, name="old-uid")),
        ("Event about a pod of the victim's name in its own namespace", tenant_ns,
         _event(tenant_ns, {"apiVersion": "v1", "kind": "Pod", "namespace": tenant_ns, "name": victim_pod["name"]},
                name="namesake")),
    ]
    leader = await _start(cluster, "a")
    outcomes: dict[str, int] = {}
    try:
        async with _tenant(cluster, tenant_ns) as tenant:
            for what, namespace, body in attempts:
                if cluster.sim is not None and namespace == kcover_ns:
                    continue  # only RBAC keeps a tenant out of kcover's namespace; the simulated server has none
                try:
                    await tenant.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
                except errors.KubeError as exc:
                    outcomes[what] = exc.status
                else:
                    outcomes[what] = 201
        if cluster.sim is None:  # the premise: RBAC keeps it to its own namespace
            assert outcomes["Node Event in default"] == 403
            assert outcomes["Node Event in kcover's namespace"] == 403
        written = [w for w, status in outcomes.items() if status == 201]
        assert "Node Event naming the agent, in the tenant's namespace" in written

        want = {"namespace_not_allowed": 3 if cluster.sim is None else 4, "namespace_mismatch": 1,
                "unsupported_kind": 2, "future_timestamp": 1, "uid_mismatch": 1, "pod_not_found": 1}

        async def all_refused() -> bool:
            return all(leader.rejected(reason) >= count for reason, count in want.items())
        await _until(all_refused, f"the refusals {want}")
        await asyncio.sleep(SETTLE)  # room for a wrongful action to show
        got = {reason: leader.rejected(reason) for reason in want}
        node_now = await cluster.client.request("GET", f"/api/v1/nodes/{node}")
        after = {ns: _state(await _pods(cluster, ns)) for ns in (tenant_ns, other_ns)}
        seen = {ns: await _events(cluster, ns) for ns in (tenant_ns, other_ns, kcover_ns, "default")}
    finally:
        await leader.shutdown()
    assert got == {reason: float(count) for reason, count in want.items()}, got
    spec = node_now.get("spec") or {}
    assert not spec.get("unschedulable")
    assert not [t for t in spec.get("taints") or [] if t.get("key") == "kcover.io/unhealthy"]
    assert "kcover.io/cordoned-by" not in (node_now["metadata"].get("annotations") or {})
    assert after == before, "no pod was deleted in either namespace"
    assert not [e for events in seen.values() for e in events if e.get("reason") in ACTIONS]
    answers = {ns: [e for e in events if e.get("reason") == "KcoverSignalRefused"] for ns, events in seen.items()}
    assert answers[tenant_ns], "refusals are answered in the tenant's own namespace"
    assert not answers[other_ns]
    assert len(answers[tenant_ns]) <= len(want), "at most one answer per namespace and reason"


async def _kcover_rules(cluster: Cluster, node: str) -> dict[str, Obj]:
    """kcover's DeviceTaintRules of devices of `node`, by device name."""
    listed = await cluster.client.request("GET", RULES)
    return {r["spec"]["deviceSelector"]["device"]: r for r in listed.get("items") or []
            if (r["metadata"].get("annotations") or {}).get("kcover.io/node") == node}


async def test_a_tenants_event_taints_only_a_device_its_opted_in_pod_holds(cluster: Cluster) -> None:
    """Node `dev` publishes gpu-0..7 through a ResourceSlice. In the tenant's namespace an opted-in job holds
    gpu-2 and one not opted in holds gpu-6; another tenant's opted-in job holds gpu-5 on the same node (each
    as the kubelet reports in `allocatedResourcesStatus`). The tenant, who may only create Events, names
    devices in Events about its own pods: its neighbour's gpu-5, the free gpu-7, its unopted pod's gpu-6,
    none of them tainted (`device_not_held`, `device_holder_not_opted_in`); then its opted-in pod's gpu-2,
    which is tainted, alone. Every device of the node is one a ResourceSlice of the pod's node publishes, so
    before this rule each of those Events tainted its device."""
    for path in ("/apis/resource.k8s.io/v1/resourceslices", RULES):
        try:
            await cluster.client.request("GET", path, query={"limit": "1"})
        except errors.NotFoundError:
            pytest.skip(f"this server serves no {path.removeprefix('/apis/')}: the test needs both (1.34 on)")
    suffix = secrets.token_hex(3)
    tenant_ns = await cluster.create_namespace(f"tenant-d-{suffix}")
    other_ns = await cluster.create_namespace(f"tenant-e-{suffix}")
    node = f"dev-{suffix}"
    await _node(cluster.client, node)
    await cluster.client.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}"} for i in range(8)]}})
    holders = {}
    for ns, job, opted, device in ((tenant_ns, "own", True, "gpu-2"), (tenant_ns, "unopted", False, "gpu-6"),
                                   (other_ns, "neighbour", True, "gpu-5")):
        await _job(cluster, ns, job, node, opted_in=opted, claim=True)
        pod = (await _pods(cluster, ns, job))[0]
        await cluster.harness.set_device_health(ns, pod["metadata"]["name"], "pytorch",
                                                resource_name=f"claim:{CLAIM}/gpu",
                                                resource_id=f"{DRIVER}/{node}/{device}", health="Healthy")
        holders[job] = pod["metadata"]
    neighbour_before = _state(await _pods(cluster, other_ns))

    def naming(pod: Obj, device: str, name: str) -> Obj:
        body = _event(tenant_ns, {"apiVersion": "v1", "kind": "Pod", "namespace": tenant_ns, "name": pod["name"],
                                  "uid": pod["uid"]}, name=name)
        body["metadata"]["annotations"].update({"kcover.io/dra-driver": DRIVER, "kcover.io/dra-pool": node,
                                                "kcover.io/dra-device": device})
        return body

    forged = [naming(holders["own"], "gpu-5", "neighbours-gpu"), naming(holders["own"], "gpu-7", "free-gpu"),
              naming(holders["unopted"], "gpu-6", "unopted-gpu")]
    leader = await _start(cluster, "a")
    try:
        async with cluster.harness.playing(), _tenant(cluster, tenant_ns) as tenant:
            for body in forged:
                await tenant.request("POST", f"/api/v1/namespaces/{tenant_ns}/events", body=body)

            async def refused() -> bool:
                return leader.rejected("device_not_held") >= 2 and leader.rejected("device_holder_not_opted_in") >= 1
            await _until(refused, "the three forged device Events to be refused")
            await asyncio.sleep(SETTLE)  # room for a wrongful taint to show
            assert await _kcover_rules(cluster, node) == {}, "no forged Event tainted a device"
            await tenant.request("POST", f"/api/v1/namespaces/{tenant_ns}/events",
                                 body=naming(holders["own"], "gpu-2", "own-gpu"))

            async def tainted() -> dict[str, Obj]:
                return await _kcover_rules(cluster, node)
            rules = await _until(tainted, "kcover's DeviceTaintRule of gpu-2")
            await asyncio.sleep(SETTLE)
            rules = await _kcover_rules(cluster, node)
            got = {reason: leader.rejected(reason) for reason in ("device_not_held", "device_holder_not_opted_in")}
    finally:
        await leader.shutdown()
        for r in (await _kcover_rules(cluster, node)).values():
            await cluster.client.request("DELETE", f"{RULES}/{r['metadata']['name']}")
        await cluster.client.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{node}-gpus")
    assert sorted(rules) == ["gpu-2"]
    assert rules["gpu-2"]["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-2"}
    assert got == {"device_not_held": 2.0, "device_holder_not_opted_in": 1.0}
    assert _state(await _pods(cluster, other_ns)) == neighbour_before, "the neighbour's pods were not touched"


async def test_a_signal_is_acted_on_once_across_a_restart_and_a_failover(cluster: Cluster) -> None:
    """An annotated Event about a pod that names no uid stays fresh for the staleness window (3 minutes), and
    the job's recreated pod has the same name: every new controller re-reads it. The ledger remembers the
    signal, so the job is restarted once, not once per controller (no cooldown here: only that memory holds)."""
    ns = cluster.namespace
    node = f"once-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, ns, "train", node)
    uid = train["metadata"]["uid"]
    pod = (await _pods(cluster, ns, "train"))[1]["metadata"]
    async with cluster.harness.playing():
        first = await _start(cluster, "a", workload_cooldown_seconds=0)
        try:
            await cluster.client.request("POST", f"/api/v1/namespaces/{ns}/events", body=_event(
                ns, {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": pod["name"]}, name="hang",
                reporter="healthcheck.example.com/checker", legacy=True))

            async def restarts() -> list[Obj]:
                return [e for e in await _events(cluster, ns)
                        if e.get("reason") == "KcoverRestartedWorkload" and e["involvedObject"].get("uid") == uid]
            await _until(restarts, "the restart")
            await _until(lambda: _recreated(cluster, ns, pod), "the worker recreated under its name")
        finally:
            await first.shutdown()  # a rollout: released, the next replica leads at once
        second = await _start(cluster, "b", workload_cooldown_seconds=0)
        try:
            await _until(_refused_replay(second), "b to refuse the replayed signal")
        finally:
            await second.shutdown(kill=True)  # a crash: the third waits for the Lease to expire
        third = await _start(cluster, "c", workload_cooldown_seconds=0)
        try:
            await _until(_refused_replay(third), "c to refuse the replayed signal")
            await asyncio.sleep(SETTLE)
            done = await restarts()
        finally:
            await third.shutdown()
    assert len(done) == 1
    entries = await cluster.client.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries")
    signals = [(e.get("data") or {}).get("signals", "") for e in entries["items"]]  # the per-unit ledger
    assert any(f"|w.{uid}" in held for held in signals), signals


async def _recreated(cluster: Cluster, ns: str, old: Obj) -> bool:
    pods = {p["metadata"]["name"]: p for p in await _pods(cluster, ns, "train")}
    now = pods.get(old["name"])
    return now is not None and now["metadata"]["uid"] != old["uid"] and not now["metadata"].get("deletionTimestamp")


def _refused_replay(replica: Replica) -> Any:
    async def probe() -> bool:
        return replica.sample("kcover_actions_total", {"action": "refuse", "result": "AlreadyActedOn"}) >= 1
    return probe


async def test_tampered_ledger_intents_are_dropped_and_delete_nothing(cluster: Cluster) -> None:
    """Intents written into the ledger's LedgerEntry objects by hand: for a workload that does not exist (naming
    bare pods that carry a job's labels), with an empty selector, for a job not opted in. The next leader drops
    each with an Event on its LedgerEntry and a count, and deletes nothing."""
    ns = cluster.namespace
    node = f"tamper-{secrets.token_hex(3)}"
    await _node(cluster.client, node)
    train = await _job(cluster, ns, "train", node)
    quiet = await _job(cluster, ns, "quiet", node, opted_in=False)
    for i in range(2):  # bare pods with the job's labels: nothing would recreate them
        await cluster.client.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bystander-{i}", "labels": {JOB_NAME: "train"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
    pods = await _pods(cluster, ns)
    bystanders = [p["metadata"]["uid"] for p in pods if p["metadata"]["name"].startswith("bystander")]
    train_uids = [p["metadata"]["uid"] for p in pods if p["metadata"]["name"].startswith("train")]
    quiet_uids = [p["metadata"]["uid"] for p in pods if p["metadata"]["name"].startswith("quiet")]
    now = clock_.utcnow().timestamp()

    def intent(ident: str, workload: tuple[str, str], selector: str, uids: list[str]) -> str:
        name, wuid = workload
        body = {"i": ident, "f": "forged", "l": "someone", "e": 1, "t": now, "m": "forged",
                "w": ["PyTorchJob", "kubeflow.org/v1", ns, name, wuid], "u": uids}
        if selector:
            body["s"] = selector
        return json.dumps({"t": [now], "d": "", "p": body})

    kf = "training.kubeflow.org/job-name={},training.kubeflow.org/operator-name=pytorchjob-controller"
    data = {
        "w.ghost-uid": intent("ghost", ("ghost", "ghost-uid"), f"{JOB_NAME}=train", bystanders),
        f"w.{train['metadata']['uid']}": intent("empty", ("train", train["metadata"]["uid"]), "", train_uids),
        f"w.{quiet['metadata']['uid']}": intent("quiet", ("quiet", quiet["metadata"]["uid"]), kf.format("quiet"),
                                                quiet_uids),
    }
    for key, value in data.items():  # written as a person with write access to LedgerEntries could
        await cluster.client.request("POST", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries", body={
            "apiVersion": "kcover.io/v1alpha1", "kind": "LedgerEntry",
            "metadata": {"name": f"kcover-ledger.{key}", "labels": {"kcover.io/ledger": "kcover-ledger"}},
            "data": {key: value}})
    before = _state(pods)
    leader = await _start(cluster, "a")
    try:
        async def refused() -> bool:
            return leader.sample("kcover_actions_total", {"action": "restart_workload", "result": "IntentRefused"}) >= 3
        await _until(refused, "the three intents to be refused")
        await asyncio.sleep(SETTLE)
        after = _state(await _pods(cluster, ns))
        ledger = await cluster.client.request("GET", f"/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries")
        events = [e for e in await _events(cluster, ns) if e.get("reason") == "KcoverIntentRefused"]
    finally:
        await leader.shutdown()
    assert after == before, "no pod was deleted"
    held = {k: v for entry in ledger["items"] for k, v in (entry.get("data") or {}).items()}
    assert not [v for k, v in held.items() if k in data and '"p"' in v], "every intent was dropped"
    assert len(events) == 3
    assert {e["involvedObject"]["kind"] for e in events} == {"LedgerEntry"}
    assert {e["involvedObject"]["name"] for e in events} == {f"kcover-ledger.{key}" for key in data}
    assert any("not in the cluster" in e["message"] for e in events)
    assert any("not opted in" in e["message"] for e in events)
    assert any("recorded selector ''" in e["message"] for e in events)
