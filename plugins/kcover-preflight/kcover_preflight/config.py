"""The configuration models of the preflight detectors (agent side and controller side).

Owns the schema, defaults and units of both detectors' settings; it does no I/O. The defaults follow
the Go project where it had one (reports collected for 10 minutes, swept every minute, absolute
threshold 0 = off) and say why where it had none.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kcover import model

DEFAULT_REPORT_DIR = "/var/lib/kcover/preflight"
DEFAULT_LABEL = "kcover.io/preflight=true"


class CollectorConfig(BaseModel):
    """Settings of `preflight-collector`, the agent-side detector."""

    model_config = ConfigDict(extra="forbid")

    report_dir: str = Field(DEFAULT_REPORT_DIR, min_length=1, description="Node directory (a hostPath) the init containers write `<namespace>/<workload>-<index>.json` into; the Go project's path.")
    init_container: str = Field("preflight", min_length=1, max_length=63, description="Name of the init container whose end means the report is written.")
    label_selector: str = Field(DEFAULT_LABEL, min_length=1, description="Pods that run a preflight, as a label selector (the Go project's label).")
    retry_seconds: float = Field(2.0, gt=0, description="Seconds between looks for a report file that is not there yet (the file may land just after the container ends).")
    report_wait_seconds: float = Field(120.0, gt=0, description="Seconds after the init container ended that a missing report file is looked for; then the rank stays silent and the controller's collection timeout deals with it.")
    max_report_bytes: int = Field(512 * 1024, ge=1024, le=1024 * 1024, description="Largest report file read, in bytes; the PreflightReport's `report` field holds at most 512 KiB (etcd keeps objects under 1.5 MiB).")


class JudgeConfig(BaseModel):
    """Settings of `preflight`, the controller-side detector."""

    model_config = ConfigDict(extra="forbid")

    init_container: str = Field("preflight", min_length=1, max_length=63, description="Name of the init container a workload's pods run the preflight in: a workload has at least as many ranks as live pods with it, whatever its reports state (`workload_size`).")
    relative_fraction: float = Field(0.5, ge=0, lt=1, description="A pair is slow below this fraction of the median busbw of the workload's pairs at the same message size; 0 turns the relative test off. 0.5 is far outside run-to-run noise (a few per cent on the fixtures) and well above a degraded link (2-6 per cent of healthy on the fixtures).")
    absolute_threshold_gbps: float = Field(0.0, ge=0, description="A pair is slow below this busbw in GB/s; 0 (the Go project's default) turns it off, and then a report's own `node_check_busbw_threshold_gbps` applies when set.")
    collection_timeout_seconds: float = Field(600.0, gt=0, description="Seconds a workload's reports are waited for, from its first report, before the missing ranks are reported (the Go project's 10 minutes; its chart sets 30).")
    sweep_seconds: float = Field(60.0, gt=0, description="Seconds between two sweeps for workloads past the collection timeout (the Go project's minute). New reports are judged as they arrive, without waiting for a sweep.")
    suspect_silent_nodes: bool = Field(False, description="Also publish the nodes of ranks that never reported as suspects (`PreflightNoReport`, recommending `silent_action`). Off by default: a rank is as often silent because its pod was slow to schedule or pull its image as because its node is bad.")
    silent_action: model.Action = Field(model.Action.CORDON_NODE, description="What a silent rank's node is recommended, when suspected: cordon it (its job was never started there), or `report` only.")
    slow_action: model.Action = Field(model.Action.CORDON_NODE_AND_RESTART, description="What a slow node is recommended: take it out of scheduling and restart the workloads on it, so the job starts again on other nodes. The recovery rules still bound it (see the plugin's docs).")
    write_status: bool = Field(True, description="Write the verdict, per-pair busbw and slow nodes into each PreflightReport's status, for `kubectl get pfr`.")
