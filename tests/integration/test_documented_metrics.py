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

from kcover import layering, metrics, serving
from kcover.agent import running as agent_running
from kcover.controller import running as controller_running
from kcover.kube import client
from kcover.nvml import fake
from kcover.recovery import steps

simserver = pytest.importorskip("kcover.sim.server")

DOCS = Path(__file__).parents[2] / "docs"
NAME = re.compile(r"\bkcover_[a-z0-9_]+")
NODE = "gpu-node-1"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info")


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
        controller_cfg = layering.layer(file_data={
            "lease": {"enabled": False},
            "kube": {"workload_kinds": ["pytorchjobs.kubeflow.org"]},
            "recovery": {"save_logs": {"enabled": False}},
        }).settings
        agent_cfg = layering.layer(file_data={
            "agent": {"node_name": NODE},
            "detectors": {"entries": {"nvml": {"config": {"wait_timeout_ms": 50}}, "dcgm": {"enabled": False}}},
        }).settings
        roles: dict[str, tuple[serving.Health, metrics.Metrics]] = {
            role: (serving.Health(), metrics.Metrics(role=role)) for role in (metrics.CONTROLLER, metrics.AGENT)}
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
                     asyncio.create_task(agent.run(stop), name="agent"),
                     *(asyncio.create_task(health.heartbeat(stop), name=f"heartbeat:{role}")
                       for role, (health, _) in roles.items())]
            async with asyncio.timeout(15):
                while not all(health.readiness()[0] for health, _ in roles.values()):  # noqa: ASYNC110 -- polled, as a kubelet probe would
                    await asyncio.sleep(0.05)
                # the agent's first NVML poll, its condition in the controller's cache (written once NVML has run
                # detectors.settle_seconds) and both watchdogs' first look, as a scrape a while after start sees
                while not (roles["agent"][1].registry.get_sample_value("kcover_nvml_polls_total", {"result": "ok"})  # noqa: ASYNC110 -- polled, as a scrape would
                           and roles["controller"][1].registry.get_sample_value(
                               "kcover_agent_condition_missing_nodes") == 0
                           and all(health.watched for health, _ in roles.values())):
                    await asyncio.sleep(0.05)
            yield {role: await scrape(server) for role, server in servers.items()}
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 15)
            for server in servers.values():
                await server.stop()
            for kube in kubes:
                await kube.close()


BLIND_NODE = "gpu-node-blind"


@pytest.fixture
async def blind_scrape() -> AsyncIterator[str]:
    """/metrics of an agent on a GPU node that has no NVML (the fake's `init()` fails as the real adapter's does on a
    node without the driver) and no `dcgmi`, scraped over HTTP once the agent says it is blind."""
    async with simserver.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": BLIND_NODE}, "spec": {},
                                   "status": {"capacity": {"nvidia.com/gpu": "8"},
                                              "conditions": [{"type": "Ready", "status": "True"}]}})
        cfg = layering.layer(file_data={
            "agent": {"node_name": BLIND_NODE},
            "detectors": {"entries": {"dcgm": {"config": {"dcgmi_path": "/nonexistent/kcover-test/dcgmi"}}}},
        }).settings
        health, mets = serving.Health(), metrics.Metrics(role=metrics.AGENT)
        kube = client.from_configuration(srv.kube_configuration())
        agent = agent_running.Agent(cfg, client=kube, metrics=mets, health=health, node=BLIND_NODE,
                                    nvml=fake.FakeNvml(8, init_error="library_missing"), reporter_tick_seconds=0.05)
        server = serving.Server(health, mets, host="127.0.0.1", port=0)
        stop = asyncio.Event()
        await server.start()
        tasks = [asyncio.create_task(agent.run(stop), name="agent"),
                 asyncio.create_task(health.heartbeat(stop), name="heartbeat")]
        try:
            async with asyncio.timeout(15):
                while not (health.degraded() and health.watched):  # noqa: ASYNC110 -- polled, as a probe would
                    await asyncio.sleep(0.05)
            yield await scrape(server)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 15)
            await server.stop()
            await kube.close()


