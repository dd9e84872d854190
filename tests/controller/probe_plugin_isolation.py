"""Probe (not a test): a misbehaving third-party plugin beside the built-in pod detector, on the simulated cluster.

    python tests/controller/probe_plugin_isolation.py [flood|block ...]

`flood` publishes 1,000,000 events as fast as it can; `block` calls time.sleep(12) on its loop. Each is
installed as a real plugin (a distribution with an entry point in `kcover.detectors`) and enabled on both
controller replicas. While it misbehaves, a pod fault is injected; the probe prints how long the leader
took to detect it and to restart the job, whether the Lease changed hands, and the process's memory.
Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLUGIN = '''
import asyncio, time
from typing import ClassVar
from pydantic import BaseModel
from kcover import model
from kcover.detectors import contract

STATE = {"flooding": False, "flooded": 0, "sleeping": False}


class Cfg(BaseModel):
    events: int = 1_000_000
    block_seconds: float = 12.0


class Flooder:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = Cfg

    def __init__(self, name, config, context):
        self.name, self.config = name, config

    async def run(self, bus, stop):
        STATE["flooding"] = True
        for n in range(self.config.events):
            bus.publish_nowait(model.CollectorEvent(
                detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name="n"),
                severity=model.Severity.INFO, reason="Flood", message=str(n), dedupe_key=f"f{n}"))
            STATE["flooded"] = n + 1
        STATE["flooding"] = False
        await stop.wait()


class Sleeper:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = Cfg

    def __init__(self, name, config, context):
        self.config = config

    async def run(self, bus, stop):
        while not stop.is_set():
            STATE["sleeping"] = True
            time.sleep(self.config.block_seconds)
            STATE["sleeping"] = False
            await asyncio.sleep(0)
'''


def install(root: Path) -> None:
    (root / "kcover_probe_plugins.py").write_text(PLUGIN)
    info = root / "kcover_probe_plugins-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kcover-probe-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kcover.detectors]\nflooder = kcover_probe_plugins:Flooder\n"
                                           "sleeper = kcover_probe_plugins:Sleeper\n")
    sys.path.insert(0, str(root))


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def probe(mode: str) -> dict[str, Any]:
    import kcover_probe_plugins as plugins  # type: ignore[import-not-found]

    from kcover.sim import cluster as cluster_
    from kcover.sim import playing, scenarios

    name = "flooder" if mode == "flood" else "sleeper"
    overrides = {"detectors": {"entries": {name: {}}}}
    rss_before = rss_mib()
    async with cluster_.SimCluster(cluster_.Size(nodes=4, jobs=2), overrides=overrides) as c:
        leader = c.leader()
        assert leader is not None
        holders: set[str] = set()
        peak = [rss_mib()]
        watching = True

        async def watch() -> None:
            while watching:
                current = c.leader()
                if current is not None:
                    holders.add(current.identity)
                peak[0] = max(peak[0], rss_mib())
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch(), name="probe:lease")
        flag = "flooding" if mode == "flood" else "sleeping"
        while not plugins.STATE[flag]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # well into the misbehaviour
        job = c.jobs[0]
        pod = str(c.running_pods(job)[1]["metadata"]["name"])
        injected = time.perf_counter()
        started = scenarios.clock_.utcnow()
        during = plugins.STATE[flag]
        c.kubelets.fail_container(cluster_.NAMESPACE, pod, cluster_.CONTAINER, exit_code=1, reason="Error",
                                  message="probe")
        detected = await c.until(lambda: c.detection(
            lambda e: e.detector == "pod-status" and e.target.name == pod, started), 30, "detection")
        detect_s = time.perf_counter() - injected
        await c.until(lambda: c.api_event(lambda e: e.reason == playing.RESTARTED and e.name == job, started), 30,
                      "the restart")
        act_s = time.perf_counter() - injected
        await asyncio.sleep(1.0)
        watching = False
        await watcher
        flooded = plugins.STATE["flooded"]
        dropped = sum(r.metrics.registry.get_sample_value("kcover_detector_dropped_total",
                                                          {"detector": name, "reason": reason}) or 0
                      for r in c.replicas for reason in ("rate_limited", "queue_full", "closed"))
        return {"mode": mode, "misbehaving_at_injection": during, "detect_ms": round(detect_s * 1000, 1),
                "restart_event_ms": round(act_s * 1000, 1), "seen_by": detected.where,
                "lease_holders": sorted(holders), "lease_changed_hands": len(holders) > 1,
                "flood_events_published": flooded, "flood_events_dropped": int(dropped),
                "rss_mib_before": round(rss_before, 1), "rss_mib_peak": round(peak[0], 1)}


def main() -> None:
    modes = sys.argv[1:] or ["flood", "block"]
    with tempfile.TemporaryDirectory() as tmp:
        install(Path(tmp))
        for mode in modes:
            print(asyncio.run(probe(mode)), flush=True)


if __name__ == "__main__":
    main()
