"""kcover's settings: one pydantic-settings root made of grouped sub-models.

Owns the schema: the root `Settings`, every group, their defaults, units and documentation, and which
fields cannot change while running (`restart_required` in their schema extras). It does not own the base
the groups share (removed settings, relations between fields: `kcover.settinggroups`) nor the layering
CLI flags > environment (`KCOVER_`, `__` nesting) > YAML file > defaults with each value's provenance
(`kcover.layering`), and it reads no file and no environment itself (`kcover.cli` does).

Fails with a `pydantic.ValidationError` carrying one line per bad field, including settings that were
removed (named as removed, with what replaced them) and relations between fields
(`lease.renew_deadline_seconds` below `lease.lease_duration_seconds`); `kcover.layering` turns those into
`errors.ConfigError`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, SettingsConfigDict

from kcover import codec, kinds, settinggroups

DEFAULT_CONFIG_PATH = "/etc/kcover/config.yaml"
"""Where the chart mounts the ConfigMap."""

ENV_PREFIX = "KCOVER_"
ENV_NESTING = "__"

_RESTART: JsonDict = {"restart_required": True}


class LogFormat(enum.StrEnum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


class ServerSettings(settinggroups.Group):
    host: str = Field("0.0.0.0", description="Address the health and metrics server binds. All interfaces so the kubelet and Prometheus reach it.",
                      json_schema_extra=_RESTART)
    port: int = Field(8080, ge=0, le=65535, description="Port of /healthz, /readyz and /metrics; 0 picks a free one.",
                      json_schema_extra=_RESTART)
    config_poll_seconds: float = Field(2.0, gt=0, description="Seconds between checks of the config file for changes; a ConfigMap update reaches the pod within the kubelet sync period (about a minute), so 2 s adds little.")
    loop_stall_seconds: float = Field(5.0, gt=0, description="Seconds: /healthz fails when the event loop has not ticked for this long (a blocked loop cannot serve detectors).")
    shutdown_grace_seconds: float = Field(20.0, gt=0, description="Seconds after SIGTERM before what has not stopped is cancelled; the process exits at the latest 5 s later whatever is left (a plugin thread stuck in a blocking call). Below the chart's terminationGracePeriodSeconds (30), so the Lease is released before the kubelet kills the pod.")


class LoggingSettings(settinggroups.Group):
    level: str = Field("info", pattern="^(?i)(debug|info|warning|error)$", description="Minimum level logged.")
    format: LogFormat = Field(LogFormat.AUTO, description="json in the cluster, console on a terminal; auto picks by whether stderr is a TTY.")


class BusSettings(settinggroups.Group):
    subscriber_capacity: int = Field(10_000, ge=1, description="Events: queue bound per subscriber. 10,000 holds a burst of one event per pod of a 10,000-pod wave.")
    dedupe_window_seconds: float = Field(5.0, ge=0, description="Seconds: equal dedupe keys within this window are delivered once; 0 disables. Covers the duplicate reports a re-list or two sources give for one fault.")
    block_timeout_seconds: float = Field(1.0, gt=0, description="Seconds a publisher waits on a full `block` subscriber before the event is dropped, so a slow consumer never stalls detectors.")
    drain_timeout_seconds: float = Field(5.0, ge=0, description="Seconds given to subscribers on shutdown to take what is queued.")


class DetectorEntry(settinggroups.Group):
    enabled: bool = Field(True, description="Run this detector (on the role it belongs to).")
    config: dict[str, Any] = Field(default_factory=dict, description="The detector's own settings, validated against its config model.")
    isolated: bool | None = Field(None, description="Run it in its own thread and event loop behind a rate-limited bridge to the bus (`detectors.plugin_*`), so blocking or flooding cannot stall the process. Unset: third-party plugins are isolated, kcover's built-in detectors keep the fast path.")
    required: bool | None = Field(None, description="Whether its failure makes the process not ready (/readyz 503). Unset: built-in detectors are required, plugins optional (a failed plugin shows in `kcover_detector_up`, the log and /readyz's text, and the pod stays ready).")


BUILTIN_DETECTORS = ("pod-status", "dra-health", "event-watcher", "node-condition", "nvml", "dcgm", "rdma-link")
"""Detectors kcover ships; each runs in its own role (controller or agent) when enabled."""


def _default_detectors() -> dict[str, DetectorEntry]:
    return {name: DetectorEntry() for name in BUILTIN_DETECTORS}


class DetectorsSettings(settinggroups.Group):
    entries: dict[str, DetectorEntry] = Field(default_factory=_default_detectors,
                                              description="Detector name (entry point in `kcover.detectors`) to its settings.")
    restart_initial_seconds: float = Field(1.0, gt=0, description="Seconds before the first restart of a detector that raised.")

    @field_validator("entries", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        """Entries given in a file are merged over the built-in ones: naming one detector does not drop the others."""
        if not isinstance(value, Mapping):
            return value
        merged: dict[str, Any] = {name: {} for name in BUILTIN_DETECTORS}
        merged.update(value)
        return merged
    restart_max_seconds: float = Field(60.0, gt=0, description="Seconds: ceiling of the exponential restart backoff, so a broken detector costs at most one attempt a minute.")
    settle_seconds: float = Field(5.0, gt=0, description="Seconds a detector's attempt must run before it counts as watching: the agent's GPU sight (`agent.gpu_detectors`) waits for it before it says the node's GPUs are healthy, and a detector that was unavailable returns to `kcover_detector_available 1` only then. A missing driver or tool fails within moments of the start, and NVML's own initialisation takes a second or two on an 8-GPU node without persistence mode: five seconds tells the two apart, and delays only the agent's first `True`.")
    plugin_rate_per_second: float = Field(100.0, gt=0, description="Events per second an isolated detector may publish (token bucket); more are dropped and counted in `kcover_detector_dropped_total`. Far above any real fault rate, low enough that a flooding plugin costs the main loop little.")
    plugin_burst: int = Field(1000, ge=1, description="Events an isolated detector may publish at once above its rate (the bucket's size): a node-wide burst of one event per pod.")
    plugin_queue_capacity: int = Field(1000, ge=1, description="Events an isolated detector may have waiting for the main loop; past it new ones are dropped and counted.")
    stop_grace_seconds: float = Field(5.0, gt=0, description="Seconds an isolated detector is given to return after it was asked to stop; then it is abandoned (its thread left behind, unable to publish) so shutdown stays bounded.")


class KubeSettings(settinggroups.Group):
    kubeconfig: str = Field("", description="Path of a kubeconfig; empty means in-cluster, then $KUBECONFIG, then ~/.kube/config.",
                            json_schema_extra=_RESTART)
    page_size: int = Field(500, ge=1, le=10_000, description="Objects per list page: the API server's own default chunk size for informers.")
    watch_timeout_seconds: int = Field(300, ge=1, description="Seconds: server-side timeout asked of each watch; client-go picks 5-10 minutes.")
    inactivity_timeout_seconds: float = Field(120.0, gt=0, description="Seconds without any line (events or bookmarks) after which a watch is presumed dead and restarted.")
    backoff_initial_seconds: float = Field(0.5, gt=0, description="Seconds: first retry delay after a failed list or watch.")
    backoff_max_seconds: float = Field(30.0, gt=0, description="Seconds: ceiling of the retry delay, as client-go's reflector.")
    request_timeout_seconds: float = Field(30.0, gt=0, description="Seconds for one non-watch request.")
    retry_deadline_seconds: float = Field(10.0, ge=0, description="Seconds a request keeps being retried after a 429, a 5xx or a connection error, waits included; 0 turns retries off. 10 s rides out an API server restart or a burst of priority-and-fairness throttling without holding a recovery past a typical cooldown. A leader's writes are further bounded by its term (see docs/architecture.md#retries-and-fencing).")
    retry_initial_seconds: float = Field(0.1, gt=0, description="Seconds: first retry delay (equal jitter: drawn from the upper half of a doubling ceiling) when the server gave no Retry-After.")
    retry_max_delay_seconds: float = Field(2.0, gt=0, description="Seconds: ceiling of one retry delay, and of a server's Retry-After honoured: the API server asks for 1 s under priority and fairness.")
    workload_kinds: list[str] = Field(
        default_factory=lambda: list(kinds.DEFAULT_KEYS),
        description="Workload kinds the controller cache watches, as `plural.group`: by default every kind kcover restarts (docs/architecture.md#contract-with-the-cluster). A kind whose CRD is missing is logged once and retried slowly.",
        json_schema_extra=_RESTART)
    watch_events: bool = Field(True, description="Watch core/v1 Events (for the event-watcher detector); only those annotated `kcover.io/need-recovery`, `kcover.io/device-healthy` or `kcover.io/evidence` are kept.",
                               json_schema_extra=_RESTART)
    gc_freeze_after_sync: bool = Field(True, description="gc.freeze() once the controller cache first synced, so Python's cyclic GC never rescans the ~1.5 million cached objects of 150,000 pods (full collections otherwise stall watch delivery for about a second).",
                                       json_schema_extra=_RESTART)
    gc_pause_during_lists: bool = Field(True, description="Hold off Python's cyclic GC while the controller cache lists a collection (its first sync, a re-list after a 410): the collections a list's pages trigger rescan the cache it is filling, half of the controller's CPU over a 60,000-pod sync on kube-apiserver (12.2 to 13.8 s; 8.3 to 9.6 s held off). The collector runs again once the last list ends.",
                                        json_schema_extra=_RESTART)
    missing_kind_retry_seconds: float = Field(300.0, gt=0, description="Seconds between lists of a workload kind whose CRD is not installed: slow, since installing an operator is rare.")
    stall_seconds: float = Field(60.0, gt=0, description="Seconds a watched collection may keep failing (no list finished, no watch opened) before the controller's /readyz says its cache stopped syncing. 60 s is two retries at the 30 s backoff ceiling: an API server restart does not flip readiness, a watch that cannot recover does.")
    gpu_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu", "metax-tech.com/gpu"],
        description="Extended resources (names or `fnmatch` globs) whose non-zero node capacity makes a GPU node, for the cordon breaker's count: NVIDIA whole GPUs and MIG slices (mixed strategy), AMD, MetaX.",
        json_schema_extra=_RESTART)
    gpu_dra_drivers: list[str] = Field(
        default_factory=lambda: ["gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com"],
        description="DRA drivers whose ResourceSlices (`spec.driver`, `spec.nodeName`) make their node a GPU node, for clusters whose GPUs come through DRA: NVIDIA, AMD and Intel GPU drivers. Empty: ResourceSlices are not watched.",
        json_schema_extra=_RESTART)


class SaveLogsScope(enum.StrEnum):
    """Whose logs a restart saves before it takes its pods away."""

    FAULTED = "faulted"
    """The pods the fault is about: the faulting pod, the pods on a faulting node, and every pod with a
    container that ended with an error (now or in its previous instance)."""
    ALL = "all"
    """Every pod the restart takes away."""


class SaveLogsSettings(settinggroups.Group):
    enabled: bool = Field(True, description="Save the pods' logs before a restart deletes them.")
    scope: SaveLogsScope = Field(SaveLogsScope.FAULTED, description="Whose logs: `faulted` (the faulting pod, the pods on a faulting node, and every pod with a container that ended with an error) or `all` (every pod the restart takes away). The save runs before the removal, so `all` makes a 1,000-pod job's restart wait for about 2,000 log reads, cut at `timeout_seconds`; `faulted` reads a handful. The other pods' logs go with them unless the cluster's log pipeline keeps them.")
    directory: str = Field("/var/lib/kcover/logs", description="Sink directory (the chart mounts a PVC here); one folder per recovery.")
    timeout_seconds: float = Field(10.0, gt=0, description="Seconds the whole save may take; recovery never waits longer.")
    max_bytes_per_container: int = Field(1_048_576, ge=1, description="Bytes kept per container log (the tail): 1 MiB holds the last few thousand lines of a trainer.")
    max_lines_per_container: int = Field(5_000, ge=1, description="Lines kept per container log.")
    retention_count: int = Field(200, ge=1, description="Recovery folders kept at most.")
    retention_age_seconds: float = Field(7 * 86400, gt=0, description="Seconds a recovery folder is kept: one week.")
    retention_bytes: int = Field(5 * 1024**3, ge=1, description="Bytes the sink may hold in all (5 GiB, a small PVC).")
    proceed_on_failure: bool = Field(True, description="Restart even if saving logs failed: a running job matters more than its old logs.")
    concurrency: int = Field(8, ge=1, description="Log requests in flight at once: 8 saves a 1,000-container job within the timeout without a burst on the API server; memory stays within about 3 x concurrency x max_bytes_per_container (each read keeps up to twice its bound before it trims, then copies what it keeps; a read with timestamps adds up to 36 bytes a line to its bound).")


class DrainMode(enum.StrEnum):
    """Which pods a node-ladder drain evicts after kcover cordoned the node."""

    NONE = "none"
    """No drain: the cordon only keeps new pods away."""
    OPTED_IN = "opted-in"
    """Evict only the pods of workloads opted in to kcover's recovery."""
    ALL = "all"
    """Evict every pod except DaemonSet pods and mirror (static) pods, as `kubectl drain` does."""


