from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import structlog
import yaml

from kcover import bus as bus_
from kcover import metrics, reloading, settings
from kcover.cli import configuring
from kcover.detectors import contract, supervising

from . import detectors_for_tests as d
from .test_supervising import detector_settings, make_registry


class ConfigMapDir:
    """The layout the kubelet gives a ConfigMap volume: config.yaml -> ..data/config.yaml, ..data -> ..<ts>."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        self.path = root / "config.yaml"

    def publish(self, data: dict[str, Any] | str) -> None:
        self.generation += 1
        version = self.root / f"..2026_11_29_{self.generation}"
        version.mkdir()
        text = data if isinstance(data, str) else yaml.safe_dump(data)
        (version / "config.yaml").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")  # atomic swap, as the kubelet does
        if not self.path.is_symlink():
            self.path.symlink_to("..data/config.yaml")


def base_config(label: str, cooldown: float = 60) -> dict[str, Any]:
    entries: dict[str, Any] = {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}
    entries["ticker"] = {"config": {"label": label, "interval_seconds": 0.2}}
    return {"recovery": {"workload_cooldown_seconds": cooldown}, "detectors": {"entries": entries}}


async def test_reload_applies_valid_changes_refuses_invalid_ones_and_restarts_changed_detectors(tmp_path: Path) -> None:
    cm = ConfigMapDir(tmp_path)
    cm.publish(base_config("v1"))
    m = metrics.Metrics()
    b = bus_.Bus(dedupe_window_seconds=0)
    first = configuring.load_settings(str(cm.path), {}, environ={})
    ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m)
    sup = supervising.Supervisor(make_registry(), ctx, b, first.settings.detectors, m)
    applied: list[settings.Settings] = []

    async def apply(new: settings.Settings, changed: set[str]) -> None:
        sup.reconfigure(new.detectors)
        applied.append(new)

    reloader = reloading.Reloader(str(cm.path), lambda: configuring.load_settings(str(cm.path), {}, environ={}), apply,
                                  first.settings, m, interval_seconds=0.05)
    d.Ticker.starts.clear()
    stop = asyncio.Event()
    sub = b.subscribe("t")
    async with asyncio.TaskGroup() as group:
        group.create_task(sup.run(stop))
        group.create_task(reloader.run(stop))
        await asyncio.sleep(0.3)

        # 1. a valid change: the tunable applies and the detector restarts with its new config
        cm.publish(base_config("v2", cooldown=120))
        await asyncio.sleep(0.5)
        assert applied
        assert applied[-1].recovery.workload_cooldown_seconds == 120
        assert d.Ticker.starts == ["v1", "v2"]
        assert sub.get_nowait()[-1].message.startswith("v2-")

        # 2. an invalid file: refused, old config kept, failure counted, precise error logged
        with structlog.testing.capture_logs() as logs:
            cm.publish(base_config("v3", cooldown=-5))
            await asyncio.sleep(0.4)
        assert len(applied) == 1
        assert reloader.current.recovery.workload_cooldown_seconds == 120
        assert m.registry.get_sample_value("kcover_config_reload_failures_total") == 1
        refused = [e for e in logs if e["event"] == "config_reload_refused"]
        assert refused
        assert any("recovery.workload_cooldown_seconds: Input should be greater than or equal to 0"
                               in line for line in refused[0]["field_errors"])
        assert d.Ticker.starts == ["v1", "v2"]

        # 3. YAML that does not parse is refused the same way
        cm.publish("recovery: [unclosed")
        await asyncio.sleep(0.3)
        assert m.registry.get_sample_value("kcover_config_reload_failures_total") == 2

        # 4. a restart-only setting is logged, not applied, while the rest applies
        changed = base_config("v2", cooldown=90)
        changed["lease"] = {"name": "another-lease"}
        with structlog.testing.capture_logs() as logs:
            cm.publish(changed)
            await asyncio.sleep(0.4)
        assert applied[-1].recovery.workload_cooldown_seconds == 90
        assert applied[-1].lease.name == "kcover-controller"
        assert any(e["event"] == "config_change_needs_restart" and e["setting"] == "lease.name" for e in logs)
        assert d.Ticker.starts == ["v1", "v2"]  # its config did not change: not restarted
        assert m.registry.get_sample_value("kcover_config_reloads_total") == 2
        stop.set()


def test_merge_live_keeps_restart_required_values() -> None:
    current = settings.Settings.model_validate({})
    new = settings.Settings.model_validate({"lease": {"namespace": "x", "retry_period_seconds": 3}})
    effective, applied, blocked = reloading.merge_live(current, new)
    assert blocked == {"lease.namespace"}
    assert applied == {"lease.retry_period_seconds"}
    assert effective.lease.namespace == "kcover-system"
    assert effective.lease.retry_period_seconds == 3
    assert detector_settings({}).entries["nvml"].enabled is False


async def test_reload_applies_nothing_unless_rules_and_detector_configs_are_valid_too(tmp_path: Path) -> None:
    """The settings schema accepts the file, but a rule names an unknown action and a detector config is
    wrong: nothing is applied, the refusal is counted once and logged with both problems."""
    cm = ConfigMapDir(tmp_path)
    cm.publish(base_config("v1"))
    m = metrics.Metrics()
    load = configuring.checked_loader(str(cm.path), {}, role=contract.Role.CONTROLLER, detectors=make_registry(),
                                      environ={})
    applied: list[set[str]] = []

    async def apply(new: settings.Settings, changed: set[str]) -> None:
        applied.append(changed)

    reloader = reloading.Reloader(str(cm.path), load, apply, load().settings, m)
    bad = base_config("v1", cooldown=120)
    bad["recovery"]["rules"] = [{"detector": "ticker", "action": "reboot-the-cluster"}]
    bad["detectors"]["entries"]["ticker"]["config"]["interval_seconds"] = "often"
    cm.publish(bad)
    with structlog.testing.capture_logs() as logs:
        assert await reloader.check_once() is False
    assert applied == []
    assert reloader.current.recovery.workload_cooldown_seconds == 60
    assert m.registry.get_sample_value("kcover_config_reload_failures_total") == 1
    (refused,) = [e for e in logs if e["event"] == "config_reload_refused"]
    assert any(line.startswith("recovery.rules[0]:") and "reboot-the-cluster" in line
               for line in refused["field_errors"])
    assert any(line.startswith("detectors.entries.ticker.config.interval_seconds:") for line in refused["field_errors"])

    bad["recovery"]["rules"] = [{"detector": "ticker", "action": "ignore"}]  # this registry's detector
    bad["detectors"]["entries"]["ticker"]["config"]["interval_seconds"] = 0.5
    cm.publish(bad)
    assert await reloader.check_once() is True
    assert applied == [{"recovery.workload_cooldown_seconds", "recovery.rules", "detectors.entries.ticker"}]
