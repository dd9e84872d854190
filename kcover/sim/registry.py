"""The table of resources the simulated API server serves.

Owns the static facts per resource: group, version, kind, plural, scope, subresources, which
field selectors are supported and how their values are read, the write rules that differ
between kinds (generation, PUT without resourceVersion, strategic merge) and a custom resource's
structural schema (`structural.Schema`). kcover's own kinds (Recovery, LedgerEntry, PreflightReport)
are read from their CRDs (`from_crd`), kept in kcover/sim/crds as copies of the chart's
helm/kcover/files/*-crd.yaml (a test holds them equal); the operators' kinds have the test CRDs'
schema, an object that preserves unknown fields. It holds no state. A resource is addressed by its
*key*: the plural for the core group (``"pods"``) and ``"<plural>.<group>"`` otherwise
(``"pytorchjobs.kubeflow.org"``, ``"jobs.batch"``). A CRD it cannot serve faithfully (a second version,
a scale subresource, a schema keyword `structural` does not carry out) raises `structural.SchemaError`.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kcover.sim import structural

Obj = dict[str, Any]
FieldGetter = Callable[[Obj], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Obj) -> str:
        cur: Any = obj
        for key in keys:
            if not isinstance(cur, dict):
                return ""
            cur = cur.get(key)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)

    return get


_META_FIELDS: Mapping[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}


def _event_source(obj: Obj) -> str:
    return _path("source", "component")(obj)


@dataclass(frozen=True)
class Column:
    """One `additionalPrinterColumns` entry of a CRD: name, type (string, integer, number, boolean, date),
    a simple JSONPath (`.status.phase`), priority (0 shown by default, more only with `-o wide`)."""

    name: str
    type: str
    json_path: str
    priority: int = 0
    description: str = ""


@dataclass(frozen=True)
class Resource:
    """Static description of one served resource (one group/version/plural)."""

    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    field_labels: Mapping[str, FieldGetter] = field(default_factory=lambda: dict(_META_FIELDS))
    has_generation: bool = False
    put_without_rv: bool = True
    strategic_merge: bool = True
    singular: str = ""
    store_key: str = ""
    columns: tuple[Column, ...] = ()
    """A custom resource's `additionalPrinterColumns`: with any, list and get answer `as=Table` requests."""
    returns_deleted: bool = False
    """DELETE answers with the deleted object, not a Status (kinds whose strategy says so: DeviceTaintRule)."""
    schema: structural.Schema | None = field(default=None, compare=False)
    """A custom resource's structural schema (pruning, defaults, validation); None for built-in kinds."""

    @property
    def key(self) -> str:
        """The store key: the plural for core, ``plural.group`` otherwise."""
        if self.store_key:
            return self.store_key
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def builtin(self) -> bool:
        """A kind compiled into kube-apiserver (custom resources refuse strategic merge; built-in ones take it).
        A built-in kind's list items carry no `kind`/`apiVersion`; a custom resource's do."""
        return self.strategic_merge

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def verbs(self) -> list[str]:
        return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _custom(plural: str, kind: str, group: str, version: str) -> Resource:
    return Resource(plural=plural, kind=kind, group=group, version=version, subresources=("status",),
                    has_generation=True, put_without_rv=False, strategic_merge=False, schema=structural.PRESERVE)