class VerifySettings(settinggroups.Group):
    enabled: bool = Field(True, description="Follow every restarted workload until all its pods run again with new uids (or it finished), export the time from the fault to running again as `kcover_recovery_mttr_seconds`, and report it Stalled past the deadline.")
    deadline_seconds: float = Field(600.0, gt=0, description="Seconds after a restart by which the workload must run again; past it the recovery is Stalled (a `KcoverRecoveryStalled` Event with the cause read from the cluster). Ten minutes covers image pulls and gang scheduling of a large job.")
    max_followed: int = Field(1000, ge=1, description="Recoveries followed at once; past it the oldest is dropped (logged). A bound on memory, far above what the restart breaker lets through.")


class EscalationSettings(settinggroups.Group):
    drain_mode: DrainMode = Field(DrainMode.NONE, description="After kcover cordoned a node: `none`, `opted-in` (evict the pods of opted-in workloads) or `all` (every pod but DaemonSet and mirror pods), through the Eviction API, which honours PodDisruptionBudgets.")
    drain_timeout_seconds: float = Field(300.0, gt=0, description="Seconds a drain keeps retrying evictions a PodDisruptionBudget refuses (HTTP 429) before it gives up and says so.")
    remediation_enabled: bool = Field(False, description="After the cordon (and drain), ask an external remediator to repair the node: the label `kcover.io/remediation-requested=true` and the Node condition `KcoverRemediationRequested=True`, which medik8s NodeHealthCheck or a reboot/reimage controller can select on.")

    removed: ClassVar[Mapping[str, str]] = {
        "repeat_count": "a workload's repeated faults on one node no longer cordon it: which node a fault moves is "
                        "recovery.judgement's (different workloads failing on one node make it suspect, and only a "
                        "failed validation cordons it). Delete the line; see recovery.judgement.same_workload_restarts.",
        "repeat_window_seconds": "replaced by recovery.judgement.window_seconds. Delete the line.",
    }


