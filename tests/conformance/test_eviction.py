"""Conformance: the Eviction API (policy/v1 `pods/{name}/eviction`) and PodDisruptionBudgets.

What a drain relies on, as kube-apiserver answers it (its eviction REST handler): an eviction of a running pod that no budget
covers deletes it (gracefully: the real backend runs no kubelet) after adding the `DisruptionTarget`
condition; a budget the disruption controller has not processed yet (`status.observedGeneration` behind
`metadata.generation`: no controller runs on either backend) or one that allows no disruption answers
429 `TooManyRequests` with a `DisruptionBudget` cause; a budget that allows one is decremented and
records the pod; a Pending pod is evicted whatever the budget says. The test writes the budget's status
itself, as the disruption controller would. The cause a budget with no disruption left gives is worded
differently by kube-apiserver 1.36 and by 1.29 to 1.33 (what kcover reads of it is the 429 and
the `DisruptionBudget` cause, never the text): either wording passes, any other fails.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

from typing import Any

from conformance_client import Api

VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
NONE_LEFT = ("The disruption budget budget does not allow evicting pods currently",  # 1.36 (and the sim)
             "The disruption budget budget needs 1 healthy pods and has 2 currently")  # 1.29 to 1.33


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "conf-node-none", "containers": [{"name": "main", "image": "busybox"}]}}


def _eviction(name: str, **delete_options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


async def _running(api: Api, ns: str, name: str) -> None:
    """What a kubelet writes for a started, ready pod."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    pod = await api.ok("GET", path)
    pod["status"] = {"phase": "Running", "conditions": [
        {"type": t, "status": "True"} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
    await api.ok("PUT", f"{path}/status", body=pod)


async def _budget(api: Api, ns: str, *, allowed: int | None, healthy: int = 1, desired: int = 1) -> dict[str, Any]:
    """A PodDisruptionBudget over app=train; `allowed` None leaves its status unprocessed."""
    path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    pdb = await api.ok("POST", path, body={"metadata": {"name": "budget"},
                                           "spec": {"minAvailable": desired,
                                                    "selector": {"matchLabels": {"app": "train"}}}})
    if allowed is None:
        return pdb
    pdb["status"] = {"observedGeneration": pdb["metadata"]["generation"], "disruptionsAllowed": allowed,
                     "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": healthy}
    return dict(await api.ok("PUT", f"{path}/budget/status", body=pdb))


async def test_eviction_without_a_budget_deletes_the_pod_with_a_disruption_condition(
        conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))
    await _running(conformance_api, ns, "p")
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 201 and body["kind"] == "Status" and body["status"] == "Success", (code, body)
    held = await conformance_api.ok("GET", f"{pods}/p")
    assert held["metadata"]["deletionTimestamp"]  # graceful: no kubelet finishes it
    cond = next(c for c in held["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert cond["status"] == "True" and cond["reason"] == "EvictionByEvictionAPI"


async def test_an_unprocessed_budget_refuses_with_429(conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))
    await _running(conformance_api, ns, "p")
    await _budget(conformance_api, ns, allowed=None)
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 429 and body["reason"] == "TooManyRequests" and body["message"] == VIOLATION, (code, body)
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message": "The disruption budget budget "
                                          "is still being processed by the server."}]
    assert body["details"]["retryAfterSeconds"] == 10
    assert not (await conformance_api.ok("GET", f"{pods}/p"))["metadata"].get("deletionTimestamp")


async def test_a_budget_that_allows_no_disruption_refuses_with_429(conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))
    await _running(conformance_api, ns, "p")
    await _budget(conformance_api, ns, allowed=0)
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 429 and body["reason"] == "TooManyRequests" and body["message"] == VIOLATION, (code, body)
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message": "The disruption budget budget "
                                          "needs 1 healthy pods and has 1 currently"}]
    assert not (await conformance_api.ok("GET", f"{pods}/p"))["metadata"].get("deletionTimestamp")


async def test_a_budget_that_allows_one_is_decremented_and_records_the_pod(conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    for name in ("p", "q"):
        await conformance_api.ok("POST", pods, body=_pod(name, app="train"))
        await _running(conformance_api, ns, name)
    await _budget(conformance_api, ns, allowed=1, healthy=2)
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 201, (code, body)
    pdb = await conformance_api.ok("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/budget")
    assert pdb["status"]["disruptionsAllowed"] == 0 and list(pdb["status"]["disruptedPods"]) == ["p"]
    code, body = await conformance_api.request("POST", f"{pods}/q/eviction", body=_eviction("q"))
    assert code == 429 and body["reason"] == "TooManyRequests" and body["message"] == VIOLATION, (code, body)
    assert [c["reason"] for c in body["details"]["causes"]] == ["DisruptionBudget"], body
    assert body["details"]["causes"][0]["message"] in NONE_LEFT[:1 if conformance_api.backend == "sim" else 2], body
    assert [(c["type"], c["status"], c["reason"]) for c in pdb["status"]["conditions"]] == [
        ("DisruptionAllowed", "False", "InsufficientPods")]


async def test_a_pending_pod_is_evicted_whatever_the_budget(conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))  # no kubelet: Pending
    await _budget(conformance_api, ns, allowed=0)
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 201, (code, body)
    assert (await conformance_api.ok("GET", f"{pods}/p"))["metadata"]["deletionTimestamp"]


async def test_eviction_refusals(conformance_api: Api, ns: str) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))
    await _running(conformance_api, ns, "p")
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("other"))
    assert code == 400 and body["message"] == "name in URL does not match name in Eviction object", (code, body)
    code, body = await conformance_api.request("POST", f"{pods}/gone/eviction", body=_eviction("gone"))
    assert code == 404 and body["reason"] == "NotFound" and body["details"]["kind"] == "pods", (code, body)
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction",
                                               body=_eviction("p", preconditions={"uid": "not-its-uid"}))
    assert code == 409 and body["reason"] == "Conflict", (code, body)
    assert not (await conformance_api.ok("GET", f"{pods}/p"))["metadata"].get("deletionTimestamp")


async def test_a_pod_two_budgets_select_is_refused_with_500_and_left_running(conformance_api: Api, ns: str) -> None:
    """What kcover's eviction reads as an answer, not a failure to retry (`gateway._eviction_answer`)."""
    pods = f"/api/v1/namespaces/{ns}/pods"
    await conformance_api.ok("POST", pods, body=_pod("p", app="train"))
    await _running(conformance_api, ns, "p")
    for name in ("one", "two"):
        await conformance_api.ok("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body={
            "metadata": {"name": name},
            "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "train"}}}})
    code, body = await conformance_api.request("POST", f"{pods}/p/eviction", body=_eviction("p"))
    assert code == 500 and body["kind"] == "Status", (code, body)
    assert "more than one PodDisruptionBudget" in body["message"], body
    assert not (await conformance_api.ok("GET", f"{pods}/p"))["metadata"].get("deletionTimestamp")