def from_crd(crd: Mapping[str, Any]) -> Resource:
    """The custom resource a CustomResourceDefinition (apiextensions.k8s.io/v1, one served version) defines."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec["versions"] if v.get("served", True)]
    if len(versions) != 1:
        raise structural.SchemaError(f"{crd['metadata']['name']}: one served version is served, not {len(versions)}")
    version = versions[0]
    subresources = version.get("subresources") or {}
    if set(subresources) - {"status"}:
        raise structural.SchemaError(f"{crd['metadata']['name']}: only the status subresource is served")
    columns = tuple(Column(c["name"], c["type"], c["jsonPath"], int(c.get("priority", 0)), c.get("description", ""))
                    for c in version.get("additionalPrinterColumns") or ())
    return Resource(plural=names["plural"], kind=names["kind"], group=spec["group"], version=version["name"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced", subresources=tuple(subresources),
                    short_names=tuple(names.get("shortNames") or ()), singular=names.get("singular", ""),
                    has_generation=True, put_without_rv=False, strategic_merge=False, columns=columns,
                    schema=structural.build(version["schema"]["openAPIV3Schema"]))


def _packaged_crds() -> tuple[Resource, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    folder = importlib.resources.files("kcover.sim").joinpath("crds")
    return tuple(from_crd(yaml.load(item.read_text(encoding="utf-8"), Loader=loader))
                 for item in sorted(folder.iterdir(), key=lambda i: i.name) if item.name.endswith(".yaml"))


POD_FIELDS: Mapping[str, FieldGetter] = {
    **_META_FIELDS,
    "spec.nodeName": _path("spec", "nodeName"),
    "spec.restartPolicy": _path("spec", "restartPolicy"),
    "spec.schedulerName": _path("spec", "schedulerName"),
    "spec.serviceAccountName": _path("spec", "serviceAccountName"),
    "spec.hostNetwork": lambda obj: "true" if (obj.get("spec") or {}).get("hostNetwork") else "false",
    "status.phase": _path("status", "phase"),
    "status.podIP": _path("status", "podIP"),
    "status.nominatedNodeName": _path("status", "nominatedNodeName"),
}
"""The pod field labels kube-apiserver supports (PodToSelectableFields), checked against a real server."""
NODE_FIELDS: Mapping[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "spec.unschedulable": lambda obj: "true" if (obj.get("spec") or {}).get("unschedulable") else "false",
}
CORE_EVENT_FIELDS: Mapping[str, FieldGetter] = {
    **_META_FIELDS,
    "involvedObject.kind": _path("involvedObject", "kind"),
    "involvedObject.namespace": _path("involvedObject", "namespace"),
    "involvedObject.name": _path("involvedObject", "name"),
    "involvedObject.uid": _path("involvedObject", "uid"),
    "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
    "involvedObject.resourceVersion": _path("involvedObject", "resourceVersion"),
    "involvedObject.fieldPath": _path("involvedObject", "fieldPath"),
    "reason": _path("reason"),
    "reportingComponent": _path("reportingComponent"),
    "type": _path("type"),
    "source": _event_source,
}
# events.k8s.io/v1 names the same stored fields differently; values are read from the core shape.
NEW_EVENT_FIELDS: Mapping[str, FieldGetter] = {
    **_META_FIELDS,
    "regarding.kind": _path("involvedObject", "kind"),
    "regarding.namespace": _path("involvedObject", "namespace"),
    "regarding.name": _path("involvedObject", "name"),
    "regarding.uid": _path("involvedObject", "uid"),
    "regarding.apiVersion": _path("involvedObject", "apiVersion"),
    "regarding.resourceVersion": _path("involvedObject", "resourceVersion"),
    "regarding.fieldPath": _path("involvedObject", "fieldPath"),
    "reason": _path("reason"),
    "reportingController": _path("reportingComponent"),
    "type": _path("type"),
}
RESOURCE_SLICE_FIELDS: Mapping[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "spec.nodeName": _path("spec", "nodeName"),
    "spec.driver": _path("spec", "driver"),
}
"""kube-apiserver's ResourceSlice field labels (resource.k8s.io/v1)."""
NAMESPACE_FIELDS: Mapping[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "status.phase": _path("status", "phase"),
}

