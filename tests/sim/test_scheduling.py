"""The simulated scheduler's filters and messages, and pod addresses, as pure functions (kube-scheduler 1.36's
rules: pkg/scheduler/framework/types.go FitError, plugins/noderesources/fit.go, the default preemption)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kcover.sim import addressing, scheduling


def node(name: str, gpus: int = 8, **spec: Any) -> dict[str, Any]:
    res = {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi", "pods": "3"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": spec,
            "status": {"allocatable": res, "addresses": [{"type": "InternalIP", "address": f"10.0.0.{len(name)}"}]}}


def pod(gpus: int = 0, *, node_name: str = "", cpu: str = "", phase: str = "Running", uid: str = "u",
        **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    requests = {"cpu": cpu} if cpu else {}
    return {"metadata": {"name": uid, "uid": uid},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": limits,
                                                                                         "requests": requests}}], **spec},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("text", "value"), [("500m", Decimal("0.5")), ("2Ti", Decimal(2) ** 41), ("8", Decimal(8)),
                                             ("1.5G", Decimal("1.5e9")), (4, Decimal(4)), ("bogus", Decimal(0))])
def test_quantities(text: Any, value: Decimal) -> None:
    assert scheduling.quantity(text) == value


def test_requests_default_to_limits_and_take_the_largest_init_container() -> None:
    p = pod(4, cpu="1")
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]
    p["spec"]["overhead"] = {"cpu": "250m"}
    assert scheduling.pod_requests(p) == {"nvidia.com/gpu": Decimal(4), "cpu": Decimal("3.25")}


def test_bound_pods_count_until_terminal() -> None:
    pods = [pod(4, node_name="a", uid="1"), pod(4, node_name="a", uid="2", phase="Succeeded"),
            pod(2, node_name="b", uid="3"), pod(1, uid="pending")]
    used = scheduling.usage(pods)
    assert used["a"].requested == {"nvidia.com/gpu": Decimal(4)}
    assert used["a"].pods == 1
    assert set(used) == {"a", "b"}


def test_the_first_failing_filter_per_node_and_the_fit_error() -> None:
    nodes = [node("cordoned", unschedulable=True), node("tainted", taints=[{"key": "x", "effect": "NoSchedule"}]),
             node("full"), node("small", gpus=2)]
    used = scheduling.usage([pod(8, node_name="full", uid="f")])
    verdict = scheduling.schedule(nodes, pod(4, uid="new"), used)
    assert verdict.feasible == ()
    # a request past a node's allocatable (small) is not helped by preemption; one past what is left (full) is
    assert verdict.message == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), 1 node(s) were unschedulable, "
        "2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/4 nodes are available: "
        "1 No preemption victims found for incoming pod, 3 Preemption is not helpful for scheduling.")


def test_tolerations_selectors_and_the_pod_count() -> None:
    tainted = node("t", taints=[{"key": "gpu", "value": "bad", "effect": "NoExecute"},
                                {"key": "soft", "effect": "PreferNoSchedule"}])
    assert not scheduling.filter_node(tainted, pod(), None).fits
    assert scheduling.filter_node(tainted, pod(tolerations=[{"key": "gpu", "operator": "Equal", "value": "bad"}]),
                                  None).fits
    assert not scheduling.filter_node(tainted, pod(tolerations=[{"key": "gpu", "effect": "NoSchedule",
                                                                 "operator": "Exists"}]), None).fits
    selected = pod(nodeSelector={"kubernetes.io/hostname": "other"})
    assert scheduling.filter_node(node("n"), selected, None).reasons == (scheduling.SELECTOR,)
    crowded = scheduling.usage([pod(node_name="n", uid=str(i)) for i in range(3)])
    assert scheduling.filter_node(node("n"), pod(), crowded["n"]).reasons == (scheduling.TOO_MANY_PODS,)


def test_a_node_with_room_is_feasible_in_the_given_order() -> None:
    nodes = [node("a"), node("b"), node("c")]
    used = scheduling.usage([pod(6, node_name="a", uid="1")])
    assert scheduling.schedule(nodes, pod(4, uid="new"), used).feasible == ("b", "c")
    assert scheduling.schedule(nodes, pod(2, uid="new"), used).feasible == ("a", "b", "c")


def test_addresses_come_from_the_nodes_pod_cidr_and_internal_ip() -> None:
    n = {**node("n"), "spec": {"podCIDR": "10.244.3.0/24"}}
    held = [{"spec": {"nodeName": "n"}, "status": {"podIP": "10.244.3.2", "phase": "Running"}},
            {"spec": {"nodeName": "n"}, "status": {"podIP": "10.244.3.3", "phase": "Failed"}},
            {"spec": {"nodeName": "other"}, "status": {"podIP": "10.244.3.4", "phase": "Running"}}]
    assert addressing.pod_ip(n, held) == "10.244.3.3"  # .1 is the bridge's, .2 held, a failed pod's is free
    assert addressing.host_ip(n) == "10.0.0.1"
    assert addressing.pod_ip(node("no-cidr"), []) == ""
    assert addressing.next_pod_cidr([{"spec": {"podCIDR": "10.244.0.0/24"}}, {"spec": {}}]) == "10.244.1.0/24"