class RecordsSettings(settinggroups.Group):
    enabled: bool = Field(True, description="Write a `Recovery` resource (kcover.io/v1alpha1) for every action and every audited refusal, in the workload's namespace (a node's in `ledger_namespace`), so `kubectl get recoveries -A` shows what kcover did after its Events expired. Written after the action, by a task of its own: never on the recovery's critical path.")
    retention_age_seconds: float = Field(7 * 86400, gt=0, description="Seconds a Recovery is kept: one week, long enough to read what happened over a weekend.")
    retention_per_target: int = Field(20, ge=1, description="Recoveries kept per target (workload or node), newest first: a restart storm leaves its last 20 rows, not thousands.")
    queue_size: int = Field(1000, ge=1, description="Recovery changes waiting to be written at most; past it a new one is dropped and counted in `kcover_recovery_records_failed_total{reason=\"queue_full\"}`. Far above what the restart breaker lets through between two writes.")
    prune_interval_seconds: float = Field(600.0, gt=0, description="Seconds between the leader's retention passes (one paginated LIST of kcover's recoveries, then a DELETE per expired one).")


class ReturnValidationSettings(settinggroups.Group):
    enabled: bool = Field(False, description="Before kcover un-cordons a node whose fault cleared, ask the node's agent to run `dcgmi diag -r diag_level` (the annotations `kcover.io/validate-request` and `kcover.io/validate-level` on the Node) and un-cordon only when its answer, the Node condition `KcoverGPUValidated`, says it passed. A failure climbs the node ladder again; no answer within `timeout_seconds` leaves the node cordoned. Needs `agent.validation.enabled` on the agents.")
    diag_level: int = Field(1, ge=1, le=4, description="The `dcgmi diag -r` level: 1 takes seconds and is safe beside anything still running on the node; 2 (minutes) to 4 (about an hour on eight GPUs) stress the GPUs and belong after a drain.")
    timeout_seconds: float = Field(1800.0, gt=0, description="Seconds the controller waits for the agent's answer before it gives up, leaves the node cordoned and says so (`ValidationTimedOut`). Half an hour covers a level 3 run on eight GPUs.")


