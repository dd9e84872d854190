"""The PreflightReport custom resource: its CRD, its name, the body the agent creates and the status the
controller writes, and reading one back.

Owns the mapping between kcover's objects and `kcover.io/v1alpha1 PreflightReport` (short name pfr):
the spec is the Go project's (`workloadName`, `workloadUID`, `nodeName`, `rank`, `report` as the file's
JSON text, `observedAt`), owned by the pod it came from, with a deterministic name; the status is
kcover's (`verdict`, `nodeVerdict`, per-pair busbw, `slowNodes`, `missingRanks`). Pure: no I/O.
How it fails: `read()` returns None for an object that is not a readable PreflightReport.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources as importlib_resources
from typing import Any

import yaml

from kcover.detectors import contract
from kcover_preflight import judging, reports

GROUP = "kcover.io"
VERSION = "v1alpha1"
KIND = "PreflightReport"
PLURAL = "preflightreports"
API_VERSION = f"{GROUP}/{VERSION}"
PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
WORKLOAD_LABEL = "kcover.io/preflight-workload"
"""Label of a PreflightReport naming its workload, for `kubectl get pfr -l`."""
NAME_MAX = 253
MESSAGE_MAX = 1024
REASON_MAX = 512
"""The CRD's `maxLength` of `status.message` and `status.pairs[].reason`. A CRD schema's maxLength counts
characters (Unicode code points), not the UTF-8 bytes that core fields such as an Event's message are
measured in: 1,024 CJK characters (3,072 bytes) are accepted, 1,025 are refused (tested against the real
kube-apiserver in tests/integration/scenarios/test_preflight.py). So these cut by characters, which keeps
three times the text `model.fit` would for CJK."""


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition (the plugin's `crd.yaml`)."""
    text = importlib_resources.files("kcover_preflight").joinpath("crd.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def collection(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"


def name_for(workload: str, rank: int, pod_uid: str) -> str:
    """`<workload>-<rank>-<8 hex of the pod uid>`: the same pod and rank always give the same name, and a
    restarted job's new pods (same names, new uids) new ones. Cut to a valid object name."""
    digest = hashlib.sha256(pod_uid.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9.-]+", "-", workload.lower()).strip("-.") or "workload"
    suffix = f"-{rank}-{digest}"
    return base[:NAME_MAX - len(suffix)].rstrip("-.") + suffix


def _time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


def body(*, pod: PodRef, workload: str, workload_uid: str, node: str, report_text: str,
         report: reports.Report, observed_at: dt.datetime) -> dict[str, Any]:
    """The object the agent creates for one report."""
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": name_for(workload, report.rank, pod.uid), "namespace": pod.namespace,
            "labels": {WORKLOAD_LABEL: workload[:63].rstrip("-._")},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "spec": {"workloadName": workload, "workloadUID": workload_uid, "nodeName": node, "rank": report.rank,
                 "report": report_text, "observedAt": _time(observed_at)},
    }


@dataclass(frozen=True)
class Stored:
    """A PreflightReport read back from the API."""

    namespace: str
    name: str
    uid: str
    rv: str
    pod_uid: str
    workload: str
    workload_uid: str
    node: str
    rank: int
    observed_at: dt.datetime
    report: reports.Report | None
    """None when the report text is not a readable report (`problem` says why)."""
    problem: str
    status: Mapping[str, Any]


def _parse_time(value: Any) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(dt.UTC)
    except ValueError:
        return dt.datetime.fromtimestamp(0, dt.UTC)


def read(obj: Mapping[str, Any]) -> Stored | None:
    """The PreflightReport in an API object, or None when it is not one."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not meta.get("uid"):
        return None
    owner = next((str(r.get("uid", "")) for r in meta.get("ownerReferences") or []
                  if isinstance(r, Mapping) and r.get("kind") == "Pod"), "")
    problem = ""
    parsed: reports.Report | None = None
    try:
        parsed = reports.parse(str(spec.get("report", "")))
    except reports.ReportError as exc:
        problem = str(exc)
    try:
        rank = int(spec.get("rank", -1))
    except (TypeError, ValueError):
        return None
    return Stored(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta["uid"]),
                  rv=str(meta.get("resourceVersion", "")), pod_uid=owner,
                  workload=str(spec.get("workloadName", "")), workload_uid=str(spec.get("workloadUID", "")),
                  node=str(spec.get("nodeName", "")), rank=rank, observed_at=_parse_time(spec.get("observedAt")),
                  report=parsed, problem=problem, status=dict(obj.get("status") or {}))


def pending_status() -> dict[str, Any]:
    return {"verdict": judging.Verdict.PENDING.value, "nodeVerdict": "Unknown"}


def status_for(judgement: judging.Judgement, node: str, *, judged_at: dt.datetime) -> dict[str, Any]:
    """The status of one node's PreflightReport under the workload's judgement."""
    mine = judgement.pairs_of(node)
    measured = [p.busbw_gbps for p in mine if p.busbw_gbps is not None]
    node_verdict = "Slow" if node in judgement.slow_nodes else ("Healthy" if mine else "Unknown")
    status: dict[str, Any] = {
        "verdict": judgement.verdict.value, "nodeVerdict": node_verdict,
        "slowNodes": sorted(judgement.slow_nodes), "missingRanks": list(judgement.missing_ranks),
        "judgedAt": _time(judged_at),
        "pairs": [_pair(p) for p in mine],
    }
    if measured:
        status["minBusbwGbps"] = round(min(measured), 3)
    if node in judgement.slow_nodes:
        status["message"] = judgement.slow_nodes[node][:MESSAGE_MAX]
    return status


def _pair(p: judging.PairResult) -> dict[str, Any]:
    out: dict[str, Any] = {"batch": p.batch, "nodes": list(p.nodes), "slow": p.slow}
    if p.size_bytes is not None:
        out["sizeBytes"] = p.size_bytes
    if p.busbw_gbps is not None:
        out["busbwGbps"] = round(p.busbw_gbps, 3)
    if p.median_gbps is not None:
        out["medianGbps"] = round(p.median_gbps, 3)
    if p.why:
        out["reason"] = p.why[:REASON_MAX]
    return out


def same_status(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when writing `wanted` would change nothing a reader sees (the judgement time aside)."""
    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "judgedAt"}
    return strip(current) == strip(wanted)


def inline(name: str, bus: object) -> None:
    """Refuse to run isolated: both detectors list, watch and write through kcover's own Kubernetes client
    (`context.gateway`), whose connections belong to the process's loop, and read the controller's cache.
    Their entries must say `isolated: false`; they block nothing (file reads run in a thread)."""
    if not isinstance(bus, contract.Bus):
        raise contract.DetectorUnavailableError(
            f"{name} must run on kcover's own loop: set detectors.entries.{name}.isolated to false")
