"""What the controller exports about the fleet and the faults it sees, for alerts and the dashboard.

Owns two sets of metrics on the controller's registry:

* `FleetCollector`, read from the cluster cache at scrape time (no state of its own): GPU nodes known
  (`kcover_gpu_nodes`), those kcover holds cordoned (`kcover_gpu_nodes_cordoned`), and GPU nodes whose
  agent condition (`agent.condition_type`) is missing (`kcover_agent_condition_missing_nodes`: the agent
  writes it when it starts, so a GPU node without it has no working agent), False
  (`kcover_agent_condition_unhealthy_nodes`) or Unknown (`kcover_agent_condition_unknown_nodes`: an agent
  that cannot see the node's GPUs); and the objects the cache's client could not decode and
  left out of its lists and watches (`kcover_objects_skipped_total{kind,reason}`, `decoding.Skips`).
* `FaultMetrics`: `kcover_faults_total{class,detector}`, every fault the leader's engine is handed, by
  `fault_class()` (a closed set read from the typed fault, never from free-form text, so the label
  stays bounded) and detector. Cleared events are not faults and are not counted.

It decides nothing and never raises into a scrape (a cache not yet synced reports what it holds).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from kcover import codec, model
from kcover.kube import caching

CLASSES = ("xid", "dra-device", "gpu", "check", "container", "node", "pod", "workload", "device")


def fault_class(event: model.CollectorEvent) -> str:
    """The fault's class from its typed identity first, then from what it is about."""
    fault = event.fault
    if fault.xid is not None:
        return "xid"
    if fault.dra is not None:
        return "dra-device"
    if fault.check:
        return "check"
    if fault.container:
        return "container"
    if fault.gpu_index is not None or fault.gpu_uuid:
        return "gpu"
    return event.target.kind.value.lower()


class FaultMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.faults = Counter("kcover_faults", "Faults handed to the leader's recovery engine, by class (xid, "
                              "dra-device, gpu, check, container, node, pod, workload, device) and detector.",
                              ["class", "detector"], registry=registry)

    def count(self, event: model.CollectorEvent) -> None:
        if not event.cleared:
            self.faults.labels(**{"class": fault_class(event), "detector": event.detector}).inc()


class FleetCollector:
    """GPU nodes, kcover's cordons and the agents' conditions, from the cache when scraped."""

    def __init__(self, cache: caching.ClusterCache, *, condition_type: str) -> None:
        self._cache = cache
        self._condition = condition_type

    def collect(self) -> Iterator[Metric]:
        gpu = missing = unhealthy = unknown = cordoned = 0
        for node in list(self._cache.nodes.values()):
            if not self._cache.is_gpu_node(node):
                continue
            gpu += 1
            cordoned += node.cordoned_by_kcover
            found = next((c for c in node.conditions if c.type == self._condition), None)
            missing += found is None
            unhealthy += found is not None and found.status == codec.CONDITION_FAULTY
            unknown += found is not None and found.status == codec.CONDITION_BLIND
        yield GaugeMetricFamily("kcover_gpu_nodes", "GPU nodes in the controller's cache (capacity or DRA "
                                "ResourceSlices).", value=gpu)
        yield GaugeMetricFamily("kcover_gpu_nodes_cordoned", "GPU nodes carrying kcover's cordon annotation.",
                                value=cordoned)
        yield GaugeMetricFamily("kcover_agent_condition_missing_nodes", "GPU nodes without the agent's Node "
                                "condition (agent.condition_type): no agent has reported there.", value=missing)
        yield GaugeMetricFamily("kcover_agent_condition_unhealthy_nodes", "GPU nodes whose agent condition is "
                                "False (a GPU fault the agent reports).", value=unhealthy)
        yield GaugeMetricFamily("kcover_agent_condition_unknown_nodes", "GPU nodes whose agent condition is "
                                "Unknown: an agent that runs no GPU detector there (kcover_agent_blind on the "
                                "agent) cannot see their GPU faults.", value=unknown)
        yield from self._cache.skips.metrics()