class DeviceTaintEffect(enum.StrEnum):
    """`DeviceTaint.effect` values the API server accepts on a DeviceTaintRule."""

    NO_SCHEDULE = "NoSchedule"
    """The scheduler allocates the device to no new claim; pods already using it keep running."""
    NO_EXECUTE = "NoExecute"
    """As NoSchedule, and the device taint eviction controller also evicts pods using the device."""
    NONE = "None"
    """Informational only: nothing is kept off the device."""


class DeviceTaintSettings(settinggroups.Group):
    enabled: bool = Field(True, description="Isolate a faulty DRA device instead of its node: a DeviceTaintRule on that device only (driver, pool, device), the workloads holding it restarted, the node left schedulable. Off, or where the API server does not serve DeviceTaintRules, kcover acts on the node as for any other fault.")
    effect: DeviceTaintEffect = Field(DeviceTaintEffect.NO_SCHEDULE, description="Effect of kcover's device taints. `NoSchedule` keeps new claims off the device and leaves eviction to kcover's own restart of the holders (which honours cooldowns and budgets); `NoExecute` also lets Kubernetes evict every pod using the device, opted in or not.")
    key: str = Field("kcover.io/unhealthy", description="Key of kcover's device taints (a label name), the one pods tolerate to use a device kcover isolated.")
    discovery_interval_seconds: float = Field(300.0, gt=0, description="Seconds between checks of whether the API server serves DeviceTaintRules (discovery of `resource.k8s.io`); an upgrade or a changed runtime-config is noticed within this.")
    max_per_node: int = Field(8, ge=1, description="Devices of one node kcover holds tainted at most, those in flight counted; a taint past it is refused (`DeviceTaintLimit`, a cap, not a trip of the breaker) and the holders are still restarted. Eight is a whole HGX/DGX board: more faulty devices than that on one node at once is the node's fault or a flood of reports, not separate GPUs failing.")
    max_per_window: int = Field(32, ge=1, description="Device taints kcover makes across the cluster within `window_seconds`, those in flight counted; past it the breaker trips (`BreakerOpen`, latched with `recovery.breaker_latch`). Four boards' worth of GPUs an hour is far above independent device failures and stops a storm of correlated (or forged) reports.")
    window_seconds: float = Field(3600.0, gt=0, description="Seconds: the window of `max_per_window` (one hour, as the restart budget's).")
    max_hold_seconds: float = Field(86400.0, gt=0, description="Seconds kcover keeps one of its device taints without word that the device is healthy again; then it removes the taint and says so (a `KcoverUntaintedDevice` Event). A day leaves time to reset or replace the GPU, and no taint outlives a healthy word that was lost (an agent gone, a node rebuilt).")


class JudgementMode(enum.StrEnum):
    """How one attribution rule of `recovery.judgement` takes part."""

    ACT = "act"
    """The rule decides and kcover acts on its decision."""
    RECORD = "record"
    """The rule decides and says so (an Event with a reason of its own, `KcoverRecordOnly...`, and the
    Recovery), and kcover acts as it would without the rule: a way to watch a rule before trusting it."""
    OFF = "off"
    """The rule is not applied."""


class RecordOnly(enum.StrEnum):
    """Classes of action that `recovery.record_only` can hold back: decided, recorded, not carried out."""

    RESTART = "restart"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    DEVICE_TAINT = "device-taint"
    VALIDATION = "validation"
    DRAIN = "drain"
    REMEDIATION = "remediation"


