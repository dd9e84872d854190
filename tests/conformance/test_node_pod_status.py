"""Conformance: the not-ready taint admission puts on new Nodes, and pod status allocatedResourcesStatus rules.

Observed on kube-apiserver 1.36.3 (ResourceHealthStatus and ResourceHealthStatusMessage gates on):

* TaintNodesByCondition appends `node.kubernetes.io/not-ready:NoSchedule` to every Node created
  through the API, whatever its status says, unless a taint with that key and effect (any value) is
  there already. Updates never add it back.
* A `/status` write (PUT or PATCH) whose `containerStatuses[].allocatedResourcesStatus[].name` is
  not a resource of that container is 422 Invalid: `claim:<claim>` or `claim:<claim>/<request>` of
  its `resources.claims`, else a resource name of its requests (which default from limits).

The allocatedResourcesStatus tests first ask the server (`health_status`) and are skipped, saying why,
where it cannot hold what they check: no such field in its schema (before 1.31), a pod's DRA claims
dropped (the DynamicResourceAllocation gate off, as by default before 1.34), or the field dropped from
a status write (the ResourceHealthStatus gate off, as by default before 1.36).
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conformance_client import Api

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
CLAIM_MESSAGE = ("must match one of the container's resource claims in a format 'claim:<claimName>/<request>' "
                 "or 'claim:<claimName>' if request is empty")
REQUESTS_MESSAGE = "must match one of the container's resource requests"


@pytest.fixture
async def node_names(conformance_api: Api) -> AsyncIterator[list[str]]:
    """Names for test nodes (cluster-scoped, so unique per test), deleted afterwards."""
    names = [f"conf-node-{secrets.token_hex(3)}-{i}" for i in range(3)]
    yield names
    for name in names:
        await conformance_api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_node_create_adds_not_ready_taint(conformance_api: Api, node_names: list[str]) -> None:
    bare, tainted, ready = node_names
    got = await conformance_api.ok("POST", "/api/v1/nodes", body={"metadata": {"name": bare}})
    assert got["spec"]["taints"] == [NOT_READY]
    # appended after the node's own taints, even when its status already says Ready
    got = await conformance_api.ok("POST", "/api/v1/nodes", body={
        "metadata": {"name": ready}, "spec": {"taints": [{"key": "a", "effect": "NoExecute"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert got["spec"]["taints"] == [{"key": "a", "effect": "NoExecute"}, NOT_READY]
    # one with its key and effect (another value) is enough; the same key as NoExecute is not
    own = {"key": "node.kubernetes.io/not-ready", "value": "x", "effect": "NoSchedule"}
    got = await conformance_api.ok("POST", "/api/v1/nodes", body={"metadata": {"name": tainted},
                                                                   "spec": {"taints": [own]}})
    assert got["spec"]["taints"] == [own]
    # removed by a write, it stays removed (admission runs on create only)
    got = await conformance_api.ok("PATCH", f"/api/v1/nodes/{bare}", content_type=MERGE,
                                   body={"spec": {"taints": None}})
    assert not got["spec"].get("taints")
    got = await conformance_api.ok("PATCH", f"/api/v1/nodes/{bare}/status", content_type=SMP,
                                   body={"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not got["spec"].get("taints")
    assert not (await conformance_api.ok("GET", f"/api/v1/nodes/{bare}"))["spec"].get("taints")


async def test_node_create_not_ready_taint_with_generate_name_and_other_effect(
        conformance_api: Api, node_names: list[str]) -> None:
    got = await conformance_api.ok("POST", "/api/v1/nodes", body={
        "metadata": {"name": node_names[0]},
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}})
    assert got["spec"]["taints"] == [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}, NOT_READY]
    # an invalid taint is refused at its own index: the admitted one goes after it
    code, body = await conformance_api.request("POST", "/api/v1/nodes", body={
        "metadata": {"name": node_names[1]}, "spec": {"taints": [{"key": "a", "effect": "Bad"}]}})
    assert code == 422 and [(c["reason"], c["field"]) for c in body["details"]["causes"]] == [
        ("FieldValueNotSupported", "metadata.taints[0].effect")]


@pytest.fixture
async def pods(conformance_api: Api, ns: str) -> AsyncIterator[str]:
    """The pods path of `ns`, emptied afterwards: a real server without a namespace controller keeps a
    deleted namespace's pods, and their device health would reach later tests' cluster-wide watches."""
    path = f"/api/v1/namespaces/{ns}/pods"
    yield path
    await conformance_api.request("DELETE", path, query={"gracePeriodSeconds": 0})


@pytest.fixture
async def health_status(conformance_api: Api, pods: str) -> None:
    """Skip unless this server keeps DRA claims on a pod and `allocatedResourcesStatus` in its status."""
    server = await conformance_api.server_version()
    if "allocatedResourcesStatus" not in await conformance_api.schema_fields("io.k8s.api.core.v1.ContainerStatus"):
        pytest.skip(f"kube-apiserver {server}: core/v1 ContainerStatus has no allocatedResourcesStatus (KEP-4680)")
    created = await conformance_api.ok("POST", pods, body=_pod("probe"))
    try:
        if not created["spec"].get("resourceClaims"):
            pytest.skip(f"kube-apiserver {server} dropped the pod's spec.resourceClaims (its DynamicResourceAllocation "
                        f"feature gate is off): no DRA claim to name")
        got = await conformance_api.ok("PATCH", f"{pods}/probe/status", content_type=SMP, body={
            "status": {"containerStatuses": [_status("dp", "nvidia.com/gpu")]}})
        if not got["status"]["containerStatuses"][0].get("allocatedResourcesStatus"):
            pytest.skip(f"kube-apiserver {server} dropped allocatedResourcesStatus from a status write (its "
                        f"ResourceHealthStatus feature gate is off)")
    finally:
        await conformance_api.request("DELETE", f"{pods}/probe", query={"gracePeriodSeconds": 0})


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "rc-gpu"},
                           {"name": "multi", "resourceClaimName": "rc-multi"}],
        "initContainers": [{"name": "init", "image": "busybox",
                            "resources": {"limits": {"example.com/dev": "1"}}}],
        "containers": [
            {"name": "dra", "image": "busybox",
             "resources": {"claims": [{"name": "gpu"}, {"name": "multi", "request": "r1"}],
                           "requests": {"cpu": "100m"}}},
            {"name": "dp", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "plain", "image": "busybox"}]}}


def _status(container: str, *names: str, health: str = "Unhealthy") -> dict[str, Any]:
    return {"name": container, "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {}},
            "allocatedResourcesStatus": [{"name": n, "resources": [{"resourceID": "dev-0", "health": health}]}
                                         for n in names]}


def _invalid(field: str, value: str, message: str) -> tuple[str, str, str]:
    return ("FieldValueInvalid", field, f'Invalid value: "{value}": {message}')


def _causes(body: Any) -> list[tuple[str, str, str]]:
    return [(c["reason"], c["field"], c["message"]) for c in body["details"]["causes"]]


@pytest.mark.usefixtures("health_status")
@pytest.mark.parametrize(("container", "name"), [
    ("dra", "claim:gpu"), ("dra", "claim:multi/r1"), ("dra", "cpu"), ("dp", "nvidia.com/gpu"),
    ("ghost", "anything"),  # a status of no such container is not checked
])
async def test_allocated_resources_status_valid_names(conformance_api: Api, pods: str, container: str,
                                                      name: str) -> None:
    path = pods
    await conformance_api.ok("POST", path, body=_pod("p"))
    got = await conformance_api.ok("PATCH", f"{path}/p/status", content_type=SMP,
                                   body={"status": {"containerStatuses": [_status(container, name)]}})
    assert got["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["name"] == name


@pytest.mark.usefixtures("health_status")
@pytest.mark.parametrize(("container", "name", "message"), [
    ("dra", "claim:multi", CLAIM_MESSAGE),  # the claim has a request: it must be named
    ("dra", "claim:gpu/x", CLAIM_MESSAGE),
    ("dra", "claim:", CLAIM_MESSAGE),
    ("dp", "claim:gpu", CLAIM_MESSAGE),  # another container's claim
    ("dra", "nvidia.com/gpu", REQUESTS_MESSAGE),
    ("plain", "nvidia.com/gpu", REQUESTS_MESSAGE),
    ("dp", "", REQUESTS_MESSAGE),
])
@pytest.mark.parametrize("write", ["put", "merge", "strategic"])
async def test_allocated_resources_status_invalid_name(conformance_api: Api, pods: str, container: str,
                                                       name: str, message: str, write: str) -> None:
    path = pods
    await conformance_api.ok("POST", path, body=_pod("p"))
    statuses = [_status("plain"), _status(container, "cpu" if container == "dra" else "claim:multi/r1", name)]
    statuses[0].pop("allocatedResourcesStatus")
    if write == "put":
        pod = await conformance_api.ok("GET", f"{path}/p")
        pod["status"]["containerStatuses"] = statuses
        code, body = await conformance_api.request("PUT", f"{path}/p/status", body=pod)
    else:
        code, body = await conformance_api.request("PATCH", f"{path}/p/status", content_type=SMP if write == "strategic"
                                                   else MERGE, body={"status": {"containerStatuses": statuses}})
    field = "status.containerStatuses[1].allocatedResourcesStatus[1].name"
    if container != "dra":  # "claim:multi/r1" is foreign to dp and plain too
        assert _causes(body)[0] == _invalid("status.containerStatuses[1].allocatedResourcesStatus[0].name",
                                            "claim:multi/r1", CLAIM_MESSAGE)
    assert code == 422 and body["reason"] == "Invalid" and body["details"]["kind"] == "Pod"
    assert body["details"]["name"] == "p" and _causes(body)[-1] == _invalid(field, name, message)
    assert body["message"].startswith('Pod "p" is invalid: ')
    assert f'{field}: Invalid value: "{name}": {message}' in body["message"]
    stored = await conformance_api.ok("GET", f"{path}/p")
    assert not stored["status"].get("containerStatuses")


@pytest.mark.usefixtures("health_status")
async def test_allocated_resources_status_every_rule_at_once(conformance_api: Api, pods: str) -> None:
    path = pods
    await conformance_api.ok("POST", path, body=_pod("p"))
    pod = await conformance_api.ok("GET", f"{path}/p")
    dra = _status("dra", "bogus", "claim:x")
    dra["allocatedResourcesStatus"][0]["resources"] = [
        {"resourceID": "a", "health": "Bad"}, {"resourceID": "a", "health": "Healthy", "message": "é" * 513}]
    pod["status"].update(containerStatuses=[_status("ghost", "zz", health="Bad"), dra],
                         initContainerStatuses=[_status("init", "example.com/dev", "example.com/other"),
                                                _status("dra", "whatever")],
                         ephemeralContainerStatuses=[_status("debug", "x")])
    code, body = await conformance_api.request("PUT", f"{path}/p/status", body=pod)
    health = 'Unsupported value: "Bad": supported values: "Healthy", "Unhealthy", "Unknown"'
    cs = "status.containerStatuses"
    assert code == 422 and _causes(body) == [
        ("FieldValueNotSupported", f"{cs}[0].allocatedResourcesStatus[0].resources[0].health", health),
        _invalid(f"{cs}[1].allocatedResourcesStatus[0].name", "bogus", REQUESTS_MESSAGE),
        ("FieldValueNotSupported", f"{cs}[1].allocatedResourcesStatus[0].resources[0].health", health),
        ("FieldValueTooLong", f"{cs}[1].allocatedResourcesStatus[0].resources[1].message",
         "Too long: may not be more than 1024 bytes"),
        ("FieldValueDuplicate", f"{cs}[1].allocatedResourcesStatus[0].resources[1].resourceID",
         'Duplicate value: "a"'),
        _invalid(f"{cs}[1].allocatedResourcesStatus[1].name", "claim:x", CLAIM_MESSAGE),
        _invalid("status.initContainerStatuses[0].allocatedResourcesStatus[1].name", "example.com/other",
                 REQUESTS_MESSAGE),
        ("FieldValueForbidden", "status.ephemeralContainerStatuses[0].allocatedResourcesStatus",
         "Forbidden: must not be specified in container status"),
    ]
    assert body["message"].startswith('Pod "p" is invalid: [status.containerStatuses[0]')
