"""`kcover sim preflight-slow-node`: the plugin's scenario, found through its entry point and played on the
simulated cluster with the real agents, controllers and recovery engine."""

from __future__ import annotations

from importlib import metadata

from kcover_preflight import collector, judge, scenario

from kcover.detectors import registry
from kcover.sim import running, scenarios


def test_entry_points_resolve_to_the_plugin() -> None:
    found = registry.discover()
    assert found.load("preflight") is judge.PreflightJudge
    assert found.load("preflight-collector") is collector.PreflightCollector
    (ep,) = [e for e in metadata.entry_points(group=scenarios.ENTRY_POINT_GROUP) if e.name == "preflight-slow-node"]
    assert ep.load() is scenario.SCENARIO


async def test_the_scenario_passes_in_the_sim() -> None:
    played = scenarios.catalogue()["preflight-slow-node"]
    report = await running.run_scenario(played)  # 4 nodes asked by default: the scenario raises it to 8
    failed = [c.text for c in report.checks if not c.ok]
    assert report.passed, failed
    assert report.size.nodes == 8
    (fault,) = report.faults
    assert fault.action == "cordon-node,restart-workload"
    assert None not in (fault.detected_at, fault.acted_at, fault.recovered_at)
    assert report.api_requests.get("CREATE preflightreports.kcover.io") == 8
