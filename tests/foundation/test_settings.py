from __future__ import annotations

import pydantic
import pytest
from pydantic import BaseModel

from kcover import errors, layering, settings


def test_defaults_are_valid_and_documented() -> None:
    s = settings.Settings.model_validate({})
    assert s.lease.lease_duration_seconds == 15
    assert s.recovery.max_restarts_per_window == 5
    # every field of every group carries a description (unit and why)
    pending: list[tuple[str, type[BaseModel]]] = [("", settings.Settings)]
    seen = 0
    while pending:
        prefix, model_cls = pending.pop()
        for name, info in model_cls.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                pending.append((f"{prefix}{name}.", annotation))
                if prefix:
                    assert info.description, f"{prefix}{name} has no description"
                continue
            seen += 1
            assert info.description, f"{prefix}{name} has no description"
    assert seen > 50


def test_naming_one_detector_keeps_the_others() -> None:
    s = layering.layer(file_data={"detectors": {"entries": {"nvml": {"enabled": False}}}}, file_name="f").settings
    assert s.detectors.entries["nvml"].enabled is False
    assert s.detectors.entries["pod-status"].enabled is True
    assert set(settings.BUILTIN_DETECTORS) <= set(s.detectors.entries)


def test_precedence_cli_over_env_over_file_over_default() -> None:
    layered = layering.layer(
        file_data={"recovery": {"workload_cooldown_seconds": 10, "node_cooldown_seconds": 11,
                                "max_restarts_per_window": 2}},
        file_name="f.yaml",
        environ={"KCOVER_RECOVERY__WORKLOAD_COOLDOWN_SECONDS": "20", "KCOVER_RECOVERY__NODE_COOLDOWN_SECONDS": "21",
                 "UNRELATED": "x"},
        cli={"recovery.workload_cooldown_seconds": 30},
    )
    r = layered.settings.recovery
    assert (r.workload_cooldown_seconds, r.node_cooldown_seconds, r.max_restarts_per_window) == (30, 21, 2)
    assert r.restart_window_seconds == 3600
    p = layered.provenance
    assert p["recovery.workload_cooldown_seconds"] == "cli"
    assert p["recovery.node_cooldown_seconds"] == "env"
    assert p["recovery.max_restarts_per_window"] == "file:f.yaml"
    assert "recovery.restart_window_seconds" not in p


def test_only_nested_kcover_names_are_settings() -> None:
    layered = layering.layer(environ={"KCOVER_CACHE": "/tmp/x", "KCOVER_CONTROLPLANE_BIN": "/opt/bin",
                                      "KCOVER_LEASE__NAME": "mine"})
    assert layered.settings.lease.name == "mine"
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(environ={"KCOVER_LAESE__NAME": "typo"})
    assert info.value.errors[0].startswith("env: laese: Extra inputs are not permitted")


def test_env_lists_are_json() -> None:
    layered = layering.layer(environ={"KCOVER_RECOVERY__NAMESPACES_DENY": '["a", "b"]'})
    assert layered.settings.recovery.namespaces_deny == ["a", "b"]


