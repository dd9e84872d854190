"""The metax detector's configuration model.

Owns the schema, defaults and units of the `metax` detector's settings; the defaults are the Go
kcover's MetaX day-2 limits and its answer to a failed day-2 check: cordon the node. Validation refuses a malformed `run_at` or an unknown time zone.
"""

from __future__ import annotations

import zoneinfo

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kcover import model
from kcover_metax import checking, scheduling


def _cordon_on_every_failure() -> dict[checking.Check, model.Action]:
    return dict.fromkeys(checking.Check, model.Action.CORDON_NODE)


class MetaxConfig(BaseModel):
    """Settings of the `metax` detector."""

    model_config = ConfigDict(extra="forbid")

    expected_gpus: int = Field(8, ge=1, description="GPUs that `mx-smi -L` must list as `Available`. 8 is a full MetaX MXC500 node.")
    hotspot_limit_celsius: float = Field(85.0, gt=0, description="°C: a GPU whose hottest hotspot sensor reads this or more fails the check.")
    double_bit_ecc_limit: int = Field(64, ge=0, description="Pages: a GPU with more double-bit-ECC retired pages than this fails the check.")
    hca_ids: list[str] = Field(default_factory=list, description="InfiniBand HCAs (e.g. `mlx5_0`) whose every port must be `PORT_ACTIVE`; empty skips the check and `ibv_devinfo`.")
    run_at: str = Field("03:00", description="HH:MM local time of the daily run; 03:00 is quiet on most clusters.")
    timezone: str = Field("UTC", description="IANA time zone `run_at` is read in, e.g. `Asia/Shanghai`.")
    run_at_start: bool = Field(True, description="Also run the checks once when the detector starts, so a new or rebooted node is checked at once.")
    force: bool = Field(False, description="Run even when the node's capacity does not list `capacity_resource` (or the capacity is unknown).")
    capacity_resource: str = Field("metax-tech.com/gpu", description="Extended resource that marks a MetaX GPU node.")
    command_timeout_seconds: float = Field(60.0, gt=0, description="Seconds one `mx-smi` or `ibv_devinfo` call may take before it is killed; mx-smi on 8 GPUs answers in a few seconds.")
    mx_smi: str = Field("mx-smi", min_length=1, description="Path (or name in PATH) of mx-smi.")
    ibv_devinfo: str = Field("ibv_devinfo", min_length=1, description="Path (or name in PATH) of ibv_devinfo.")
    actions: dict[checking.Check, model.Action] = Field(
        default_factory=_cordon_on_every_failure,
        description="Action recommended when a check fails, per check (`gpu-count`, `temperature`, `ecc`, `hca`); checks not listed recommend `cordon-node`, as the Go kcover cordons a node that fails its day-2 checks. The controller's `recovery.node_judgement` decides how far it is honoured.")

    @field_validator("actions")
    @classmethod
    def _every_check(cls, value: dict[checking.Check, model.Action]) -> dict[checking.Check, model.Action]:
        return {**_cordon_on_every_failure(), **value}

    @field_validator("run_at")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        scheduling.parse_hhmm(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value
