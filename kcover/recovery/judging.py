"""Blame before action: what a fault is attributed to, and the differential evidence against a node or a GPU.

Owns two judgements the plan makes before it acts:

* `attribute(event)`: a device, a node, the workload or unknown (`model.Blame`), from the fault's source and
  its typed fields alone, never from text its writer chose. Hardware signals blame the device or the node:
  an XID whose class in kcover's own XID catalog (`kcover/data/xid-policy.yaml`, not the writer's word) is
  hardware, driver or NVLink, a DCGM check, a DRA device's `Unhealthy` status (the kubelet's), a node
  condition. Application signals blame the workload: a container's exit, an application-class XID. A
  Pod's Event blames at most its own workload, whatever it claims.
* `suspicion(...)`: differential evidence against the node (or one GPU) of a fault blamed on a workload
  (or of a hardware XID that only restarts, such as 94),
  read from the ledger's restarts and where their faults were (`ledger.Failure`): `node_workloads`
  different workloads restarted for faults on the node within `window_seconds`, `device_workloads` on one
  GPU, or one workload restarted `same_workload_restarts` times for faults only there, from different pods
  of it, while it runs elsewhere too, or `device_restarts` times for faults all naming one GPU (an XID
  on the same device each time, as NVIDIA's workflows for XIDs 13 and 31 read repeats: a faulty GPU, or a
  rank's own bug, which the validation tells apart), or `hardware_xid_restarts` times (once, by default)
  for a hardware XID that only restarts (94) on one GPU: no job's own bug raises that one.
  Restarts before the node's last verdict do not count again.

What follows is the plan's (`planning`): a fault blamed on a workload restarts it and moves no node
(`recovery.judgement.workload_blame`); a suspect node is validated by its agent, and only a failed
validation cordons it. Pure: plain values and the ledger's read side in, a value out; it never raises.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kcover import model, settings
from kcover.kube import projections as proj
from kcover.nvml import xid_policy
from kcover.recovery import controls, ledger, ledgerentries
from kcover.recovery import steps as st

AK = model.Action
B = model.Blame
DRA_HEALTH = "dra-health"
NODE_CONDITION = "node-condition"
HARDWARE_CLASSES = frozenset({xid_policy.XidClass.HARDWARE, xid_policy.XidClass.DRIVER, xid_policy.XidClass.NVLINK})
SUSPECT_NODE = "suspect_node"
SUSPECT_DEVICE = "suspect_device"


@functools.cache
def _catalog() -> xid_policy.XidPolicy:
    return xid_policy.load()


def xid_class(xid: int) -> xid_policy.XidClass:
    """The class kcover's own XID catalog gives `xid` (`unknown` for a code it does not list)."""
    return _catalog().entry(xid).xid_class


def _names_device(fault: model.Fault) -> bool:
    return fault.dra is not None or fault.gpu_index is not None or bool(fault.gpu_uuid)


def attribute(event: model.CollectorEvent) -> model.Blame:
    """What `event`'s fault is attributed to; see the module docstring."""
    fault, target = event.fault, event.target
    if target.kind in (model.TargetKind.POD, model.TargetKind.WORKLOAD):
        if event.detector == DRA_HEALTH and fault.dra is not None:
            return B.DEVICE  # allocatedResourcesStatus: the kubelet's word on the device, not the tenant's
        return B.WORKLOAD
    if fault.xid is not None:
        cls = xid_class(fault.xid)
        if cls is xid_policy.XidClass.APPLICATION:
            return B.WORKLOAD
        if cls in HARDWARE_CLASSES:
            return B.DEVICE if _names_device(fault) else B.NODE
        return B.UNKNOWN
    if fault.dra is not None or target.kind is model.TargetKind.DEVICE:
        return B.DEVICE
    if event.detector == NODE_CONDITION or fault.check:
        return B.DEVICE if _names_device(fault) else B.NODE
    return B.UNKNOWN


def spared(kind: model.Action, blame: model.Blame) -> model.Action:
    """The action with the node left out when the workload is to blame: a cordon becomes a report, a cordon
    and restart a restart. Other blames keep the action."""
    if blame is not B.WORKLOAD:
        return kind
    if kind is AK.CORDON_NODE:
        return AK.REPORT
    if kind is AK.CORDON_NODE_AND_RESTART:
        return AK.RESTART_WORKLOAD
    return kind


