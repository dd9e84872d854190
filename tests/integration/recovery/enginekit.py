"""The controller's recovery over a test backend's client, for the backend-parametrized recovery tests.

`Rig` builds the engine as the controller does (`recovering.build`) over the backend's client (`cluster`
fixture, tests/backends.py), with the product's `ClusterCache` filled offline from what the server holds
(so request counts show only what recovery sends). Real time: these tests pin real API semantics.
`run_cli` runs kcover's commands (`kcover status`, `kcover breaker reset`) in-process, as a person runs them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
from typing import Any

import orjson

from kcover import cli, errors, kinds, metrics, model, settings
from kcover.controller import recovering
from kcover.kube import caching, client
from kcover.kube import projections as proj
from kcover.recovery import ledger, ledgerentries
from kcover.recovery import steps as st

Cluster = Any  # tests/backends.py's Cluster
KF = "kubeflow.org/v1"


class Clock:
    def __init__(self) -> None:
        self.moment = dt.datetime.now(dt.UTC)

    def now(self) -> dt.datetime:
        return self.moment

    def monotonic(self) -> float:
        return self.moment.timestamp()


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


async def make_pod(cluster: Cluster, name: str, node: str, labels: dict[str, str],
                   owner: dict[str, Any] | None) -> dict[str, Any]:
    ns = cluster.namespace
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    await cluster.harness.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "trainer"}]}})
    return dict(await cluster.harness.run_pod(ns, name))


async def create(cluster: Cluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = await cluster.harness.kube.request("POST", path, body=body)
    out.setdefault("apiVersion", body.get("apiVersion"))
    out.setdefault("kind", body.get("kind"))
    return out


async def seed(cluster: Cluster, *, operator_labels: bool = True) -> dict[str, Any]:
    ns = cluster.namespace
    for i in range(10):
        await create(cluster, "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i}"},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]} if i == 0 else {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    pt = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", {
        "apiVersion": KF, "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": ns, "labels": {proj.OPT_IN_LABEL: "true"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3, "restartPolicy": "OnFailure"}}}})
    tf = await create(cluster, f"/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs", {
        "apiVersion": KF, "kind": "TFJob", "metadata": {"name": "train", "namespace": ns}, "spec": {}})
    try:
        rs: dict[str, Any] | None = await create(cluster, f"/apis/apps/v1/namespaces/{ns}/replicasets", {
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "debug", "namespace": ns},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "debug"}},
                     "template": {"metadata": {"labels": {"app": "debug"}},
                                  "spec": {"containers": [{"name": "c", "image": "trainer"}]}}}})
    except errors.NotFoundError:  # a server without apps/v1
        rs = None

    def kf_labels(op: str) -> dict[str, str]:
        out = {kinds.KUBEFLOW_JOB_NAME: "train"}
        if operator_labels:
            out[kinds.KUBEFLOW_OPERATOR_NAME] = op
        return out

    for i in range(3):
        await make_pod(cluster, f"train-worker-{i}", f"gpu-{i}", kf_labels("pytorchjob-controller"), pt)
    for i in range(2):
        await make_pod(cluster, f"train-chief-{i}", f"gpu-{i}", kf_labels("tfjob-controller"), tf)
    # another workload carrying the same label value (a debug pod copied from the job's template)
    await make_pod(cluster, "train-debug", "gpu-5", {kinds.KUBEFLOW_JOB_NAME: "train"}, rs)
    return {"pt": pt, "tf": tf}


async def items(cluster: Cluster, path: str) -> list[dict[str, Any]]:
    """The objects of a LIST, each with its apiVersion and kind (lists of built-in types omit them)."""
    listed = await cluster.harness.kube.request("GET", path)
    out = listed.get("items") or []
    for item in out:
        item.setdefault("apiVersion", listed.get("apiVersion"))
        item.setdefault("kind", str(listed.get("kind", "")).removesuffix("List"))
    return list(out)


async def cluster_objects(cluster: Cluster) -> list[dict[str, Any]]:
    """What the controller's cache lists: the test namespace's pods and workloads, all nodes and ResourceSlices."""
    ns = cluster.namespace
    out = [*await items(cluster, f"/api/v1/namespaces/{ns}/pods"), *await items(cluster, "/api/v1/nodes")]
    for path in (f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", f"/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs",
                 f"/apis/batch/v1/namespaces/{ns}/jobs", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
                 "/apis/resource.k8s.io/v1/resourceslices"):
        with contextlib.suppress(errors.NotFoundError):  # a server without that group
            out += await items(cluster, path)
    return out


async def snapshot(cluster: Cluster) -> caching.ClusterCache:
    """The product's cluster model (a `ClusterCache`), filled through its reflectors' list path."""
    return caching.ClusterCache.offline(await cluster_objects(cluster))


class Fence:
    def __init__(self, leading: Any) -> None:
        self._leading = leading

    def write_seconds_left(self) -> float:
        return 10.0 if self._leading() else 0.0


class Rig:
    """The controller's recovery over the backend's client (`recovering.build`), with an offline snapshot."""

    def __init__(self, cluster: Cluster, clock: Clock, snap: caching.ClusterCache, *,
                 save_logs: Any = None, **overrides: Any) -> None:
        self.cluster = cluster
        self.kube: client.KubeClient = cluster.client
        self.clock = clock
        self.leading = True
        self.settings = settings.Settings.model_validate({"lease": {"enabled": False}, "recovery": {
            "ledger_namespace": cluster.namespace, "save_logs": {"enabled": save_logs is not None}, **overrides}})
        self.metrics = metrics.Metrics()
        self.snap = snap
        self.leader = recovering.build(recovering.EngineDeps(
            settings=self.settings, client=self.kube, cache=snap, metrics=self.metrics, clock=clock,
            is_leader=lambda: self.leading, epoch=lambda: 1, identity="test-replica", fence=Fence(lambda: self.leading)))
        if save_logs is not None:
            self.leader.inner.coordinator.restarter._save_logs = save_logs

    @property
    def engine(self) -> Any:
        return self.leader.inner

    @property
    def ledger(self) -> ledger.Ledger:
        return self.leader.ledger

    @classmethod
    async def make(cls, cluster: Cluster, clock: Clock, **overrides: Any) -> Rig:
        return cls(cluster, clock, await snapshot(cluster), **overrides)

    async def refresh(self) -> None:
        self.snap.load(await cluster_objects(self.cluster))

    async def handle(self, event: model.CollectorEvent) -> list[st.Outcome]:
        """The outcomes of one event's steps (its Events' outcomes left out)."""
        before = len(self.engine.outcomes)
        await self.leader.handle([event])
        return [o for o in list(self.engine.outcomes)[before:] if not isinstance(o.step, st.Emit)]



async def get(cluster: Cluster, path: str) -> dict[str, Any]:
    return dict(await cluster.harness.kube.request("GET", path))


async def pod_fault(cluster: Cluster, name: str, clock: Clock) -> model.CollectorEvent:
    ns = cluster.namespace
    pod = await get(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
    return model.CollectorEvent(detector="pod-status", severity=model.Severity.ERROR, reason="ContainerError",
                                message="exit code 1", observed_at=clock.now(),
                                target=model.Target(kind=model.TargetKind.POD, namespace=ns, name=name,
                                                    uid=pod["metadata"]["uid"]))


def node_fault(node: str, clock: Clock, *, recommended: model.Action | None = None) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU has fallen off the bus", observed_at=clock.now(), recommended=recommended,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node))


async def alive(cluster: Cluster) -> set[str]:
    """Pods not deleted and not terminating."""
    return {o["metadata"]["name"] for o in await items(cluster, f"/api/v1/namespaces/{cluster.namespace}/pods")
            if not o["metadata"].get("deletionTimestamp")}


async def events(cluster: Cluster) -> list[dict[str, Any]]:
    """Events in the test's namespace, and Node events (kept in "default")."""
    return [*await items(cluster, f"/api/v1/namespaces/{cluster.namespace}/events"),
            *[e for e in await items(cluster, "/api/v1/namespaces/default/events")
              if e["involvedObject"].get("kind") == "Node"]]


def writes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.split()[0] in ("CREATE", "UPDATE", "DELETE", "DELETECOLLECTION", "PATCH"))


async def ledger_data(cluster: Cluster) -> dict[str, Any]:
    """Every LedgerEntry's entries (key -> decoded JSON) in the test's namespace."""
    out: dict[str, Any] = {}
    for item in await items(cluster, f"/apis/kcover.io/v1alpha1/namespaces/{cluster.namespace}/ledgerentries"):
        for key, raw in (item.get("data") or {}).items():
            if key != ledgerentries.SIGNALS:
                out[key] = orjson.loads(raw)
    return out


def done(outcomes: list[st.Outcome]) -> list[str]:
    return [f"{st.name_of(o.step)}:{st.result_of(o)}" for o in outcomes]


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`kcover <argv>` in this process: its exit code, stdout and stderr (blocking: run it in a thread)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()
