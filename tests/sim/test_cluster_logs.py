"""The simulated cluster's logs say whose they are: every line a controller replica or an agent writes (and
the tasks it starts) carries `sim_component`, so a chaos run's logs can be read one replica at a time."""

from __future__ import annotations

import structlog

from kcover.sim import cluster as cluster_

SIZE = cluster_.Size(nodes=2, gpus_per_node=2, jobs=1, seed=3)


async def test_each_replicas_and_agents_lines_name_it() -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with cluster_.SimCluster(SIZE):
            pass

    def components(event: str) -> set[str]:
        return {str(e.get("sim_component")) for e in logs if e["event"] == event}

    replicas = {"kcover-controller-a", "kcover-controller-b"}
    assert components("controller_starting") == replicas
    assert components("cache_synced") == replicas, "a line of a task the replica started (its cache) names it too"
    assert components("agent_starting") == {"agent:gpu-node-0", "agent:gpu-node-1"}
