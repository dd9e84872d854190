"""Per-kind write rules as pure functions: node create admission and pod status validation.

The HTTP-visible behaviour is pinned against a real kube-apiserver by tests/conformance/
test_node_pod_status.py; these tables cover the rules' corners without a server.
"""

from __future__ import annotations

from typing import Any

import pytest

from kcover.sim import status, strategy

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


@pytest.mark.parametrize(("taints", "expected"), [
    (None, [NOT_READY]),
    ([], [NOT_READY]),
    ([{"key": "a", "effect": "NoExecute"}], [{"key": "a", "effect": "NoExecute"}, NOT_READY]),
    ([{**NOT_READY, "value": "v"}], [{**NOT_READY, "value": "v"}]),
    ([{"key": NOT_READY["key"], "effect": "NoExecute"}], [{"key": NOT_READY["key"], "effect": "NoExecute"}, NOT_READY]),
])
def test_not_ready_taint_added(taints: list[dict[str, Any]] | None, expected: list[dict[str, Any]]) -> None:
    body: dict[str, Any] = {"metadata": {"name": "n"}}
    if taints is not None:
        body["spec"] = {"taints": taints}
    assert strategy.not_ready_taint_added(body)["spec"]["taints"] == expected
    assert body.get("spec", {}).get("taints") == taints  # the argument is left alone


def pod(*statuses: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "i", "image": "x", "resources": {"limits": {"example.com/dev": "1"}}}],
        "containers": [
            {"name": "dra", "image": "x", "resources": {"claims": [{"name": "g"}, {"name": "m", "request": "r"}]}},
            {"name": "dp", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}}}]},
        "status": {"containerStatuses": list(statuses), "initContainerStatuses": list(init)}}


def cs(name: str, resource: str, *, health: str = "Healthy", rid: str = "d", message: str = "") -> dict[str, Any]:
    res: dict[str, Any] = {"resourceID": rid, "health": health}
    if message:
        res["message"] = message
    return {"name": name, "allocatedResourcesStatus": [{"name": resource, "resources": [res]}]}


FIELD = "status.containerStatuses[0].allocatedResourcesStatus[0]"


@pytest.mark.parametrize(("given", "expected"), [
    (pod(cs("dra", "claim:g")), []),
    (pod(cs("dra", "claim:m/r")), []),
    (pod(cs("dp", "nvidia.com/gpu")), []),  # from limits (a real server defaults requests from them)
    (pod(cs("dp", "cpu")), []),
    (pod(cs("nobody", "x")), []),
    (pod(init=(cs("i", "example.com/dev"),)), []),
    (pod(cs("dp", "cpu", message="m" * 1024)), []),
    (pod(cs("dra", "claim:m")), [("FieldValueInvalid", f"{FIELD}.name",
                                  f'Invalid value: "claim:m": {strategy.CLAIM_NAME_MESSAGE}')]),
    (pod(cs("dra", "claim:g/r")), [("FieldValueInvalid", f"{FIELD}.name",
                                    f'Invalid value: "claim:g/r": {strategy.CLAIM_NAME_MESSAGE}')]),
    (pod(cs("dra", "nvidia.com/gpu")), [("FieldValueInvalid", f"{FIELD}.name",
                                         f'Invalid value: "nvidia.com/gpu": {strategy.RESOURCE_NAME_MESSAGE}')]),
    (pod(init=(cs("dp", "anything"), cs("i", "nvidia.com/gpu"))), [
        ("FieldValueInvalid", "status.initContainerStatuses[1].allocatedResourcesStatus[0].name",
         f'Invalid value: "nvidia.com/gpu": {strategy.RESOURCE_NAME_MESSAGE}')]),
    (pod(cs("nobody", "x", health="")), [("FieldValueNotSupported", f"{FIELD}.resources[0].health",
                                         'Unsupported value: "": supported values: "Healthy", "Unhealthy", "Unknown"')]),
    (pod(cs("dp", "cpu", message="é" * 513)), [("FieldValueTooLong", f"{FIELD}.resources[0].message",
                                                "Too long: may not be more than 1024 bytes")]),
])
def test_pod_status_errors(given: dict[str, Any], expected: list[tuple[str, str, str]]) -> None:
    assert strategy.pod_status_errors(given) == expected


def test_duplicate_resource_ids_and_ephemeral_statuses() -> None:
    given = pod(cs("dp", "cpu"))
    given["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"].append(
        {"resourceID": "d", "health": "Unknown"})
    given["status"]["ephemeralContainerStatuses"] = [cs("debug", "x")]
    assert strategy.pod_status_errors(given) == [
        ("FieldValueDuplicate", f"{FIELD}.resources[1].resourceID", 'Duplicate value: "d"'),
        ("FieldValueForbidden", "status.ephemeralContainerStatuses[0].allocatedResourcesStatus",
         "Forbidden: must not be specified in container status")]


def test_check_pod_status_answers_invalid() -> None:
    with pytest.raises(status.ApiError) as refused:
        strategy.check_pod_status(pod(cs("dp", "claim:g"), cs("dra", "cpu")))
    body = refused.value.status_obj
    assert (body["code"], body["reason"], body["details"]["kind"]) == (422, "Invalid", "Pod")
    assert body["message"] == ('Pod "p" is invalid: [' + f'{FIELD}.name: Invalid value: "claim:g": '
                               f"{strategy.CLAIM_NAME_MESSAGE}, status.containerStatuses[1]."
                               'allocatedResourcesStatus[0].name: Invalid value: "cpu": '
                               f"{strategy.RESOURCE_NAME_MESSAGE}]")
    strategy.check_pod_status(pod(cs("dp", "nvidia.com/gpu")))