class JudgementSettings(settinggroups.Group):
    workload_blame: JudgementMode = Field(JudgementMode.ACT, description="Application signals (container exits, application-class XIDs) blame the workload: they restart it and never move a node by themselves, whatever a rule or the fault's source recommends. `off` lets the rules and recommendations move nodes for them as well (an earlier version's behaviour).")
    suspect_node: JudgementMode = Field(JudgementMode.ACT, description="Differential evidence against a node: `node_workloads` different workloads restarted for faults on it within `window_seconds`, or one workload restarted `same_workload_restarts` times for faults only there, from different pods, while it runs on other nodes too. The node becomes suspect and kcover asks its agent to validate it; only a failed validation cordons it.")
    suspect_device: JudgementMode = Field(JudgementMode.ACT, description="Differential evidence against one GPU: `device_workloads` different workloads restarted for faults on it within `window_seconds`, or one workload restarted `device_restarts` times for faults all on it (`hardware_xid_restarts` times for a hardware XID that only restarts); its node becomes suspect and is validated.")
    window_seconds: float = Field(21600.0, gt=0, description="Seconds over which restarts count as evidence against a node or a GPU. Six hours: NVIDIA's own correlation rules look hours back (a repeated XID 48 within a day), while a node's tenants change often enough that three different jobs failing on it in six hours is rare by chance.")
    node_workloads: int = Field(3, ge=2, description="Different workloads restarted for faults on one node within the window that make it suspect. Three: two can be coincidence on a busy node; three different jobs failing on the same node is the lemon-node signature (Meta's reliability study of its research clusters finds bad nodes by the different jobs that keep failing on them).")
    device_workloads: int = Field(2, ge=2, description="Different workloads restarted for faults on one GPU within the window that make its node suspect: a GPU is held by one job at a time, so a second job failing on the same GPU already points at the GPU.")
    device_restarts: int = Field(2, ge=1, description="Restarts of one workload within the window for faults on one node that all named one of its GPUs (restarts for faults on other nodes do not count either way; an XID on the same device each time: application-class ones such as 13 and 31, whose repeats on one GPU NVIDIA's catalog reads as hardware; a hardware one that only restarts, such as 94, counts against `hardware_xid_restarts` instead) that make that GPU's node suspect. Two: a faulty GPU keeps failing whatever runs on it, but a job's own bug raising an XID fails the same GPU again too when its rank comes back there, so place alone cannot tell them apart; the validation does (level 1 takes seconds, a node that passes stays schedulable and its evidence starts again).")
    hardware_xid_restarts: int = Field(1, ge=1, description="Restarts of one workload within the window for a hardware-class XID that kcover's XID catalog only restarts for (94, a contained ECC error), all on one of its GPUs, that make its node suspect: validated by its agent, cordoned only if the validation fails. One: no job's own bug raises a hardware XID, so its first is evidence enough to ask, unlike the application XIDs `device_restarts` counts; the validation takes a level-1 diagnostic and the restart waits for its verdict (`verdict_wait_seconds`). 2 or more asks only at a repeat.")
    same_workload_restarts: int = Field(3, ge=2, description="Restarts of one workload for faults all on one node (from at least two different pods of it, while it also runs elsewhere) within the window that make that node suspect. One pod crashing every time is the workload's bug (the same rank fails wherever it runs); different pods failing only where they land on one node is the node.")
    link_down: JudgementMode = Field(JudgementMode.ACT, description="Evidence against a node's network link: a job with a rank on a node whose agent saw one of its RDMA ports go down (the `rdma-link` detector's one link-down, below its flap threshold) within `link_seconds` before the job failed for a fault of its own (a container exit, not an XID or a node's fault) is restarted with that node cordoned first, so its pods do not come back to the bad cable or NIC and hang again. Only when at most `link_nodes` of the job's nodes saw a link-down in that time: a switch's reboot takes every port under it down once, and then no node is blamed. `record`: the cordon is recorded only; `off`: link-downs are not used.")
    link_seconds: float = Field(900.0, gt=0, description="Seconds before a job's failure in which a link-down on one of its nodes explains it (`link_down`). Fifteen minutes: NCCL's watchdog ends a collective stuck on a dead peer after 10 (PyTorch's default `timeout`), and the ranks then exit.")
    link_nodes: int = Field(1, ge=1, description="At most this many of a failed job's nodes may have seen a link-down within `link_seconds` for `link_down` to blame them; more points at a switch or the fabric, which no cordon fixes.")
    validation_level: int = Field(1, ge=1, le=4, description="The `dcgmi diag -r` level a suspect node's agent runs: level 1 takes seconds and is safe beside the jobs still running there.")
    verdict_wait_seconds: float = Field(120.0, ge=0, description="Seconds a restart for a fault on a suspect node waits for its validation's verdict, held (`AwaitingVerdict`): a failed validation cordons the node first, so the restarted pods land elsewhere instead of on the faulty GPU for one more failure; a pass, or no answer within this, restarts it in place. A node that shows no agent condition (`agent.condition_type`) is not waited on: no agent runs there to answer. Two minutes: a level-1 diagnostic takes seconds to a minute, and a restart costs a job far more than the wait. 0: restart at once, beside the validation.")
    validation_timeout_seconds: float = Field(900.0, gt=0, description="Seconds kcover waits for a suspect node's answer; without one it is treated as a validation that could not run (the node is cordoned only if it also shows a hardware signal).")
    hardware_conditions: list[str] = Field(default_factory=lambda: ["KcoverGPUHealthy"], description="Node conditions whose `False` status is a hardware signal: a suspect node whose validation cannot run (no answer, or `DiagError`) is cordoned only while one of these says so. `KcoverGPUHealthy` is the agent's own; `Unknown` (an agent that sees no GPU) is no signal either way.")


class NodeJudgement(enum.StrEnum):
    """How a fault source's recommended action combines with the controller's rule for the fault."""

    CEILING = "ceiling"
    """The rule's action is a ceiling: a recommendation at or below it wins, one above it is cut to it."""
    SOURCE = "source"
    """The recommendation wins outright, even above the rule (the rules still decide faults with none)."""
    RULES = "rules"
    """Recommendations are ignored: only the rules decide."""


