"""The process's Prometheus registry and the metrics more than one layer updates, split by role.

Owns one `CollectorRegistry` per process (never prometheus_client's global one), so tests and the
simulated cluster can run several kcover processes in one interpreter, and what the registry exports:

* Each role exports only its own series. `Metrics(role=...)` registers the metrics both roles update
  (configuration reloads, detectors), `kcover_build_info` and the process metrics (`process_*`,
  `python_*`), then only the controller's (leadership, breaker, actions, refused Events, device taints)
  or only the agent's (XIDs seen, NVML and DCGM polls, the age of the last good health check, whether it
  is blind). The
  other role's metric objects still exist, unregistered, so shared code may update them; they never
  reach /metrics. `role=None` (tests, the bench) registers both.
* Labelled counters are pre-initialised at 0 for the label values known up front (`ACTIONS` x
  `ACTION_RESULTS`, the poll results), so a rule such as `increase(kcover_actions_total{...}[15m]) > 0`
  fires on the first increment: a series born at 1 has no increase. Values known only at run time are
  pre-initialised by whoever learns them (the supervisor per detector, the NVML detector per XID class,
  the event watcher per refusal reason). XIDs by code are not: the shipped policy names some 170 codes,
  which on every agent of a large fleet would be hundreds of thousands of series at 0; the per-class
  counter is the one to alert on.
* `exposition()` is the registry as /metrics renders it: without the `<counter>_created` samples,
  which double the series count and which nothing kcover ships queries.

Components register their own further metrics on `Metrics.registry`. Nothing here raises into a scrape.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.registry import Collector

import kcover

CONTROLLER = "controller"
AGENT = "agent"
ROLES = (CONTROLLER, AGENT)

ACTIONS = ("restart_workload", "cordon_node", "uncordon_node", "taint_device", "untaint_device", "report",
           "request_validation", "judge_node", "drain", "remediation")
"""`kcover_actions_total{action}` values pre-initialised (`recovery.steps.name_of`; tests keep them among its
values)."""
ACTION_RESULTS = ("done", "record_only", "failed")
"""`kcover_actions_total{result}` values every action can end in, pre-initialised (`recovery.steps.result_of`);
refusals and holds add their own (the code) when they first happen."""
POLL_RESULTS = ("ok", "failed")
DCGM_MODES = ("diag", "health", "exporter")
DROP_REASONS = ("rate_limited", "queue_full", "closed")
"""`kcover_detector_dropped_total{reason}` values (`detectors.isolating`)."""

_CREATED = ("_created", "_gcreated")
_TIMESTAMPED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

API_CAPABILITIES = ("resource_slices", "device_taint_rules", "allocated_resources_status")
"""The `capability` label values of `kcover_api_capability`: `kube.capabilities.Capability`'s values; the
controller asks the API server about all of them."""
AGENT_API_CAPABILITIES = ("resource_slices",)
"""Those the agent asks about: it reads its node's ResourceSlices, no pod status, and writes no DeviceTaintRules."""


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, role: str | None = None,
                 process: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        """`role`: "controller", "agent", or None for both. `process`: export the process and Python
        metrics (`process_*`, `python_*`), as a scrape of the real process wants."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} or None, not {role!r}")
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.role = role
        r = self.registry
        ctl = r if role in (None, CONTROLLER) else None
        agt = r if role in (None, AGENT) else None

        # ------------------------------------------------------------------ both roles
        self.build = Info("kcover_build", "The running kcover: version, Python and role.", registry=r)
        self.build.info({"version": kcover.__version__, "python": platform.python_version(),
                         "role": role or "any"})
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.config_reloads = Counter("kcover_config_reloads", "Configuration files applied after a change.",
                                      registry=r)
        self.config_reload_failures = Counter("kcover_config_reload_failures",
                                              "Changed configuration files refused (old configuration kept).",
                                              registry=r)
        self.detector_up = Gauge("kcover_detector_up", "1 while the detector runs, 0 after it failed.",
                                 ["detector"], registry=r)
        self.detector_available = Gauge("kcover_detector_available",
                                        "0 when the detector reports it cannot run here (no GPU, no DCGM).",
                                        ["detector"], registry=r)
        self.detector_dropped = Counter("kcover_detector_dropped",
                                        "Events an isolated detector published that did not reach the bus, by reason "
                                        "(rate_limited, queue_full, closed).", ["detector", "reason"], registry=r)
        self.detector_restarts = Counter("kcover_detector_restarts", "Detector restarts after a failure.",
                                         ["detector"], registry=r)

        self.api_capability = Gauge("kcover_api_capability", "1 when the API server serves an optional API kcover "
                                    "uses (resource_slices: DRA ResourceSlices; device_taint_rules: DeviceTaintRules; "
                                    "allocated_resources_status: the pod status field of device health), 0 when it "
                                    "does not, -1 before kcover asked or when the server did not answer.",
                                    ["capability"], registry=r)
        for capability in AGENT_API_CAPABILITIES if role == AGENT else API_CAPABILITIES:
            self.api_capability.labels(capability=capability).set(-1)

        # ------------------------------------------------------------------ the controller
        self.events_rejected = Counter("kcover_events_rejected", "Annotated Events refused, by reason.",
                                       ["reason"], registry=ctl)
        self.actions = Counter("kcover_actions", "Recovery actions by kind and result.", ["action", "result"],
                               registry=ctl)
        for action in ACTIONS:
            for result in ACTION_RESULTS:
                self.actions.labels(action=action, result=result)
        self.fault_to_action = Histogram("kcover_fault_to_action_seconds",
                                         "Seconds from a fault's observation to the action that answered it.",
                                         buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                         registry=ctl)
        self.breaker_open = Gauge("kcover_breaker_open", "1 while the recovery circuit breaker is open.",
                                  registry=ctl)
        self.is_leader = Gauge("kcover_leader", "1 while this replica holds the Lease.", registry=ctl)
        self.device_taints_served = Gauge("kcover_device_taints_served", "1 when the API server serves "
                                          "DeviceTaintRules (device-level isolation under DRA), 0 when kcover "
                                          "falls back to the node, -1 before the first check.", registry=ctl)
        self.device_taints_served.set(-1)
        self.device_taint_fallbacks = Counter("kcover_device_taint_fallbacks", "Device faults answered at node "
                                              "level because the API server serves no DeviceTaintRules.",
                                              registry=ctl)

        # ------------------------------------------------------------------ the agent
        self.xids = Counter("kcover_xids", "XID errors the NVML detector saw on this node's GPUs, by XID code and "
                            "the XID policy's class (ignored ones included); a code's series starts at its first "
                            "occurrence (kcover_xid_classes_total starts at 0).", ["code", "class"], registry=agt)
        self.xid_classes = Counter("kcover_xid_classes", "XID errors the NVML detector saw on this node's GPUs, by the "
                                   "XID policy's class, every class from 0.", ["class"], registry=agt)
        self.nvml_polls = Counter("kcover_nvml_polls", "NVML health polls of all of this node's GPUs, by result "
                                  "(ok: every GPU answered; failed: an NVML call failed and the detector restarts).",
                                  ["result"], registry=agt)
        self.dcgm_polls = Counter("kcover_dcgm_polls", "DCGM checks by mode (diag, health, exporter) and result (ok: "
                                  "an answer was read; failed: timed out, no output, unreadable).",
                                  ["mode", "result"], registry=agt)
        for result in POLL_RESULTS:
            self.nvml_polls.labels(result=result)
            for mode in DCGM_MODES:
                self.dcgm_polls.labels(mode=mode, result=result)
        self.agent_blind = Gauge("kcover_agent_blind", "1 while the agent runs on a GPU node (kube.gpu_resources "
                                 "capacity) where none of its GPU detectors (agent.gpu_detectors) runs: it cannot "
                                 "see GPU faults, and its Node condition says Unknown.", ["node"], registry=agt)
        self.health_checks = HealthChecks(clock)
        """The age of each detector's last successful health check (`kcover_health_check_age_seconds`)."""
        if agt is not None:
            agt.register(self.health_checks)

    def exposition(self) -> Collector:
        """What /metrics renders: the registry without `_created` samples."""
        return _WithoutCreated(self.registry)

    def detector_started(self, name: str, *, isolated: bool) -> None:
        """Pre-initialise a detector's counters, so its first restart or drop is an increase."""
        self.detector_restarts.labels(detector=name)
        if isolated:
            for reason in DROP_REASONS:
                self.detector_dropped.labels(detector=name, reason=reason)


class HealthChecks(Collector):
    """`kcover_health_check_age_seconds{detector}`: seconds since a detector's last successful health check
    (an NVML poll of every GPU, a DCGM answer read), counted from the detector's start until its first one.
    A detector that never started (unavailable on this node) has no series."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # a scrape runs on the loop, an isolated detector may report from its thread

    def started(self, detector: str) -> None:
        with self._lock:
            self._last.setdefault(detector, self._clock())

    def succeeded(self, detector: str) -> None:
        with self._lock:
            self._last[detector] = self._clock()

    def age(self, detector: str) -> float | None:
        with self._lock:
            last = self._last.get(detector)
        return None if last is None else max(0.0, self._clock() - last)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("kcover_health_check_age_seconds", "Seconds since the detector's last "
                                   "successful health check (since it started, before the first).",
                                   labels=["detector"])
        now = self._clock()
        with self._lock:
            items = sorted(self._last.items())
        for detector, last in items:
            family.add_metric([detector], max(0.0, now - last))
        yield family


class _WithoutCreated(Collector):
    """A registry's families without the `_created` (and `_gcreated`) timestamp samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if family.type not in _TIMESTAMPED:
                yield family
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if not s.name.endswith(_CREATED)]
            yield kept
