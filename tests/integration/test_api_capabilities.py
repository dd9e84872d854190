"""kcover on whatever API server it meets: the controller cache and the roles' start, on every backend.

On the simulated server and each kube-apiserver version the suite runs on (KCOVER_K8S_VERSION), asked of
the server itself: where it serves DRA ResourceSlices, the cache reads them in the version it serves;
where it serves none (Kubernetes before 1.34 without runtime-config), the cache is synced all the same,
without one request for them (a collection served later: tests/kube/test_watching.py). The roles' announcement (`wiring.announce_capabilities`) keeps readiness
passing and names what the server serves.
"""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import asyncio

from backends import Cluster

from kcover import errors, metrics, serving, wiring
from kcover.kube import caching, capabilities, gpus, watching

FAST = watching.ReflectorOptions(backoff_initial_seconds=0.05, backoff_max_seconds=0.2, missing_retry_seconds=30)


async def served_slices(cluster: Cluster) -> str:
    """The most preferred `resource.k8s.io` version kcover reads whose discovery lists resourceslices, asked
    of the server directly (not through `kube.capabilities`), or ""."""
    try:
        group = await cluster.harness.kube.request("GET", "/apis/resource.k8s.io")
    except errors.NotFoundError:  # the group is not served at all
        return ""
    offered = {v["version"] for v in group["versions"]}
    for version in capabilities.RESOURCE_SLICES.versions:
        if version in offered:
            listing = await cluster.harness.kube.request("GET", f"/apis/resource.k8s.io/{version}")
            if any(r["name"] == "resourceslices" for r in listing["resources"]):
                return f"resource.k8s.io/{version}"
    return ""


async def test_the_cache_syncs_and_reads_resource_slices_only_where_served(cluster: Cluster) -> None:
    served = await served_slices(cluster)
    kube = cluster.new_client()
    cache = caching.ClusterCache(kube, workload_kinds=(), watch_events=False, options=FAST,
                                 gpu_rule=gpus.GpuRule.of(gpus.DEFAULT_RESOURCES, ["gpu.nvidia.com"]))
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(cache.run(stop), name="cache")
            try:
                assert await asyncio.wait_for(cache.wait_synced(), 20)
                slices = next(r for r in cache.reflectors if r.name == "resourceslices")
                if served:
                    assert slices.path == capabilities.RESOURCE_SLICES.path(served) and not slices.unserved
                    assert kube.request_counts["LIST resourceslices"] >= 1
                else:
                    assert slices.unserved and slices.store == {}
                    assert kube.request_counts["LIST resourceslices"] == 0
                    assert kube.request_counts["WATCH resourceslices"] == 0
            finally:
                stop.set()
    finally:
        await kube.close()


async def test_the_roles_announce_what_the_server_serves_and_stay_ready(cluster: Cluster) -> None:
    health, registry = serving.Health(), metrics.Metrics()
    await wiring.announce_capabilities(cluster.client, registry, health)
    ready, checks = health.readiness()
    found = await capabilities.discover(cluster.client)
    assert ready and checks == {"api": f"ok: {found.describe()}"}
    assert found.api_version(capabilities.Capability.RESOURCE_SLICES) == await served_slices(cluster)
    for capability in capabilities.Capability:
        served = found.served(capability)
        assert served is not None, found.found[capability]
        assert registry.registry.get_sample_value("kcover_api_capability", {"capability": capability.value}) == served