def device_of(fault: model.Fault) -> str:
    """The device a fault names, as the ledger records it: the DRA device, else the GPU's uuid or index."""
    if fault.dra is not None:
        return fault.dra.resource_id
    if fault.gpu_uuid:
        return fault.gpu_uuid
    return f"gpu{fault.gpu_index}" if fault.gpu_index is not None else ""


def place_of(node: str, fault: model.Fault) -> str:
    """Where a restart's fault was, as the ledger records it (`<node>` or `<node>/<device>`)."""
    device = device_of(fault)
    return f"{node}/{device}" if node and device else node


class View(controls.View, Protocol):
    """What the judgement reads of the cluster (`caching.ClusterCache` provides it)."""

    def pods_of_workload(self, uid: str) -> Sequence[proj.Pod]: ...


class Evidence(Protocol):
    """What the judgement reads of the ledger (`ledger.Ledger` provides it)."""

    def failures_at(self, node: str, since: float) -> list[ledger.Failure]: ...

    def unit(self, key: str) -> ledgerentries.Unit | None: ...

    def node(self, name: str) -> ledgerentries.Node | None: ...


@dataclass(frozen=True)
class Suspicion:
    """Differential evidence against a node (or one GPU on it)."""

    node: str
    device: str
    """The GPU the evidence is about, "" for the node as a whole."""
    rule: str
    """`suspect_node` or `suspect_device`: the `recovery.judgement` field whose mode applies."""
    text: str


def since_for(evidence: Evidence, node: str, js: settings.JudgementSettings, now: float) -> float:
    """The start of the evidence window for `node`: the window, or the node's last verdict if later."""
    since = now - js.window_seconds
    entry = evidence.node(node)
    if entry is not None and entry.judged_at is not None:
        since = max(since, entry.judged_at + 1e-3)
    return since


def suspicion(*, key: str, node: str, device: str, rank: str, runs_elsewhere: bool, evidence: Evidence,
              js: settings.JudgementSettings, now: float, hardware: bool = False) -> Suspicion | None:
    """The evidence a restart of unit `key` for a fault on `node` (`device`, from its pod `rank`) adds up
    to, with what the ledger holds; None when it is short of every rule (or the rules are off). `hardware`:
    the restart's fault is a hardware XID that only restarts (94), counted against `hardware_xid_restarts`
    instead of `device_restarts`."""
    if not node:
        return None
    since = since_for(evidence, node, js, now)
    rows = evidence.failures_at(node, since)
    others = [f for f in rows if f.key != key]
    if device and js.suspect_device is not settings.JudgementMode.OFF:
        on_device = sorted({f.key for f in others if f.device == device})
        if len(on_device) + 1 >= js.device_workloads:
            return Suspicion(node, device, SUSPECT_DEVICE, f"{len(on_device) + 1} different workloads restarted for "
                             f"faults on GPU {device} of Node {node} within {js.window_seconds:g}s "
                             f"(recovery.judgement.device_workloads {js.device_workloads})")
    own = [f for f in rows if f.key == key]
    if device and js.suspect_device is not settings.JudgementMode.OFF:
        here = [f for f in own if f.device == device]
        needed, setting = (js.hardware_xid_restarts, "hardware_xid_restarts") if hardware else \
            (js.device_restarts, "device_restarts")
        if len(here) + 1 >= needed and _only_here(evidence.unit(key), node, since, device=device):
            times = "once" if len(here) == 0 else f"{len(here) + 1} times"
            what = "for a hardware XID on GPU" if hardware else "for faults only on GPU"
            return Suspicion(node, device, SUSPECT_DEVICE, f"one workload restarted {times} within "
                             f"{js.window_seconds:g}s {what} {device} of Node {node} "
                             f"(recovery.judgement.{setting} {needed})")
    if js.suspect_node is settings.JudgementMode.OFF:
        return None
    distinct = sorted({f.key for f in others})
    if len(distinct) + 1 >= js.node_workloads:
        return Suspicion(node, "", SUSPECT_NODE, f"{len(distinct) + 1} different workloads restarted for faults on "
                         f"Node {node} within {js.window_seconds:g}s (recovery.judgement.node_workloads "
                         f"{js.node_workloads})")
    if runs_elsewhere and len(own) + 1 >= js.same_workload_restarts and _only_here(evidence.unit(key), node, since):
        ranks = {r for r in (*(f.rank for f in own), rank) if r}
        if len(ranks) >= 2:
            return Suspicion(node, "", SUSPECT_NODE, f"one workload restarted {len(own) + 1} times within "
                             f"{js.window_seconds:g}s for faults only on Node {node}, from {len(ranks)} different pods "
                             "of it, while it also runs on other nodes (recovery.judgement.same_workload_restarts "
                             f"{js.same_workload_restarts})")
    return None