class RecoverySettings(settinggroups.Group):
    dry_run: bool = Field(False, description="Plan and decide as for real, write the Events (with reasons of their own, `KcoverDryRun...`) and Recovery resources, and change nothing else: no pod, node, device taint or ledger entry is written (the ledger is kept in memory, so cooldowns and budgets hold as they would). A change applies to the next action: the ledger is read again from the cluster.")
    workload_cooldown_seconds: float = Field(60.0, ge=0, description="Seconds after a restart during which the same workload is not restarted again; longer than the default 30 s termination grace so the old pods are gone.")
    max_restarts_per_window: int = Field(5, ge=1, description="Restarts of one workload allowed per window before kcover stops and says why.")
    restart_window_seconds: float = Field(3600.0, gt=0, description="Seconds: the budget window (one hour).")
    node_cooldown_seconds: float = Field(300.0, ge=0, description="Seconds between two cordons of the same node.")
    max_cordoned_fraction: float = Field(0.05, ge=0, le=1, description="Fraction of GPU nodes kcover may hold cordoned at once (its own cordons, those in flight counted); past it the breaker trips. Five percent: a healthy fleet has a node or two in a hundred out for repair; more cordoned by kcover at once means a shared cause (a driver rollout, a fabric fault) that cordoning does not fix.")
    max_cordoned_nodes: int = Field(50, ge=0, description="Nodes kcover may hold cordoned at once, whatever the fleet's size (the smaller of this and `max_cordoned_fraction` wins); past it the breaker trips. 50 is 2.5% of a 2,000-node fleet: capacity a person should look at before kcover takes more.")
    breaker_window_seconds: float = Field(3600.0, gt=0, description="Seconds over which `max_cordons_per_window` and `max_restarted_workloads_per_window` count: one hour.")
    max_cordons_per_window: int = Field(10, ge=0, description="Nodes kcover may cordon within `breaker_window_seconds` (the smaller of this and `max_cordons_per_window_fraction` of the GPU nodes wins, at least one); past it the breaker trips. Llama 3's 54 days on 2,048 eight-GPU nodes saw 419 unexpected interruptions, about 8 a day, 78% of them hardware: a fleet of that size loses about one node in three hours, so ten in one hour is a storm.")
    max_cordons_per_window_fraction: float = Field(0.01, ge=0, le=1, description="Fraction of the GPU nodes kcover may cordon within `breaker_window_seconds` (at least one node); the smaller of this and `max_cordons_per_window` wins, so a small cluster is not emptied by ten cordons.")
    max_restarted_workloads_per_window: int = Field(40, ge=1, description="Different restart units kcover may restart within `breaker_window_seconds`, cluster-wide; past it the breaker trips. Each unit counts once however often it restarts (its own budget bounds a crash loop), so this counts breadth: forty different jobs failing within an hour on a 2,000-node fleet is a shared cause (storage, network, a bad image) that restarting every job does not fix.")
    max_concurrent_restarts: int = Field(10, ge=1, description="Workload restarts in flight at once (from the plan to the last pod taken away; cordons and other actions not counted); a restart planned past it is held (`Throttled`) and runs when one finishes. A bound on the API server's load, not a breaker: it never latches. A change applies to the next restart planned.")
    taint_key: str = Field("kcover.io/unhealthy", description="Key of the taint kcover puts on nodes it cordons.")
    taint_no_execute: bool = Field(False, description="Also add a NoExecute taint (evicts pods that do not tolerate it).")
    uncordon_enabled: bool = Field(False, description="Un-cordon a node kcover cordoned itself (never one an admin cordoned) when the fault's source reports it cleared: the node-condition detector does once the condition has stayed good for its `recovered_hold_seconds`. Off by default: returning a node to service is left to a person until the hold is trusted.")
    namespaces_allow: list[str] = Field(default_factory=list, description="Only these namespaces are acted on; empty means all.")
    namespaces_deny: list[str] = Field(default_factory=lambda: ["kube-system"], description="Namespaces never acted on.")
    ledger_namespace: str = Field("kcover-system", description="Namespace of the ledger's LedgerEntry objects, the controls ConfigMap and kcover's Lease (the chart sets the release namespace).", json_schema_extra=_RESTART)
    ledger_name: str = Field("kcover-ledger", description="Name of the ledger recording cooldowns, budgets, restart intents, held restarts and the breaker: the prefix and the `kcover.io/ledger` label of its LedgerEntry objects (one per restart unit, per node and for the breaker).", json_schema_extra=_RESTART)
    retry_seconds: float = Field(300.0, gt=0, description="Seconds kcover keeps handling again, with backoff (1 s doubling to 30 s), a fault whose first write failed before anything was recorded (an API outage on the ledger write, the LedgerEntry kind not served); past it the fault ends with a `KcoverRecoveryFailed` Event and `kcover_faults_given_up_total`. Five minutes outlasts an API server restart. A replica that becomes leader also replays the faults it saw while following this far back (when it is longer than twice `lease.lease_duration_seconds`), so a leader that died while retrying one, in its memory only, does not lose it.")
    hold_seconds: float = Field(1800.0, gt=0, description="Seconds after its fault a restart refused for a blocker that lifts (a pause, a cooldown, the budget window, the breaker) stays held and is planned again when the blocker lifts, unless the workload recovered by itself; past it the hold is given up with a `KcoverRecoveryFailed` Event. A budget that frees only later is not held: a job that used its budget within half an hour is a crash loop, left to a person (`BudgetExhausted`). Half an hour covers a short maintenance pause and a breaker reset.")
    rules: list[dict[str, Any]] = Field(default_factory=list, description="Extra event-to-action rules (detector, reason, severity -> action), checked before the built-in ones.")
    node_judgement: NodeJudgement = Field(NodeJudgement.CEILING, description="How the action a fault's source recommends (the agent's XID policy, a plugin's configured action) combines with the matching rule: `ceiling` takes the recommendation up to the rule's action, `source` takes it outright, `rules` ignores it. `ceiling` lets the node judge a fault milder (an application XID restarts the job instead of cordoning) while the operator's rules bound how far it may go.")
    judgement: JudgementSettings = Field(default_factory=JudgementSettings, description="Blame before action: what a fault is attributed to (a device, a node, the workload or unknown) and the differential evidence that makes a node or GPU suspect.")
    record_only: list[RecordOnly] = Field(default_factory=list, description="Classes of action kcover decides and records (the Event, with a reason of its own, `KcoverRecordOnly...`, and the Recovery) without carrying them out: `restart`, `cordon`, `uncordon`, `device-taint`, `validation`, `drain`, `remediation`. A way to roll kcover out one class at a time; empty acts on everything.")
    save_logs: SaveLogsSettings = Field(default_factory=SaveLogsSettings, description="Saving the pods' logs before a restart deletes them.")
    delete_concurrency: int = Field(16, ge=1, description="Uid-preconditioned pod deletes of one restart in flight at once (the kinds whose controllers recreate deleted pods: Kubeflow v1 jobs, Volcano Job, LeaderWorkerSet): a 1,000-pod job is taken away in about 60 round trips deep, without a burst the API server's priority and fairness would throttle.")
    evict_concurrency: int = Field(32, ge=1, description="Pod evictions of one restart in flight at once (batch Job, JobSet, TrainJob). An eviction is two writes on the API server (the pod's `DisruptionTarget` condition, then its deletion), about twice a delete's time, so 32 remove pods at about the rate 16 deletes do: on the bench's kube-apiserver a 2,048-pod JobSet was evicted in 4.84 and 4.38 s at 32, in 7.34 and 5.21 s at 16 (64: 4.96 and 4.50 s).")
    verify: VerifySettings = Field(default_factory=VerifySettings, description="Verification after every restart: following the workload until it runs again, MTTR, Stalled recoveries.")
    escalation: EscalationSettings = Field(default_factory=EscalationSettings, description="The escalation ladder: a fault that keeps coming back on one node, and what follows a cordon (drain, remediation request, a person).")
    return_validation: ReturnValidationSettings = Field(default_factory=ReturnValidationSettings, description="The health check a node kcover cordoned must pass before kcover returns it to service.")
    breaker_latch: bool = Field(True, description="Once the breaker trips (a cordon or restart past `max_cordoned_fraction`, `max_cordoned_nodes`, `max_cordons_per_window` or `max_restarted_workloads_per_window`, a device taint past `device_taints.max_per_window`), keep it open, refusing every restart and cordon (restarts are held), until a person resets it with `kcover breaker reset` or the annotation `kcover.io/breaker-reset=true` on the controls ConfigMap. On by default: a storm is a person's to understand, and a breaker that closes by itself lets the storm's next wave through.")
    breaker_cooldown_seconds: float = Field(300.0, ge=0, description="Seconds after a latched breaker was reset during which kcover still refuses restarts and cordons (`BreakerCooldown`), so a storm that is not over does not trip it again at once.")
    controls_name: str = Field("kcover-controls", description="ConfigMap (in `ledger_namespace`) holding operator controls: the global pause (`kcover.io/paused=true`) and the latched breaker's state.", json_schema_extra=_RESTART)
    resume_interval_seconds: float = Field(2.0, gt=0, description="Seconds between the leader's passes over the ledger's pending restarts (recorded, not carried out: a failed delete, or a dead leader's): each pass retries those still within `workload_cooldown_seconds` and gives up the older ones with a KcoverRecoveryFailed Event. Short, since a pending restart is a job not yet recovered; a pass with nothing pending reads nothing.")
    records: RecordsSettings = Field(default_factory=RecordsSettings, description="The Recovery resources: one per action and audited refusal, with phase, timings and cause; their retention.")
    device_taints: DeviceTaintSettings = Field(default_factory=DeviceTaintSettings, description="Device-level isolation under DRA (KEP-5055 DeviceTaintRules): taint the faulty device, not the node.")

    def memory_seconds(self) -> float:
        """How long the ledger keeps what it recorded: as long as any check still reads it (the budget window,
        the cooldowns, holds, the breaker's window, the judgement's evidence window)."""
        return max(self.restart_window_seconds, self.workload_cooldown_seconds, self.node_cooldown_seconds,
                   self.hold_seconds, self.breaker_window_seconds, self.judgement.window_seconds)

    removed: ClassVar[Mapping[str, str]] = {
        "ledger_layout": "the ledger is always one LedgerEntry object per restart unit, per node and for the breaker "
                         "(the `single` ConfigMap layout and its take-over are gone). Delete the line.",
        "event_cooldown_seconds": "it only lengthened how long the ledger kept entries; a repeated fault is held "
                                  "back by recovery.workload_cooldown_seconds and recovery.node_cooldown_seconds. "
                                  "Delete the line.",
        "uncordon_hold_seconds": "it was never read; how long a node's condition must stay good before kcover "
                                 "un-cordons it is detectors.entries.node-condition.config.recovered_hold_seconds. "
                                 "Move the value there.",
    }


