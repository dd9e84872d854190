"""Every metric the docs name is on /metrics: a running controller and a running agent on the simulated
cluster, each serving its registry over real HTTP, scraped as Prometheus would.

The names come from the docs themselves (`kcover_...` in docs/*.md), so a doc that names a metric nobody
exports fails here. Plugins' docs (docs/plugins/) are left out: their metrics exist only where that
plugin is installed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kcover import metrics, serving, settings
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.kube import client
from kcover.nvml import fake

simserver = pytest.importorskip("kcover.sim.server")

DOCS = Path(__file__).parents[2] / "docs"
NAME = re.compile(r"\bkcover_[a-z0-9_]+")
NODE = "gpu-node-1"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def documented() -> dict[str, set[str]]:
    """Metric name (or `kcover_bus_`-style prefix) -> the docs naming it."""
    out: dict[str, set[str]] = {}
    for doc in sorted(DOCS.glob("*.md")):
        for name in NAME.findall(doc.read_text(encoding="utf-8")):
            out.setdefault(name, set()).add(doc.name)
    return out


def exported(text: str) -> set[str]:
    """Family and sample names of a scrape (a counter family `x` is rendered as `x_total`)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def present(name: str, names: set[str]) -> bool:
    if name.endswith("_"):  # a family of names (`kcover_bus_*`)
        return any(n.startswith(name) for n in names)
    return name in names or any(name.endswith(s) and name.removesuffix(s) in names for s in SUFFIXES)


async def scrape(server: serving.Server) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}/metrics") as r:
        assert r.status == 200
        return await r.text()


@pytest.fixture
async def scrapes() -> AsyncIterator[dict[str, str]]:
    """/metrics of a controller and an agent, both running against one simulated API server."""
    async with simserver.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": NODE}, "spec": {},
                                   "status": {"capacity": {"nvidia.com/gpu": "8"},
                                              "conditions": [{"type": "Ready", "status": "True"}]}})
        kubes = [client.from_configuration(srv.kube_configuration()) for _ in range(2)]
        controller_cfg = settings.layer(file_data={
            "lease": {"enabled": False},
            "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
            "recovery": {"save_logs": {"enabled": False}},
        }).settings
        agent_cfg = settings.layer(file_data={
            "agent": {"node_name": NODE},
            "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50}}, "dcgm": {"enabled": False}}},
        }).settings
        roles: dict[str, tuple[serving.Health, metrics.Metrics]] = {
            "controller": (serving.Health(), metrics.Metrics()), "agent": (serving.Health(), metrics.Metrics())}
        controller = controller_running.Controller(controller_cfg, client=kubes[0], metrics=roles["controller"][1],
                                                   health=roles["controller"][0])
        agent = agent_running.Agent(agent_cfg, client=kubes[1], metrics=roles["agent"][1], health=roles["agent"][0],
                                    node=NODE, nvml=fake.FakeNvml(2), reporter_tick_seconds=0.05)
        servers = {role: serving.Server(health, m, host="127.0.0.1", port=0) for role, (health, m) in roles.items()}
        stop = asyncio.Event()
        try:
            for server in servers.values():
                await server.start()
            tasks = [asyncio.create_task(controller.run(stop), name="controller"),
                     asyncio.create_task(agent.run(stop), name="agent")]
            async with asyncio.timeout(15):
                while not all(health.readiness()[0] for health, _ in roles.values()):  # noqa: ASYNC110 -- polled, as a kubelet probe would
                    await asyncio.sleep(0.05)
            yield {role: await scrape(server) for role, server in servers.items()}
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 15)
            for server in servers.values():
                await server.stop()
            for kube in kubes:
                await kube.close()


async def test_every_metric_the_docs_name_is_exported(scrapes: dict[str, str]) -> None:
    names = documented()
    assert "kcover_bus_dropped_total" in names, "the runbook's metrics were not found: is the regex right?"
    on_metrics = exported(scrapes["controller"]) | exported(scrapes["agent"])
    missing = {name: sorted(docs) for name, docs in names.items() if not present(name, on_metrics)}
    assert not missing, f"named in the docs but on neither role's /metrics: {missing}"


async def test_both_roles_export_their_bus(scrapes: dict[str, str]) -> None:
    for role, text in scrapes.items():
        names = exported(text)
        for name in ("kcover_bus_published_total", "kcover_bus_dropped_total", "kcover_bus_queue_depth"):
            assert present(name, names), f"{role}: {name}"