def _only_here(unit: ledgerentries.Unit | None, node: str, since: float, *, device: str = "") -> bool:
    """Every restart of the unit since `since` was for a fault on `node`; with `device`, every one of them
    for a fault on `node` was on that GPU (restarts for faults on other nodes, which a large job has many
    of, say nothing about it)."""
    if unit is None:
        return True
    places: Sequence[str] = [p for t, p in zip(unit.restarts, unit.placed(), strict=True) if t >= since]
    if device:
        return all(p == f"{node}/{device}" for p in places if p.partition("/")[0] == node)
    return all(p.partition("/")[0] == node for p in places)


def hardware_signal(conditions: Sequence[tuple[str, str]], js: settings.JudgementSettings) -> str:
    """The first of `judgement.hardware_conditions` a node shows `False` (type, status pairs), or ""."""
    for kind, status in conditions:
        if kind in js.hardware_conditions and status == "False":
            return kind
    return ""


def _evidence_for(step: st.Restart) -> bool:
    """A restart whose fault can make its node suspect: one blamed on the workload, or one for a hardware XID
    that kcover's own XID catalog only restarts for (94, a contained ECC error: the device is blamed, yet no
    node is moved until it repeats), whatever the report recommended. An XID the catalog isolates for (48,
    79, 95) is not evidence: its own step isolates, and a device taint is not widened to a cordon by a
    validation. A restart a verdict already answered (`steps.Restart.judged`) is none again."""
    if step.judged:
        return False
    xid = step.cause.fault.xid
    return step.blame is B.WORKLOAD or (step.blame is B.DEVICE and xid is not None
                                        and _catalog().entry(xid).action is AK.RESTART_WORKLOAD)


def suspects(steps: Sequence[st.Step], view: View, evidence: Evidence, rs: settings.RecoverySettings,
             now: float) -> list[st.Step]:
    """The validations of the nodes the restarts in `steps` for workloads' faults (and for hardware XIDs that
    only restart) make suspect: at most one per node, none for a node that is unschedulable or paused, or
    suspect and not answered yet. A rule in `record` mode gives a `RecordOnly` validation."""
    js = rs.judgement
    out: list[st.Step] = []
    asked: set[str] = set()
    for step in steps:
        if not isinstance(step, st.Restart) or not _evidence_for(step) or not step.node or step.node in asked:
            continue
        node = view.node(step.node)
        entry = evidence.node(step.node)
        if node is None or node.unschedulable or controls.paused_scope(view, node=step.node):
            continue
        if entry is not None and entry.pending_suspicion() and entry.suspect_at is not None \
                and now - entry.suspect_at < js.validation_timeout_seconds:
            continue
        elsewhere = any(q.node and q.node != step.node and not q.deleting and not q.terminal
                        for q in view.pods_of_workload(step.workload.uid))
        found = suspicion(key=step.unit_key, node=step.node, device=device_of(step.cause.fault), rank=step.rank,
                          runs_elsewhere=elsewhere, evidence=evidence, js=js, now=now,
                          hardware=step.blame is B.DEVICE)
        if found is None:
            continue
        asked.add(step.node)
        ask = st.RequestValidation(node=step.node, cause=step.cause, purpose=st.Purpose.SUSPECT, evidence=found.text)
        mode = js.suspect_device if found.rule == SUSPECT_DEVICE else js.suspect_node
        out.append(st.RecordOnly(ask, f"recovery.judgement.{found.rule}: record")
                   if mode is settings.JudgementMode.RECORD else ask)
    return out