RESOURCES: tuple[Resource, ...] = (
    Resource(plural="pods", kind="Pod", subresources=("status", "log", "binding", "eviction"), short_names=("po",),
             field_labels=POD_FIELDS, has_generation=True),
    Resource(plural="nodes", kind="Node", namespaced=False, subresources=("status",), short_names=("no",),
             field_labels=NODE_FIELDS),
    Resource(plural="events", kind="Event", short_names=("ev",), field_labels=CORE_EVENT_FIELDS),
    Resource(plural="configmaps", kind="ConfigMap", short_names=("cm",)),
    Resource(plural="secrets", kind="Secret"),
    Resource(plural="namespaces", kind="Namespace", namespaced=False, subresources=("status",),
             short_names=("ns",), field_labels=NAMESPACE_FIELDS),
    Resource(plural="events", kind="Event", group="events.k8s.io", short_names=("ev",),
             field_labels=NEW_EVENT_FIELDS, store_key="events"),
    Resource(plural="leases", kind="Lease", group="coordination.k8s.io", put_without_rv=False),
    Resource(plural="jobs", kind="Job", group="batch", subresources=("status",), has_generation=True),
    Resource(plural="daemonsets", kind="DaemonSet", group="apps", subresources=("status",), short_names=("ds",),
             has_generation=True),
    Resource(plural="poddisruptionbudgets", kind="PodDisruptionBudget", group="policy", subresources=("status",),
             short_names=("pdb",), has_generation=True),
    Resource(plural="resourceslices", kind="ResourceSlice", group="resource.k8s.io", namespaced=False,
             field_labels=RESOURCE_SLICE_FIELDS, has_generation=True),
    Resource(plural="resourceclaims", kind="ResourceClaim", group="resource.k8s.io", subresources=("status",),
             has_generation=True),
    # KEP-5055 device taints: v1beta2 in 1.36, with the DRADeviceTaintRules gate and its runtime-config
    Resource(plural="devicetaintrules", kind="DeviceTaintRule", group="resource.k8s.io", version="v1beta2",
             namespaced=False, subresources=("status",), has_generation=True, returns_deleted=True),
    _custom("pytorchjobs", "PyTorchJob", "kubeflow.org", "v1"),
    _custom("tfjobs", "TFJob", "kubeflow.org", "v1"),
    _custom("mpijobs", "MPIJob", "kubeflow.org", "v1"),
    _custom("xgboostjobs", "XGBoostJob", "kubeflow.org", "v1"),
    _custom("paddlejobs", "PaddleJob", "kubeflow.org", "v1"),
    _custom("jaxjobs", "JAXJob", "kubeflow.org", "v1"),
    _custom("trainjobs", "TrainJob", "trainer.kubeflow.org", "v1alpha1"),
    _custom("jobsets", "JobSet", "jobset.x-k8s.io", "v1alpha2"),
    _custom("jobs", "Job", "batch.volcano.sh", "v1alpha1"),
    _custom("leaderworkersets", "LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1"),
    # kcover's own kinds, from their CRDs (kcover/sim/crds): LedgerEntry, PreflightReport, Recovery
    *_packaged_crds(),
)


class Registry:
    """Look-ups over `RESOURCES`: by URL (group, version, plural) and by store key."""

    def __init__(self, resources: tuple[Resource, ...] = RESOURCES) -> None:
        self.resources = resources
        self._by_url = {(r.group, r.version, r.plural): r for r in resources}
        self._by_key: dict[str, Resource] = {}
        for r in resources:
            self._by_key.setdefault(r.key, r)
        self.unserved: set[str] = set()
        """Store keys whose paths answer 404 (a custom resource whose CRD was deleted: `SimServer.delete_crd`)."""

    def by_url(self, group: str, version: str, plural: str) -> Resource | None:
        found = self._by_url.get((group, version, plural))
        return None if found is None or found.key in self.unserved else found

    def by_key(self, key: str) -> Resource:
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"unknown resource key {key!r}; known: {sorted(self._by_key)}") from None

    def resource_keys(self) -> list[str]:
        return list(self._by_key)

    def group_versions(self) -> dict[str, list[str]]:
        """Non-core groups and their served versions, in table order."""
        out: dict[str, list[str]] = {}
        for r in self.resources:
            if r.group and r.version not in out.setdefault(r.group, []):
                out[r.group].append(r.version)
        return out
