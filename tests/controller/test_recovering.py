"""The controller's engine assembly: how long the ledger keeps an entry follows the live settings."""

from __future__ import annotations

import pytest

from kcover import settings
from kcover.controller import recovering


@pytest.mark.parametrize(("recovery", "kept"), [
    ({}, 21600.0),  # the judgement's evidence window is the longest by default
    ({"restart_window_seconds": 100, "workload_cooldown_seconds": 500, "breaker_window_seconds": 60, "hold_seconds": 60,
      "judgement": {"window_seconds": 60}}, 500.0),
    ({"restart_window_seconds": 100, "node_cooldown_seconds": 900, "breaker_window_seconds": 60, "hold_seconds": 60,
      "judgement": {"window_seconds": 60}}, 900.0),
    ({"restart_window_seconds": 100, "breaker_window_seconds": 7200, "hold_seconds": 60,
      "judgement": {"window_seconds": 60}}, 7200.0),
])
def test_ledger_retention_is_the_longest_window_a_check_reads(recovery: dict[str, float], kept: float) -> None:
    live = recovering._Live(settings.RecoverySettings.model_validate(recovery))
    assert live.retention_seconds() == kept


def test_ledger_retention_follows_a_reload() -> None:
    live = recovering._Live(settings.RecoverySettings())
    assert live.retention_seconds() == 21600
    live.recovery = settings.RecoverySettings(restart_window_seconds=30000)
    assert live.retention_seconds() == 30000
