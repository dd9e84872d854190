"""`kube.capabilities` without a server to ask: what it says and sets, and a server that does not answer.

What each real server serves is checked in tests/conformance/test_served_apis.py.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import socket

import structlog

from kcover import metrics
from kcover.kube import capabilities, retrying, transport
from kcover.kube import client as kubeclient

Capability = capabilities.Capability


def gauge(registry: metrics.Metrics) -> dict[Capability, float | None]:
    return {c: registry.registry.get_sample_value("kcover_api_capability", {"capability": c.value}) for c in Capability}


async def test_a_server_that_does_not_answer_leaves_every_capability_unknown() -> None:
    with socket.socket() as s:  # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with kubeclient.KubeClient(transport.Transport(f"http://127.0.0.1:{port}"), retry=retrying.NO_RETRY,
                                     request_timeout=2) as kube:
        found = await capabilities.discover(kube)
    assert {c: f.served for c, f in found.found.items()} == dict.fromkeys(Capability)
    assert all(f.error for f in found.found.values()) and found.server == ""
    assert found.unavailable() == []  # unknown is not "cannot": the cache and recovery ask again
    assert found.describe() == " ".join(f"{c.value}=unknown" for c in Capability)
    registry = metrics.Metrics()
    capabilities.say(found, registry)
    assert gauge(registry) == dict.fromkeys(Capability, -1.0)


def test_say_sets_the_gauge_and_names_what_kcover_cannot_do() -> None:
    found = capabilities.Capabilities(server="v1.32.13", found={
        Capability.RESOURCE_SLICES: capabilities.Found(True, "resource.k8s.io/v1beta1"),
        Capability.DEVICE_TAINT_RULES: capabilities.Found(False),
        Capability.ALLOCATED_RESOURCES_STATUS: capabilities.Found(False)})
    registry = metrics.Metrics()
    assert gauge(registry) == dict.fromkeys(Capability, -1.0)  # before kcover asked
    with structlog.testing.capture_logs() as logs:
        capabilities.say(found, registry)
    assert [e["event"] for e in logs] == ["api_capabilities"]
    line = logs[0]
    assert line["server"] == "v1.32.13" and line["resource_slices"] == "resource.k8s.io/v1beta1"
    assert line["device_taint_rules"] == "no" and line["allocated_resources_status"] == "no"
    assert line["cannot"] == [f"{c.value}: {capabilities.WITHOUT[c]}"
                              for c in (Capability.DEVICE_TAINT_RULES, Capability.ALLOCATED_RESOURCES_STATUS)]
    assert gauge(registry) == {Capability.RESOURCE_SLICES: 1.0, Capability.DEVICE_TAINT_RULES: 0.0,
                               Capability.ALLOCATED_RESOURCES_STATUS: 0.0}
    assert found.describe() == ("resource_slices=resource.k8s.io/v1beta1 device_taint_rules=no "
                                "allocated_resources_status=no")
    assert found.api_version(Capability.DEVICE_TAINT_RULES) == ""


def test_the_metric_labels_are_exactly_the_capabilities() -> None:
    assert tuple(c.value for c in Capability) == metrics.API_CAPABILITIES
    assert set(capabilities.WITHOUT) == set(Capability)


def test_each_role_starts_with_what_it_asks_about_at_minus_one() -> None:
    controller, agent = metrics.Metrics(role=metrics.CONTROLLER), metrics.Metrics(role=metrics.AGENT)
    assert gauge(controller) == dict.fromkeys(Capability, -1.0)
    assert gauge(agent) == {Capability.RESOURCE_SLICES: -1.0, Capability.DEVICE_TAINT_RULES: None,
                            Capability.ALLOCATED_RESOURCES_STATUS: None}
