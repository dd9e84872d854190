"""kcover's MTTR against the pod-error scenario's own timeline: the `kcover_recovery_mttr_seconds` histogram
the leader serves on /metrics holds one observation, and it equals the scenario's fault-to-running time
(first detection to all pods Running with new uids) within 250 ms: the two are seen by different watchers
(the controller's cache, the scenario's), so a loaded machine delays one against the other by a watch
delivery (120 ms seen on two busy cores); a wrong start or end point (the restart instead of the detection,
the deletes instead of the pods Running) is off by more."""

from __future__ import annotations

from prometheus_client import exposition
from prometheus_client.parser import text_string_to_metric_families

from kcover.sim import cluster, playing, scenarios

SIZE = cluster.Size(nodes=2, gpus_per_node=2, jobs=2, seed=7)


def _samples(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(name) and not sample.labels.get("le"):
                out[sample.name] = sample.value
    return out


async def test_mttr_on_metrics_matches_the_pod_error_timeline() -> None:
    async with cluster.SimCluster(SIZE) as c:
        run = playing.Run(c)
        await scenarios.pod_error(run)
        leader = c.leader()
        assert leader is not None
        text = exposition.generate_latest(leader.metrics.registry).decode()  # what /metrics serves
    assert all(check.ok for check in run.checks), [ch.text for ch in run.checks if not ch.ok]
    fault = run.faults[0]
    assert fault.detected_at is not None
    assert fault.recovered_at is not None
    timeline = (fault.recovered_at - fault.detected_at).total_seconds()
    got = _samples(text, "kcover_recovery_mttr_seconds")
    assert got["kcover_recovery_mttr_seconds_count"] == 1
    mttr = got["kcover_recovery_mttr_seconds_sum"]
    print(f"MTTR on /metrics {mttr * 1000:.1f} ms, scenario timeline {timeline * 1000:.1f} ms, "
          f"difference {abs(mttr - timeline) * 1000:.1f} ms")
    assert abs(mttr - timeline) <= 0.250, (mttr, timeline)
