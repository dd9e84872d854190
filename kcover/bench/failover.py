"""Leader failover at fleet size: from killing the leader to the new leader's first action.

Owns one scenario: a namespace `kcover-bench-failover-<run>` holding a ledger grown to `ledger_units`
restart units (`ledgering.grow`: what a busy hour leaves; a new leader lists every one before it acts),
a 4-pod opted-in PyTorchJob on a node of its own, and two `kcover controller` processes (`footprint.role`:
the product CLI, its Lease and ledger in that namespace, the cluster's whole fleet in their caches). Once
both are ready and one holds the Lease, the bench kills the leader (SIGKILL: no release, the successor
waits out the Lease), writes a container failure to one of the job's pods at once, and times until every
pod of the job is being deleted (polled through the API every 20 ms). The target is the Lease duration
plus 5 s. It also reports when the survivor logged `lease_acquired`, its RSS, the units it loaded, and
the survivor's log from the kill to the action (`survivor_timeline`: where its time went).

It decides nothing; it reports. How it fails: a controller that does not get ready or lead, or a
restart that does not come within `timeout`, raises `errors.KcoverError` with the logs' tail.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import structlog

from kcover import errors
from kcover.bench import footprint, ledgering, objects, rawapi, reporting, seeding
from kcover.kube import client as client_
from kcover.kube import gateway

log = structlog.get_logger()

LEASE_DURATION_SECONDS = 15.0
"""The product default (`lease.lease_duration_seconds`), which the controllers keep."""
MARGIN_SECONDS = 5.0
"""The target: the new leader's first action within the Lease duration plus 5 s of the kill."""


def namespace_of(run_id: str) -> str:
    return f"kcover-bench-failover-{run_id}"


def _settings(ns: str, identity: str, log_dir: str, workload_kinds: Sequence[str]) -> list[str]:
    return ["lease.name=kcover-bench-failover", f"lease.namespace={ns}", f"lease.identity={identity}",
            f"kube.workload_kinds=[{','.join(workload_kinds)}]", f"recovery.ledger_namespace={ns}",
            "recovery.ledger_name=kcover-bench-failover", f"recovery.save_logs.directory={log_dir}",
            "recovery.save_logs.enabled=false",
            # the grown ledger's units all restarted within the hour: the breaker would trip on them
            *(f"recovery.{k}={v}" for k, v in objects.BREAKER_OFF.items()),
            "detectors.entries.dcgm.enabled=false"]


async def _holder(api: rawapi.RawApi, ns: str) -> str:
    try:
        lease = await api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/kcover-bench-failover")
    except errors.NotFoundError:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def _taken_away(api: rawapi.RawApi, job: seeding.Job, *, timeout: float) -> float:
    """perf_counter when every pod of the job was seen deleted or being deleted (polled)."""
    selector = f"{objects.JOB_NAME}={job.name}"
    async with asyncio.timeout(timeout):
        while True:
            listed = await api.request("GET", seeding.pods_path(job.namespace), query={"labelSelector": selector})
            items = listed.get("items") or []
            if all((p.get("metadata") or {}).get("deletionTimestamp") for p in items):
                return time.perf_counter()
            await asyncio.sleep(0.02)


async def measure(kubeconfig: str, controller_kubeconfig: str, *, run_id: str, ledger_units: int,
                  workload_kinds: Sequence[str], timeout: float = 600.0, job_kind: str = "PyTorchJob") -> dict[str, Any]:
    """See the module docstring; the report's `failover` section. `job_kind`: the Kubeflow kind of the job
    (on a cluster running the training operator, one it does not manage)."""
    ns = namespace_of(run_id)
    async with await rawapi.open_api(kubeconfig) as api, await client_.connect(kubeconfig) as kube:
        await seeding.namespaces(api, [ns])
        started = time.perf_counter()
        await ledgering.grow(gateway.Http(kube), ns, "kcover-bench-failover", 0, ledger_units)
        seeded = time.perf_counter() - started
        node = f"bench-failover-{run_id}"
        await seeding.nodes(api, [node])
        (job,) = await seeding.jobs(api, [(ns, "failover", 4)], node_names=[node], kind=job_kind)
        with tempfile.TemporaryDirectory(prefix="kcover-bench-failover-") as tmp:
            async with footprint.role("controller", controller_kubeconfig, _settings(ns, "bench-a", tmp, workload_kinds)) as a, \
                    footprint.role("controller", controller_kubeconfig, _settings(ns, "bench-b", tmp, workload_kinds)) as b:
                await a.ready(timeout=timeout)
                await b.ready(timeout=timeout)
                roles = {"bench-a": a, "bench-b": b}
                async with asyncio.timeout(timeout):
                    while (holder := await _holder(api, ns)) not in roles:  # noqa: ASYNC110  (polling the API)
                        await asyncio.sleep(0.1)
                leader, survivor = roles[holder], roles["bench-b" if holder == "bench-a" else "bench-a"]
                await leader.logged("lease_acquired", timeout=timeout)
                await asyncio.sleep(2 * footprint.SETTLE_SECONDS)
                rss = {"leader": leader.rss(), "follower": survivor.rss()}
                t0 = time.perf_counter()
                leader.proc.kill()
                await seeding.write_pod_status(api, ns, job.pods[1], objects.failed_status(1))
                acted = await _taken_away(api, job, timeout=timeout)
                led = await survivor.logged("lease_acquired", timeout=timeout)
                timeline = survivor.timeline(t0, acted)
    seconds = acted - t0
    target = LEASE_DURATION_SECONDS + MARGIN_SECONDS
    out = {"seconds": round(seconds, 3), "lease_acquired_seconds": round(led - t0, 3),
           "after_lease_acquired_seconds": round(acted - led, 3), "target_seconds": target,
           "ratio_to_target": reporting.ratio(seconds, target), "ledger_units": ledger_units,
           "ledger_seed_seconds": round(seeded, 1), "rss_mib": {k: round(v / 2**20, 1) for k, v in rss.items()},
           "survivor_timeline": timeline}
    log.info("bench_failover", **{k: v for k, v in out.items() if k not in ("rss_mib", "survivor_timeline")})
    return out


def markdown(sec: dict[str, Any]) -> str:
    return "\n".join([
        "## Leader failover", "",
        "| figure | measured | target | ratio |", "|---|---:|---:|---:|",
        f"| kill of the leader to the new leader's first action (s) | {sec['seconds']} | {sec['target_seconds']} | "
        f"{sec['ratio_to_target']} |",
        f"| kill to the survivor's lease_acquired (s) | {sec['lease_acquired_seconds']} | | |",
        f"| lease_acquired to the action (s; the ledger of {sec['ledger_units']} units loaded first) | "
        f"{sec['after_lease_acquired_seconds']} | | |",
        f"| RSS leader / follower before the kill (MiB) | {sec['rss_mib']['leader']} / {sec['rss_mib']['follower']} | | |",
        "", "The survivor's log from the kill to the action (seconds after the kill, the first line of each event): "
        + (", ".join(f"{at} {event}" for at, event in sec.get("survivor_timeline") or []) or "none"), ""])