@pytest.mark.parametrize(
    ("file_data", "expected"),
    [
        ({"recovery": {"workload_cooldown_seconds": -1}},
         "file:f.yaml: recovery.workload_cooldown_seconds: Input should be greater than or equal to 0 (got -1)"),
        ({"recovery": {"cooldown": 5}}, "file:f.yaml: recovery.cooldown: Extra inputs are not permitted (got 5)"),
        ({"lease": {"lease_duration_seconds": "soon"}}, "file:f.yaml: lease.lease_duration_seconds: Input should be a valid number"),
        ({"logging": {"format": "xml"}}, "file:f.yaml: logging.format: Input should be 'auto', 'json' or 'console'"),
        ({"nonsense": 1}, "file:f.yaml: nonsense: Extra inputs are not permitted"),
    ],
)
def test_field_level_errors_name_the_source_and_field(file_data: dict[str, object], expected: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(file_data=file_data, file_name="f.yaml")
    assert any(line.startswith(expected) for line in info.value.errors), info.value.errors


def test_env_errors_are_attributed_to_env() -> None:
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(environ={"KCOVER_BUS__SUBSCRIBER_CAPACITY": "0"})
    assert info.value.errors[0].startswith("env: bus.subscriber_capacity:")


def test_restart_required_fields_and_changed_paths() -> None:
    required = layering.restart_required_paths()
    assert {"lease.name", "lease.namespace", "server.port"} <= required
    assert "recovery.workload_cooldown_seconds" not in required
    a = settings.Settings.model_validate({})
    b = settings.Settings.model_validate({"lease": {"name": "other"},
                                          "detectors": {"entries": {"pod-status": {"config": {"x": 1}}}}})
    assert layering.changed_paths(a, b) == {"lease.name", "detectors.entries.pod-status"}


@pytest.mark.parametrize("layers", [
    {"file_data": {"recovery": {"event_cooldown_seconds": 30}}, "file_name": "f.yaml"},
    {"environ": {"KCOVER_RECOVERY__EVENT_COOLDOWN_SECONDS": "30"}},
    {"cli": {"recovery.event_cooldown_seconds": 30}},
])
def test_a_removed_setting_is_refused_by_name_with_what_to_do(layers: dict[str, object]) -> None:
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(**layers)  # type: ignore[arg-type]
    (line,) = info.value.errors
    assert "recovery.event_cooldown_seconds: removed setting:" in line
    assert "recovery.workload_cooldown_seconds" in line
    assert "Extra inputs" not in line
    assert "event_cooldown_seconds" not in settings.RecoverySettings.model_fields


def test_a_removed_setting_is_reported_with_the_other_errors_of_its_group() -> None:
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(file_data={"recovery": {"event_cooldown_seconds": 30, "workload_cooldown_seconds": -1,
                                               "max_restarts_per_window": "many"}}, file_name="f.yaml")
    fields = sorted(line.split(": ")[1] for line in info.value.errors)
    assert fields == ["recovery.event_cooldown_seconds", "recovery.max_restarts_per_window",
                      "recovery.workload_cooldown_seconds"]


@pytest.mark.parametrize(("lease", "field"), [
    ({"renew_deadline_seconds": 15}, "lease.renew_deadline_seconds"),
    ({"lease_duration_seconds": 8}, "lease.renew_deadline_seconds"),
    ({"retry_period_seconds": 10}, "lease.retry_period_seconds"),
    ({"renew_deadline_seconds": 1.5}, "lease.retry_period_seconds"),
])
def test_lease_timings_must_nest(lease: dict[str, float], field: str) -> None:
    """retry_period < renew_deadline < lease_duration, reported at the field, with where it came from."""
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(file_data={"lease": lease}, file_name="f.yaml")
    (line,) = info.value.errors
    source = "file:f.yaml" if f"lease.{next(iter(lease))}" == field else "default"
    assert line.startswith(f"{source}: {field}: must be below lease.")


def test_lease_timings_are_judged_on_the_merged_layers() -> None:
    """A file shortening the Lease is fine when the environment shortens the deadlines too."""
    layered = layering.layer(file_data={"lease": {"lease_duration_seconds": 6}}, file_name="f.yaml",
                             environ={"KCOVER_LEASE__RENEW_DEADLINE_SECONDS": "4",
                                      "KCOVER_LEASE__RETRY_PERIOD_SECONDS": "1"})
    assert (layered.settings.lease.lease_duration_seconds, layered.settings.lease.renew_deadline_seconds) == (6, 4)
    with pytest.raises(pydantic.ValidationError, match="settings_relation"):
        settings.Settings.model_validate({"lease": {"lease_duration_seconds": 6}})


def test_uncordon_hold_moved_to_the_node_condition_detector() -> None:
    with pytest.raises(errors.ConfigError) as info:
        layering.layer(file_data={"recovery": {"uncordon_hold_seconds": 60}}, file_name="f.yaml")
    (line,) = info.value.errors
    assert "recovery.uncordon_hold_seconds: removed setting:" in line
    assert "detectors.entries.node-condition.config.recovered_hold_seconds" in line
