"""The `preflight` detector (controller): judge each workload's PreflightReports and publish the slow nodes.

Owns the loop around the pure verdict (`judging.judge`): a watch of every PreflightReport, grouping them
by the workload their pods belong to (only reports whose pod is still in the cluster cache count: a
restarted job's old pods' reports are history; and only those `vetting.vet` admits: a report speaks for
its own pod's node and workload, or is refused, counted in `kcover_preflight_reports_refused_total{reason}`
and logged once), judging a workload once its ranks have all reported (`vetting.expected_size`), or once
`collection_timeout_seconds` passed since its first report (swept every `sweep_seconds`), and then

* publishing one `PreflightSlowNode` fault per slow node, targeting the Node and recommending
  `slow_action` (cordon-node-and-restart by default): the recovery engine decides, bounded by its
  rules, breaker, cooldowns and dry-run, as for every other fault; this detector never touches a node;
* on a timeout, publishing `PreflightIncomplete` about the workload (recommending `report`: the engine
  writes the Event), setting `kcover_preflight_missing_ranks{namespace,workload,rank}`, and, with
  `suspect_silent_nodes`, a `PreflightNoReport` fault per node of a silent rank;
* writing the verdict, this node's pairs with their busbw, the slow nodes and the missing ranks into
  each report's status (`kubectl get pfr`). That status write, to its plugin's own kind, is the only
  API write it makes (RBAC: `update`/`patch` on `preflightreports/status`).

Each report set is judged once per process (the bus's dedupe and the engine's cooldowns absorb the
other replicas' copies). A failed status write is logged and retried on the next pass. It raises
`DetectorUnavailableError` without a Kubernetes client in `context.gateway`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel

from kcover import model
from kcover.detectors import contract
from kcover_preflight import config as config_
from kcover_preflight import judging, resources, vetting
from kcover_preflight.resources import inline

log = structlog.get_logger()

METRICS_STATE = "kcover_preflight.metrics"
"""The name the process's `PreflightMetrics` are kept under (`context.state`: registered once per registry)."""
SLOW = "PreflightSlowNode"
INCOMPLETE = "PreflightIncomplete"
NO_REPORT = "PreflightNoReport"


class PreflightMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.verdicts = Counter("kcover_preflight_verdicts", "Workload preflight verdicts reached, by verdict.",
                                ["verdict"], registry=registry)
        self.slow_nodes = Counter("kcover_preflight_slow_nodes", "Nodes found slow by a workload's preflight.",
                                  registry=registry)
        self.missing_ranks = Gauge("kcover_preflight_missing_ranks",
                                   "1 for each rank of a workload whose preflight report never came within the "
                                   "collection timeout.", ["namespace", "workload", "rank"], registry=registry)
        self.refused = Counter("kcover_preflight_reports_refused", "PreflightReports that do not count, by reason "
                               "(owner_in_another_namespace, not_the_owner_pods_node, owner_not_in_a_workload, "
                               "workload_mismatch, unreadable).", ["reason"], registry=registry)


def metrics_of(context: contract.DetectorContext) -> PreflightMetrics:
    return context.state(METRICS_STATE, lambda: PreflightMetrics(context.metrics.registry))


GroupKey = tuple[str, str, str]
"""(namespace, workload name, workload uid) of the workload the reports' pods belong to."""


@dataclass(frozen=True)
class Group:
    key: GroupKey
    vetted: tuple[vetting.Vetted, ...]
    size: int

    @property
    def reports(self) -> tuple[resources.Stored, ...]:
        return tuple(v.report for v in self.vetted)

    @property
    def nodes(self) -> frozenset[str]:
        """The nodes the workload's reporting pods run on: all a verdict on it may name."""
        return frozenset(v.node for v in self.vetted)

    @property
    def digest(self) -> str:
        """Names this set of reports: a restarted job's new reports are a new set."""
        return hashlib.sha256(",".join(sorted(r.uid for r in self.reports)).encode()).hexdigest()[:12]

    def members(self) -> list[judging.Member]:
        by_rank: dict[int, vetting.Vetted] = {}
        for v in sorted(self.vetted, key=lambda v: v.report.observed_at):
            by_rank[v.report.rank] = v
        return [judging.Member(rank, v.node, v.report.report, gpu_node=v.gpu_node)
                for rank, v in sorted(by_rank.items()) if v.report.report is not None]