class LeaseSettings(settinggroups.Group):
    enabled: bool = Field(True, description="Elect a leader; off only for a single replica in tests.", json_schema_extra=_RESTART)
    name: str = Field("kcover-controller", description="Lease name.", json_schema_extra=_RESTART)
    namespace: str = Field("kcover-system", description="Lease namespace.", json_schema_extra=_RESTART)
    identity: str = Field("", description="This replica's identity; empty means the pod name (HOSTNAME).", json_schema_extra=_RESTART)
    lease_duration_seconds: float = Field(15.0, gt=0, description="Seconds a Lease is valid without renewal: client-go's default.")
    renew_deadline_seconds: float = Field(10.0, gt=0, description="Seconds the leader keeps trying to renew before it steps down: client-go's default.")
    retry_period_seconds: float = Field(2.0, gt=0, description="Seconds between attempts to acquire or renew: client-go's default. Must be below `renew_deadline_seconds`, which must be below `lease_duration_seconds`, so a leader renews before its Lease can expire.")
    replay_margin_seconds: float = Field(60.0, ge=0, description="Seconds added to twice `lease_duration_seconds` when a replica that becomes leader picks which faults it saw while following to act on: those seen up to this long (and twice the Lease duration, or `recovery.retry_seconds` where that is longer) before the last renewal of the previous leader. That leader may have seen a fault late or not at all before it died (an overloaded process, a watch being re-established); replaying one it did act on costs a refusal (its pod replaced, its node cordoned or in cooldown), never a second action. A minute covers a watch tens of seconds behind.")

    def relations(self) -> list[settinggroups.Relation]:
        out = []
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            out.append(settinggroups.Relation(
                "renew_deadline_seconds", f"must be below lease.lease_duration_seconds "
                f"({self.lease_duration_seconds:g}): a leader must give up before its Lease expires, "
                f"or two replicas may lead at once", ("lease_duration_seconds",)))
        if self.retry_period_seconds >= self.renew_deadline_seconds:
            out.append(settinggroups.Relation(
                "retry_period_seconds", f"must be below lease.renew_deadline_seconds "
                f"({self.renew_deadline_seconds:g}): otherwise the leader gets at most one renewal "
                f"attempt before it steps down", ("renew_deadline_seconds",)))
        return out


