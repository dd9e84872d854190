"""Conformance: what kcover's discovery (`kube.capabilities`) says a server serves is what that server does.

On the simulated server and on each kube-apiserver version the suite runs on (tests/backends.py,
KCOVER_K8S_VERSION), checked against the collections themselves, not against discovery documents: the
version kcover picks for an optional API answers a LIST, and each version kcover would prefer to it
answers 404; where kcover finds none, every version it knows answers 404. Whether `allocatedResourcesStatus`
exists is checked against strict field validation (a real server refuses a status write naming a field its
schema lacks with 400 and accepts one it has; the simulated server validates fields strictly for custom
resources alone).
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import pytest
from conformance_client import Api

from kcover.kube import capabilities
from kcover.kube import client as kubeclient

APIS = {capabilities.Capability.RESOURCE_SLICES: capabilities.RESOURCE_SLICES,
        capabilities.Capability.DEVICE_TAINT_RULES: capabilities.DEVICE_TAINT_RULES}


async def test_the_version_kcover_picks_is_served_and_every_one_it_prefers_is_not(conformance_api: Api) -> None:
    async with kubeclient.from_configuration(conformance_api.client.configuration) as kube:
        found = await capabilities.discover(kube)
    assert found.server or conformance_api.backend == "sim"
    for capability, api in APIS.items():
        assert found.served(capability) is not None, found.found[capability]
        picked = found.api_version(capability)
        versions = [f"{api.group}/{v}" for v in api.versions]
        preferred = versions[:versions.index(picked)] if picked else versions
        for version in preferred:
            code, body = await conformance_api.request("GET", api.path(version), query={"limit": 1})
            assert code == 404, (capability, version, code, body)
        if picked:
            code, body = await conformance_api.request("GET", api.path(picked), query={"limit": 1})
            assert code == 200 and body["kind"].endswith("List"), (capability, picked, code, body)


async def test_allocated_resources_status_is_what_strict_validation_knows(conformance_api: Api, ns: str) -> None:
    if conformance_api.backend == "sim":
        pytest.skip("the simulated server implements fieldValidation=Strict for custom resources alone")
    async with kubeclient.from_configuration(conformance_api.client.configuration) as kube:
        known = await capabilities.has_allocated_resources_status(kube)
    pods = f"/api/v1/namespaces/{ns}/pods"
    pod = await conformance_api.ok("POST", pods, body={"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"limits": {"example.com/dev": "1"}}}]}})
    pod["status"]["containerStatuses"] = [{
        "name": "c", "image": "busybox", "imageID": "", "ready": False, "restartCount": 0, "state": {"waiting": {}},
        "allocatedResourcesStatus": [{"name": "example.com/dev",
                                      "resources": [{"resourceID": "dev-0", "health": "Healthy"}]}]}]
    code, body = await conformance_api.request("PUT", f"{pods}/p/status", body=pod,
                                               query={"fieldValidation": "Strict"})
    if known:
        assert code == 200, body
    else:
        assert code == 400 and "allocatedResourcesStatus" in body["message"], (code, body)
