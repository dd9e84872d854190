"""The process's Prometheus registry and the metrics more than one layer updates.

Owns one `CollectorRegistry` per process (never prometheus_client's global one), so tests and the
simulated cluster can run several kcover processes in one interpreter. Components register their own
metrics on `Metrics.registry`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.events_rejected = Counter("kcover_events_rejected", "Annotated Events refused, by reason.",
                                       ["reason"], registry=r)
        self.actions = Counter("kcover_actions", "Recovery actions by kind and result.", ["action", "result"],
                               registry=r)
        self.fault_to_action = Histogram("kcover_fault_to_action_seconds",
                                         "Seconds from a fault's observation to the action that answered it.",
                                         buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                         registry=r)
        self.breaker_open = Gauge("kcover_breaker_open", "1 while the recovery circuit breaker is open.",
                                  registry=r)
        self.is_leader = Gauge("kcover_leader", "1 while this replica holds the Lease.", registry=r)
        self.device_taints_served = Gauge("kcover_device_taints_served", "1 when the API server serves "
                                          "DeviceTaintRules (device-level isolation under DRA), 0 when kcover "
                                          "falls back to the node, -1 before the first check.", registry=r)
        self.device_taints_served.set(-1)
        self.device_taint_fallbacks = Counter("kcover_device_taint_fallbacks", "Device faults answered at node "
                                              "level because the API server serves no DeviceTaintRules.", registry=r)