class AgentValidationSettings(settinggroups.Group):
    enabled: bool = Field(True, description="Answer the controller's validation requests (a suspect node's, `recovery.judgement`, and a node's before its return, `recovery.return_validation`): watch this agent's own Node (one watch with a field selector) and, for each new `kcover.io/validate-request`, run `dcgmi diag -r <level>` and report the result as the Node condition `KcoverGPUValidated`. Without a `dcgmi` it answers `DiagError` at once, so the controller knows the node cannot be validated rather than waiting for its timeout.", json_schema_extra=_RESTART)
    dcgmi_path: str = Field("dcgmi", description="The dcgmi program (looked up on PATH): the agent image carries none, so this needs an image with DCGM.")
    timeout_seconds: float = Field(3600.0, gt=0, description="Seconds one diagnostic may run before it is killed and the validation reported as not run (`DiagError`): level 4 runs for about an hour on eight GPUs.")


class AgentSettings(settinggroups.Group):
    node_name: str = Field("", description="The node this agent runs on; empty means $NODE_NAME (downward API).", json_schema_extra=_RESTART)
    condition_type: str = Field(codec.AGENT_CONDITION_TYPE, min_length=1, description="Node condition the agent sets; the controller reads the same setting (its node-condition detector's default rule and the reading of the condition's bad status as the agent's cordon judgement, and `kcover_agent_condition_missing_nodes`), so agents and controllers must share it (the chart gives both one value).")
    condition_hold_seconds: float = Field(300.0, ge=0, description="Seconds a fault must stay cleared before the condition returns to True.")
    min_write_interval_seconds: float = Field(1.0, ge=0, description="Seconds between two writes of the node status (rate limit).")
    xid_policy_file: str = Field("", description="YAML XID policy overriding the shipped one; empty uses config/xid-policy.yaml as packaged.")
    reporting_controller: str = Field("kcover.io/agent", description="reportingController on the agent's Events; the controller trusts it for node targets.")
    event_namespace: str = Field("kcover-system", description="Namespace the agent writes its Node Events in: the release namespace (the chart sets it), where only the agent may create Events, so the controller can tell its reports from anyone else's (`detectors.entries.event-watcher.config.node_event_namespaces`).", json_schema_extra=_RESTART)
    pod_resources_socket: str = Field("/var/lib/kubelet/pod-resources/kubelet.sock", description="Kubelet PodResources API socket, to map a GPU to its pods.")
    event_dedupe_seconds: float = Field(300.0, ge=0, description="Seconds: the agent posts one Event per reason, GPU and recommended action within this window; repeats (an XID storm) are only counted in the log.")
    max_events_per_minute: int = Field(30, ge=1, description="Events the agent may create per minute (token bucket), so a flapping GPU cannot flood the API server.")
    event_retry_seconds: float = Field(120.0, gt=0, description="Seconds the agent keeps retrying, with backoff, an Event asking for recovery whose write failed (the API client's own retries already given up); then it is dropped with an error log. Keep it below the controller's event-watcher `staleness_seconds` (180 s), which ignores older Events.")
    gpu_detectors: list[str] = Field(default_factory=lambda: ["nvml", "dcgm"], description="Detectors whose running means the agent sees this node's GPU faults. On a GPU node (`kube.gpu_resources` in its capacity, or the labels of `agent.gpu_node_labels`) where none of them runs (NVML cannot load and no `dcgmi`: a broken driver rollout or a missing runtime class; or they failed, or are disabled), the agent is blind and says so: its condition is `Unknown` (reason `NoGPUDetector`), `kcover_agent_blind` is 1 and /readyz says degraded. Add a plugin that watches GPUs (`metax`) where it is the one that does.")
    gpu_node_labels: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"}, description="Node labels (all of them) that make the agent count its node as a GPU node even without GPU capacity: a node whose driver or device plugin never came up publishes no `nvidia.com/gpu`, and an agent there that sees no GPU would otherwise report healthy GPUs. The default is the label GPU feature discovery sets and the chart's agent selects on; `{}` counts capacity alone. Only the agent's sight uses it (its condition `Unknown` when blind), never the controller's count of GPU nodes.")
    gpu_node_recheck_seconds: float = Field(60.0, gt=0, description="Seconds between reads of the agent's Node while it does not count as a GPU node: a device plugin may publish the GPUs' capacity after the agent started. Only agents on nodes without GPU capacity read it again, so a fleet's GPU nodes cost nothing.")
    validation: AgentValidationSettings = Field(default_factory=AgentValidationSettings, description="Running the validation the controller asks for before it returns this node to service.")


class Settings(BaseSettings):
    """The root. Build it with `layering.layer()`; `Settings()` alone reads the process environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTING, extra="forbid",
                                      validate_default=True)

    server: ServerSettings = Field(default_factory=ServerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    bus: BusSettings = Field(default_factory=BusSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    detectors: DetectorsSettings = Field(default_factory=DetectorsSettings)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