def groups(stored: Sequence[resources.Stored], cache: vetting.Cache, *,
           init_container: str = "preflight") -> tuple[list[Group], list[vetting.Refused]]:
    """The admitted reports grouped by the workload their pods belong to, and the refused ones. Pure."""
    found: dict[GroupKey, list[vetting.Vetted]] = {}
    refused: list[vetting.Refused] = []
    for r in stored:
        verdict = vetting.vet(r, cache)
        if isinstance(verdict, vetting.Refused):
            refused.append(verdict)
        elif verdict is not None:
            w = verdict.workload
            found.setdefault((w.namespace, w.name, w.uid), []).append(verdict)
    out = [Group(key, tuple(members), vetting.expected_size(members, cache, init_container=init_container))
           for key, members in sorted(found.items())]
    return out, refused


def workload_nodes(group: Group, cache: vetting.Cache) -> dict[str, str]:
    """Address or name -> node, for every node the group's workload has a live pod on (the cluster's word on
    what its reports may name, silent ranks' nodes included)."""
    out: dict[str, str] = {}
    for pod in cache.pods_of_workload(group.key[2]):
        node = cache.node(pod.node) if pod.node and not pod.deleting else None
        if node is not None:
            out[node.name] = node.name
            for address in node.addresses:
                out.setdefault(address, node.name)
    return out