def queryable(text: str) -> set[str]:
    """Names a PromQL query can use: every sample name, a declared counter's `_total` name, and the family name
    of a histogram or summary (docs name those for all their series). A counter's family name is not one:
    Prometheus stores `x_total`."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if family.type in ("histogram", "summary"):
            names.add(family.name)
        if family.type == "counter":  # declared, with no labelled series yet
            names.add(family.name + "_total")
    return names


async def test_every_metric_the_docs_name_is_exported(scrapes: dict[str, str]) -> None:
    names = documented()
    assert "kcover_bus_dropped_total" in names, "the runbook's metrics were not found: is the regex right?"
    on_metrics = queryable(scrapes["controller"]) | queryable(scrapes["agent"])
    missing = {name: sorted(docs) for name, docs in names.items()
               if not (name in on_metrics or (name.endswith("_") and any(n.startswith(name) for n in on_metrics)))}
    assert not missing, f"named in the docs but no series of either role's /metrics is called so: {missing}"


async def test_both_roles_export_their_bus(scrapes: dict[str, str]) -> None:
    for role, text in scrapes.items():
        names = exported(text)
        for name in ("kcover_bus_published_total", "kcover_bus_dropped_total", "kcover_bus_queue_depth"):
            assert present(name, names), f"{role}: {name}"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value of a scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


CONTROLLER_ONLY = ("kcover_leader", "kcover_breaker_open", "kcover_fault_to_action_seconds_bucket", "kcover_actions_total",
                   "kcover_events_rejected_total", "kcover_device_taints_served", "kcover_gpu_nodes",
                   "kcover_recovery_stalled_total", "kcover_agent_condition_unknown_nodes")
AGENT_ONLY = ("kcover_nvml_polls_total", "kcover_dcgm_polls_total", "kcover_xid_classes_total",
              "kcover_health_check_age_seconds", "kcover_agent_blind")


async def test_each_role_exports_only_its_own_series(scrapes: dict[str, str]) -> None:
    controller, agent = exported(scrapes["controller"]), exported(scrapes["agent"])
    for name in CONTROLLER_ONLY:
        assert present(name, controller), name
        assert not present(name, agent), f"an agent exports the controller's {name}"
    for name in AGENT_ONLY:
        assert present(name, agent), name
        assert not present(name, controller), f"the controller exports the agent's {name}"


async def test_both_roles_export_build_info_and_process_metrics_and_no_created_series(scrapes: dict[str, str]) -> None:
    import kcover

    for role, text in scrapes.items():
        builds = [(dict(labels), v) for (name, labels), v in samples(text).items() if name == "kcover_build_info"]
        assert len(builds) == 1, role
        assert builds[0][0]["role"] == role
        assert builds[0][0]["version"] == kcover.__version__
        names = exported(text)
        for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                     "process_start_time_seconds", "python_info", "python_gc_collections_total"):
            assert name in names, f"{role}: {name}"
        created = sorted(n for n in names if n.endswith("_created"))
        assert created == [], f"{role} exports _created series: {created}"


async def test_labelled_counters_start_at_zero_for_their_known_values(scrapes: dict[str, str]) -> None:
    """A series born at 1 has no increase: an alert on `increase(...) > 0` would miss the first failure."""
    c, a = scrapes["controller"], scrapes["agent"]
    assert value(c, "kcover_actions_total", action="restart_workload", result="failed") == 0
    assert value(c, "kcover_actions_total", action="cordon_node", result="done") == 0
    assert value(c, "kcover_events_rejected_total", reason="untrusted_reporter") == 0
    assert value(c, "kcover_events_rejected_total", reason="bad_pods") == 0
    assert value(c, "kcover_recovery_stalled_total", cause="Unschedulable") == 0
    assert value(c, "kcover_recovery_records_failed_total", reason="api_error") == 0
    for detector in ("pod-status", "event-watcher", "node-condition"):
        assert value(c, "kcover_detector_restarts_total", detector=detector) == 0, detector
    assert value(a, "kcover_detector_restarts_total", detector="nvml") == 0
    assert value(a, "kcover_xid_classes_total", **{"class": "hardware"}) == 0
    assert value(a, "kcover_nvml_polls_total", result="failed") == 0
    assert value(a, "kcover_dcgm_polls_total", mode="health", result="failed") == 0
    assert value(c, "kcover_escalation_steps_total", ladder="workload", step="person") == 0
    assert value(c, "kcover_faults_given_up_total") == 0


def test_the_pre_initialised_action_labels_are_those_recovery_counts() -> None:
    """`kcover_actions_total` starts at 0 for action and result names the recovery steps really use: a name
    the steps never count would be a series that stays 0 while the real one is born at 1."""
    assert set(metrics.ACTIONS) <= set(steps.ACTION_NAMES), set(metrics.ACTIONS) - set(steps.ACTION_NAMES)
    assert set(metrics.ACTION_RESULTS) <= set(steps.RESULT_NAMES)


async def test_the_agent_reports_its_health_checks(scrapes: dict[str, str]) -> None:
    a = scrapes["agent"]
    assert (value(a, "kcover_nvml_polls_total", result="ok") or 0) >= 1
    age = value(a, "kcover_health_check_age_seconds", detector="nvml")
    assert age is not None
    assert 0 <= age < 15  # polled since the agent started, a moment ago
    # dcgm is disabled here: a detector that never ran has no age (it would read as ever older)
    assert value(a, "kcover_health_check_age_seconds", detector="dcgm") is None


async def test_the_idle_event_loop_lag_reads_near_zero(scrapes: dict[str, str]) -> None:
    """Both loops idle: the heartbeat's interval (1 s) is not lag; a lag near it is what a wrong measure reads."""
    for role, text in scrapes.items():
        lag = value(text, "kcover_event_loop_lag_seconds")
        assert lag is not None, role
        assert lag < 0.5, f"{role}: an idle loop reads {lag:.3f}s of lag"


async def test_a_blind_agent_says_so_and_a_seeing_one_does_not(blind_scrape: str, scrapes: dict[str, str]) -> None:
    assert value(blind_scrape, "kcover_agent_blind", node=BLIND_NODE) == 1
    assert value(scrapes["agent"], "kcover_agent_blind", node=NODE) == 0  # the series exists before it turns 1
    for detector in ("nvml", "dcgm"):
        assert value(blind_scrape, "kcover_detector_available", detector=detector) == 0, detector
    assert value(scrapes["controller"], "kcover_agent_condition_unknown_nodes") == 0
