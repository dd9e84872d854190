"""`kube.gpus`: which nodes are GPU nodes, by capacity (names and globs) or by DRA ResourceSlices."""

from __future__ import annotations

import pytest
from harness import objects as o

from kcover import settings
from kcover.kube import caching, gpus, projecting


@pytest.mark.parametrize(("capacity", "gpu"), [
    ({"nvidia.com/gpu": "8"}, True),
    ({"nvidia.com/mig-1g.10gb": "7"}, True),
    ({"nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": "0"}, True),
    ({"amd.com/gpu": "8"}, True),
    ({"metax-tech.com/gpu": "8"}, True),
    ({"nvidia.com/gpu": "0"}, False),
    ({"example.com/fpga": "2"}, False),
    ({}, False),
])
def test_capacity_makes_a_gpu_node(capacity: dict[str, str], gpu: bool) -> None:
    assert gpus.DEFAULT.is_gpu_node(projecting.node(o.node("n", capacity=capacity))) is gpu


def test_the_node_projection_keeps_every_extended_resource_and_no_standard_one() -> None:
    node = projecting.node(o.node("n", capacity={"nvidia.com/mig-1g.10gb": "7", "hugepages-1Gi": "0", "memory": "1Ti",
                                                 "example.com/fpga": "0"}))
    assert node.extended_resources == (("nvidia.com/mig-1g.10gb", 7),)
    assert gpus.DEFAULT.gpu_capacity(node) == 7


def test_dra_slices_of_a_gpu_driver_make_a_gpu_node_and_others_do_not() -> None:
    cache = caching.ClusterCache.offline([
        o.node("dra", capacity={}), o.node("nic", capacity={}), o.node("cpu", capacity={}),
        o.node("labelled", capacity={}, labels={"nvidia.com/gpu.present": "true"}),
        o.resource_slice("dra-gpu", driver="gpu.nvidia.com", node="dra"),
        o.resource_slice("nic-net", driver="nic.example.com", node="nic"),
        o.resource_slice("gone-gpu", driver="gpu.amd.com", node="gone"),  # a node not in the cache
    ])
    assert {n for n, node in cache.nodes.items() if cache.is_gpu_node(node)} == {"dra"}
    assert cache.gpu_node_count() == 1
    cache.load([o.node("dra", capacity={}), o.node("nic", capacity={})])  # the slice went away
    assert cache.gpu_node_count() == 0


def test_the_rule_comes_from_settings() -> None:
    kube = settings.KubeSettings(gpu_resources=["example.com/gpu-*"], gpu_dra_drivers=[])
    rule = gpus.GpuRule.of(kube.gpu_resources, kube.gpu_dra_drivers)
    assert rule.is_gpu_node(projecting.node(o.node("n", capacity={"example.com/gpu-a100": "1"})))
    assert not rule.is_gpu_node(projecting.node(o.node("n")))  # nvidia.com/gpu no longer counts
    assert not rule.is_gpu_node(projecting.node(o.node("n", capacity={})), ["gpu.nvidia.com"])
    assert rule == gpus.GpuRule(("example.com/gpu-*",), frozenset())
    assert settings.KubeSettings().gpu_resources == list(gpus.DEFAULT_RESOURCES)
    assert sorted(settings.KubeSettings().gpu_dra_drivers) == sorted(gpus.DEFAULT_DRA_DRIVERS)
    no_dra = caching.ClusterCache.offline(gpu_rule=rule)
    assert not any(r.name == "resourceslices" for r in no_dra.reflectors)  # nothing watched without drivers