class PreflightJudge:
    """Judges workloads' preflight reports and publishes their slow nodes as faults."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = config_.JudgeConfig

    def __init__(self, name: str, config: config_.JudgeConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.metrics = metrics_of(context)
        self._reflector: contract.Reflector[resources.Stored] | None = None
        self.judged: dict[GroupKey, tuple[str, judging.Judgement]] = {}
        """Workload -> (digest of the report set last judged, complete or timed out; its judgement)."""
        self._missing: dict[GroupKey, tuple[int, ...]] = {}
        self._refused: set[tuple[str, str]] = set()
        """(report uid, reason) refusals counted and logged already."""
        self._dirty = asyncio.Event()

    def _client(self) -> contract.KubeClient:
        kube = self.context.gateway
        if kube is None:
            raise contract.DetectorUnavailableError("preflight needs a Kubernetes client in context.gateway")
        return kube

    def _changed(self, old: resources.Stored | None, new: resources.Stored | None) -> None:
        self._dirty.set()

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        inline(self.name, bus)
        kube = self._client()
        reflector: contract.Reflector[resources.Stored] = contract.Reflector(
            kube, resources.PATH, resources.read, sink=self._changed, name=f"{self.name}:preflightreports")
        self._reflector = reflector
        async with asyncio.TaskGroup() as group:
            watch = group.create_task(reflector.run(stop), name=f"{self.name}:watch")
            sweep = group.create_task(self._sweep(kube, bus, reflector, stop), name=f"{self.name}:sweep")
            await stop.wait()
            for task in (watch, sweep):
                task.cancel()

    async def _sweep(self, kube: contract.KubeClient, bus: contract.Bus,
                     reflector: contract.Reflector[resources.Stored], stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._dirty.clear()
            if reflector.synced.is_set():
                await self.evaluate(kube, bus)
            await contract.first_of(stop, self._dirty, timeout=self.config.sweep_seconds)

    async def evaluate(self, kube: contract.KubeClient, bus: contract.Bus) -> None:
        """One pass over every workload's reports."""
        now = self.context.clock.now()
        stored = list(self._reflector.store.values()) if self._reflector is not None else []
        cache = self.context.cluster
        if cache is None:
            return  # nothing to vet the reports against: none counts
        current, refused = groups(stored, cache, init_container=self.config.init_container)
        self._refused = {k for k in self._refused if k[0] in self._reflector.store} if self._reflector else set()
        self._count_refusals(refused)
        keys = {g.key for g in current}
        for key in [k for k in self.judged if k not in keys]:
            del self.judged[key]
        for key in [k for k in self._missing if k not in keys]:
            self._clear_missing(key)
        for group in current:
            members = group.members()
            complete = not judging.missing_ranks(members, group.size)
            first = min(r.observed_at for r in group.reports)
            timed_out = (now - first).total_seconds() >= self.config.collection_timeout_seconds
            previous = self.judged.get(group.key)
            if previous is not None and previous[0] == group.digest:
                await self._write(kube, group, previous[1], now)  # retries a status write that failed
                continue
            if not (complete or timed_out):
                await self._write(kube, group, None, now)
                continue
            judgement = judging.judge(members, size=group.size, relative_fraction=self.config.relative_fraction,
                                      absolute_gbps=self.config.absolute_threshold_gbps,
                                      nodes=workload_nodes(group, cache))
            self.judged[group.key] = (group.digest, judgement)
            self.metrics.verdicts.labels(judgement.verdict.value).inc()
            log.info("preflight_judged", namespace=group.key[0], workload=group.key[1], verdict=judgement.verdict.value,
                     slow_nodes=sorted(judgement.slow_nodes), missing_ranks=list(judgement.missing_ranks),
                     pairs=len(judgement.pairs), foreign_pairs=judgement.foreign_pairs)
            # the status first: the restart the faults lead to takes the pods, and with them the group
            await self._write(kube, group, judgement, now)
            await self._publish(bus, group, judgement)

    def _count_refusals(self, refused: Sequence[vetting.Refused]) -> None:
        for refusal in refused:
            key = (refusal.report.uid, refusal.reason.value)
            if key in self._refused:
                continue
            self._refused.add(key)
            self.metrics.refused.labels(refusal.reason.value).inc()
            log.warning("preflight_report_refused", **vetting.describe(refusal))

    # ------------------------------------------------------------------------------------------ events

    def _workload_target(self, group: Group) -> model.Target:
        workload = group.vetted[0].workload
        return model.Target(kind=model.TargetKind.WORKLOAD, namespace=workload.namespace, name=workload.name,
                            uid=workload.uid, workload_kind=workload.kind)

    def _silent_nodes(self, group: Group, target: model.Target) -> list[str]:
        cache = self.context.cluster
        if cache is None or not target.uid:
            return []
        reported = {r.pod_uid for r in group.reports}
        return sorted({p.node for p in cache.pods_of_workload(target.uid)
                       if p.uid not in reported and p.node and not p.deletion_timestamp})

    async def _publish(self, bus: contract.Bus, group: Group, judgement: judging.Judgement) -> None:
        namespace, workload, _ = group.key
        target = self._workload_target(group)
        detail = {"namespace": namespace, "workload": workload, "verdict": judgement.verdict.value}
        for node, why in sorted(judgement.slow_nodes.items()):
            if node not in group.nodes:  # the verdict names members' nodes only; a workload moves no other node
                log.error("preflight_slow_node_not_a_member", namespace=namespace, workload=workload, node=node)
                continue
            self.metrics.slow_nodes.inc()
            await bus.publish(model.CollectorEvent(
                detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                severity=model.Severity.ERROR, reason=SLOW, fault=model.Fault(check="preflight"),
                recommended=self.config.slow_action, dedupe_key=f"{self.name}/{SLOW}/{group.digest}/{node}",
                message=f"preflight of {target.describe()} found Node {node} slow: {why}",
                attributes={**detail, "why": why}))
        if not judgement.missing_ranks:
            self._clear_missing(group.key)
            return
        ranks = ", ".join(str(r) for r in judgement.missing_ranks)
        for rank in judgement.missing_ranks:
            self.metrics.missing_ranks.labels(namespace, workload, str(rank)).set(1)
        self._missing[group.key] = judgement.missing_ranks
        timeout = f"{self.config.collection_timeout_seconds:g}s"
        await bus.publish(model.CollectorEvent(
            detector=self.name, target=target, severity=model.Severity.ERROR, reason=INCOMPLETE,
            recommended=model.Action.REPORT, dedupe_key=f"{self.name}/{INCOMPLETE}/{group.digest}",
            message=f"ranks {ranks} of {group.size} never reported within {timeout}",
            attributes={**detail, "missing_ranks": list(judgement.missing_ranks)}))
        if not self.config.suspect_silent_nodes:
            return
        for node in self._silent_nodes(group, target):
            await bus.publish(model.CollectorEvent(
                detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name=node, node=node),
                severity=model.Severity.ERROR, reason=NO_REPORT, fault=model.Fault(check="preflight"),
                recommended=self.config.silent_action, dedupe_key=f"{self.name}/{NO_REPORT}/{group.digest}/{node}",
                message=f"preflight of {target.describe()}: the rank on Node {node} never reported within {timeout}",
                attributes=detail))

    def _clear_missing(self, key: GroupKey) -> None:
        for rank in self._missing.pop(key, ()):
            try:
                self.metrics.missing_ranks.remove(key[0], key[1], str(rank))
            except KeyError:
                pass

    # ------------------------------------------------------------------------------------------ status

    async def _write(self, kube: contract.KubeClient, group: Group, judgement: judging.Judgement | None,
                     now: dt.datetime) -> None:
        if not self.config.write_status:
            return
        for r in group.reports:
            wanted = (resources.pending_status() if judgement is None
                      else resources.status_for(judgement, r.node, judged_at=now))
            if judgement is None and r.status:
                continue
            if resources.same_status(r.status, wanted):
                continue
            try:
                await kube.request("PATCH", f"{resources.collection(r.namespace)}/{r.name}/status",
                                   body={"status": wanted}, content_type=contract.MERGE_PATCH)
            except contract.NotFoundError:
                continue  # deleted meanwhile (its pod went)
            except contract.KubeError as exc:
                log.warning("preflight_status_not_written", namespace=r.namespace, name=r.name, error=str(exc))
