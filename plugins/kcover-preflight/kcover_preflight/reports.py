"""The preflight report: the JSON file a `preflight` init container writes, and the measurements in it.

Owns the report schema (the Go project's, read as it is, plus one optional field of our own) and
turning each batch of a report into a `Measurement`: which two nodes were paired in which round, the
message size, and the bus bandwidth. Two ways to state a batch's numbers are read:

* **Go format**: `allreduce_ms`, `world_size`, `allreduce_shape` and `dtype_bytes`. The size is the
  product of the shape times the dtype bytes; busbw = size / time x 2(n-1)/n (n = `world_size`), in
  GB/s of 1e9 bytes, as nccl-tests counts them.
* **Native format**: `nccl_tests`, the text (or `-J` JSON) nccl-tests printed for that pair; the row
  of the largest message size is taken, with the busbw nccl-tests printed (`nccltests`).

The Go project's field names and encodings are kept: the threshold is a JSON *string*, the checks are
0 skip / 1 pass / 2 fail, a batch's `pair` is a list of two node IPs. Pure: no I/O.
How it fails: `parse()` raises `ReportError` on JSON or schema errors; a batch whose numbers cannot
be read becomes a failed measurement with the reason, never an exception.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kcover_preflight import nccltests

SCHEMA_VERSION = "v1"


class ReportError(ValueError):
    """A report file that is not a preflight report."""


class Check(enum.IntEnum):
    SKIP = 0
    PASS = 1
    FAIL = 2


class BatchStatus(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    SKIP = "skip"


class Batch(BaseModel):
    """One round of the round-robin pairing, as one end saw it."""

    model_config = ConfigDict(extra="ignore")

    batch_idx: int = Field(ge=0)
    pair: list[str] = Field(default_factory=list)
    """The two node IPs paired in this round (a lone node in a round with an odd count has one)."""
    self_ip: str = ""
    status: BatchStatus = BatchStatus.OK
    allreduce_ms: float | None = Field(None, ge=0)
    world_size: int | None = Field(None, ge=1)
    allreduce_shape: list[int] = Field(default_factory=list)
    dtype_bytes: int | None = Field(None, ge=1)
    nccl_tests: str = ""
    """kcover's addition: what nccl-tests printed for this pair (text or `-J` JSON); empty in Go reports."""
    error: str = ""
    """kcover's addition: why the batch failed, as the init container saw it."""

    @field_validator("pair", mode="before")
    @classmethod
    def _pair(cls, value: Any) -> Any:
        if isinstance(value, str):  # "10.0.0.1,10.0.0.2" in hand-written files
            return [p for p in value.replace(" ", ",").split(",") if p]
        return value


class Report(BaseModel):
    """A preflight report file (`/var/lib/kcover/preflight/<namespace>/<workload>-<index>.json`)."""

    model_config = ConfigDict(extra="ignore")

    version: str = SCHEMA_VERSION
    workload: str = Field(min_length=1)
    workload_size: int = Field(ge=1)
    """How many nodes (ranks) the workload's preflight runs over."""
    rank: int = Field(ge=0)
    node_name: str = ""
    node_ip: str = ""
    gpu_check: Check = Check.SKIP
    storage_check: Check = Check.SKIP
    node_check_busbw_threshold_gbps: str = "0"
    """The absolute threshold the init container was given, as a JSON string (the Go project's encoding)."""
    batches: list[Batch] = Field(default_factory=list)

    @field_validator("node_check_busbw_threshold_gbps", mode="before")
    @classmethod
    def _threshold(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @property
    def threshold_gbps(self) -> float:
        """The report's absolute threshold; 0 (off) when it is unreadable."""
        try:
            value = float(self.node_check_busbw_threshold_gbps or "0")
        except ValueError:
            return 0.0
        return value if math.isfinite(value) and value > 0 else 0.0

    @property
    def failed_checks(self) -> list[str]:
        return [name for name, check in (("gpu", self.gpu_check), ("storage", self.storage_check))
                if check is Check.FAIL]


def parse(text: str | bytes) -> Report:
    """A report from its JSON text. Raises ReportError."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ReportError("a preflight report is a JSON object")
    try:
        return Report.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ReportError(f"not a preflight report: {problems}") from None


def dump(report: Report) -> str:
    """The report as the init container writes it (empty kcover-only fields left out)."""
    doc = report.model_dump(mode="json")
    for batch in doc["batches"]:
        for key in ("nccl_tests", "error"):
            if not batch[key]:
                del batch[key]
    return json.dumps(doc, indent=2)


def bus_factor(world_size: int) -> float:
    """all-reduce's bus bandwidth factor 2(n-1)/n (nccl-tests' PERFORMANCE.md)."""
    return 2.0 * (world_size - 1) / world_size


def busbw_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce of `size_bytes` that took `seconds` over `world_size` ranks, in GB/s (1e9)."""
    return size_bytes / seconds / 1e9 * bus_factor(world_size)


@dataclass(frozen=True)
class Measurement:
    """One end's account of one pair in one round."""

    batch: int
    ends: tuple[str, ...]
    """The pair's node IPs as the report names them, sorted."""
    size_bytes: int | None
    busbw_gbps: float | None
    failed: bool
    why: str = ""


def measure(batch: Batch) -> Measurement | None:
    """What one batch says about its pair; None for a skipped round (the lone node of an odd count)."""
    ends = tuple(sorted(set(batch.pair)))
    if batch.status is BatchStatus.SKIP or len(ends) < 2:
        return None
    if batch.status is BatchStatus.FAIL:
        return Measurement(batch.batch_idx, ends, None, None, True, batch.error or "the init container reported fail")
    if batch.nccl_tests:
        try:
            run = nccltests.parse(batch.nccl_tests)
        except nccltests.ParseRefused as exc:
            return Measurement(batch.batch_idx, ends, None, None, True, str(exc))
        row = run.largest
        return Measurement(batch.batch_idx, ends, row.size_bytes, row.out_of_place.busbw_gbps, False)
    if batch.allreduce_ms is None or not batch.allreduce_shape or batch.dtype_bytes is None:
        return None  # the other end of the pair carries the numbers (nccl-tests runs on one launcher)
    size = math.prod(batch.allreduce_shape) * batch.dtype_bytes
    if batch.allreduce_ms <= 0 or size <= 0:
        return Measurement(batch.batch_idx, ends, size, None, True, "a zero time or size")
    world = batch.world_size or len(ends)
    if world < 2:
        return Measurement(batch.batch_idx, ends, size, None, True, f"world_size {world}: no pair was measured")
    return Measurement(batch.batch_idx, ends, size, busbw_gbps(size, batch.allreduce_ms / 1000.0, world), False)
