"""kcover's CRDs missing are a state, not a crash: a real `kcover controller` process on every cluster backend.

The LedgerEntry and Recovery CRDs are deleted before the controller starts (on the simulated server its
paths answer 404, as kube-apiserver's do once a CRD is gone). The controller runs, leads, says so (its
/readyz fails on `ledger`, `kcover_ledger_available` is 0, a `KcoverLedgerUnavailable` Event) and
restarts nothing for a container that fails; once the LedgerEntry CRD is back it restarts the job once,
and says that Recovery resources are not served while it goes on (`records` on /readyz, the
`not_served` count, a `KcoverRecordsUnavailable` Event). Then the LedgerEntry CRD is deleted under the
running controller: the next fault is not acted on until the CRD returns, and then once. A node fault
likewise cordons nothing without the ledger, at start and under a running controller, and once after. The
process never exits on its own. Real time; every wait polls what the API server or the process says.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from harness import ports
from test_outages import CONTAINER, Cluster, _events, _job, _pods, _until

from kcover import errors

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "tests" / "controlplane" / "crds"
LEDGER = ("ledgerentries.kcover.io", "kcover-ledgerentries.yaml")
RECORDS = ("recoveries.kcover.io", "kcover-recoveries.yaml")
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SETTLE = 4.0


async def _unserve(cluster: Cluster, crd: tuple[str, str]) -> None:
    name = crd[0]
    if cluster.sim is not None:
        cluster.sim.delete_crd(name)
        return
    with contextlib.suppress(errors.NotFoundError):
        await cluster.client.request("DELETE", f"{CRD_PATH}/{name}")

    async def gone() -> bool:
        try:
            await cluster.client.request("GET", f"{CRD_PATH}/{name}")
        except errors.NotFoundError:
            return True
        return False
    await _until(gone, f"CRD {name} to be deleted", within=60.0)


async def _serve(cluster: Cluster, crd: tuple[str, str]) -> None:
    name = crd[0]
    if cluster.sim is not None:
        cluster.sim.create_crd(name)
        return
    with contextlib.suppress(errors.ConflictError):
        await cluster.client.request("POST", CRD_PATH, body=yaml.safe_load((CRDS / crd[1]).read_text()))

    async def established() -> bool:
        got = await cluster.client.request("GET", f"{CRD_PATH}/{name}")
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (got.get("status") or {}).get("conditions") or [])
    await _until(established, f"CRD {name} to be established", within=60.0)


@contextlib.asynccontextmanager
async def _kcover_controller(cluster: Cluster, tmp_path: Path, *extra: str
                             ) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    ns = cluster.namespace
    sets = [*extra, f"recovery.ledger_namespace={ns}", f"lease.namespace={ns}", "recovery.namespaces_deny=[]",
            "recovery.save_logs.enabled=false", "recovery.workload_cooldown_seconds=1",
            "lease.lease_duration_seconds=2", "lease.renew_deadline_seconds=1.5", "lease.retry_period_seconds=0.2",
            "kube.workload_kinds=[pytorchjobs.kubeflow.org]", "kube.gc_freeze_after_sync=false",
            "detectors.entries.nvml.enabled=false", "detectors.entries.dcgm.enabled=false",
            "server.shutdown_grace_seconds=5"]
    (tmp_path / "config.yaml").write_text("{}\n")
    log = open(tmp_path / "controller.log", "wb")  # noqa: SIM115, ASYNC230  (the child's log, closed after it)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcover.cli", "controller", "--kubeconfig", cluster.kubeconfig_path, "--port", "0",
        "--identity", "replica-a", "--config", str(tmp_path / "config.yaml"), "--log-format", "json",
        *[arg for s in sets for arg in ("--set", s)], cwd=ROOT, stdout=log, stderr=log)
    try:
        yield proc, f"http://127.0.0.1:{await ports.wait_bound_port(tmp_path / 'controller.log', proc)}"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def _get(url: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


def _sample(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_without_its_crds_kcover_acts_on_nothing_says_so_and_acts_once_they_are_back(
        cluster: Cluster, tmp_path: Path) -> None:
    job = await _job(cluster, f"crd-{secrets.token_hex(3)}")
    uid = job["metadata"]["uid"]

    async def restarts() -> list[dict[str, Any]]:
        return [e for e in await _events(cluster, "KcoverRestartedWorkload") if e["involvedObject"].get("uid") == uid]

    async def fail_worker() -> set[str]:
        async def running() -> list[dict[str, Any]]:
            pods = await _pods(cluster)
            if len(pods) != 2 or any(p["metadata"].get("deletionTimestamp") for p in pods):
                return []  # the operator has not recreated both yet
            for pod in pods:  # the kubelet's part: the recreated workers start
                if (pod.get("status") or {}).get("phase") != "Running":
                    await cluster.harness.run_pod(cluster.namespace, pod["metadata"]["name"])
            return pods
        pods = await _until(running, "the job's two workers running")
        await cluster.harness.fail_container(cluster.namespace, "train-worker-1", CONTAINER,
                                             message="worker exited (exitcode: 1)")
        return {p["metadata"]["uid"] for p in pods}

    await _unserve(cluster, LEDGER)
    await _unserve(cluster, RECORDS)
    try:
        async with cluster.harness.playing(), _kcover_controller(cluster, tmp_path) as (proc, url):
            async def ledger_failing() -> bool:
                status, body = await _get(url + "/readyz")
                return status == 503 and "[-] ledger failing" in body
            await _until(ledger_failing, "/readyz to fail on the ledger", within=60.0)
            _, metrics = await _get(url + "/metrics")
            unavailable = _sample(metrics, "kcover_ledger_available")
            await fail_worker()
            await asyncio.sleep(SETTLE)  # room for a wrongful restart to show
            while_missing = await restarts()
            said = await _events(cluster, "KcoverLedgerUnavailable")

            await _serve(cluster, LEDGER)
            await _until(restarts, "the job restarted once its ledger is back")

            async def ledger_ready() -> str:
                status, body = await _get(url + "/readyz")
                return body if status == 200 else ""
            ready = await _until(ledger_ready, "/readyz to pass again")

            async def records_said() -> list[dict[str, Any]]:
                return await _events(cluster, "KcoverRecordsUnavailable")
            await _until(records_said, "KcoverRecordsUnavailable")
            _, metrics = await _get(url + "/metrics")
            available = _sample(metrics, "kcover_ledger_available")
            not_served = _sample(metrics, 'kcover_recovery_records_failed_total{reason="not_served"}')
            back = await _events(cluster, "KcoverLedgerAvailable")
            await _serve(cluster, RECORDS)

            # the ledger's CRD deleted under the running controller
            await _unserve(cluster, LEDGER)
            started = time.monotonic()
            await fail_worker()
            await _until(ledger_failing, "/readyz to fail on the ledger again")
            await asyncio.sleep(SETTLE)
            while_deleted = await restarts()
            restored = time.monotonic()
            await _serve(cluster, LEDGER)

            async def second() -> bool:
                return len(await restarts()) >= 2
            await _until(second, "the second fault acted on once the ledger is back")
            acted = time.monotonic()
            await asyncio.sleep(SETTLE)  # room for a duplicate to show
            done = await restarts()
            alive = proc.returncode is None
    finally:
        await _serve(cluster, LEDGER)
        await _serve(cluster, RECORDS)
    log = (tmp_path / "controller.log").read_text(errors="replace")
    assert alive, f"the controller exited: {log[-3000:]}"
    assert unavailable == 0
    assert while_missing == [], "nothing restarted without the ledger"
    assert said, "KcoverLedgerUnavailable"
    assert "[+] ledger ok" in ready
    assert "[+] records ok: Recovery resources (kcover.io/v1alpha1) are not served" in ready
    assert available == 1
    assert not_served is not None
    assert not_served >= 1
    assert back, "KcoverLedgerAvailable"
    assert len(while_deleted) == 1, "the fault under a deleted CRD was not acted on while it was gone"
    assert len(done) == 2, [e["message"] for e in done]
    print(f"the fault under a deleted LedgerEntry CRD: the CRD was back {restored - started:.1f} s after it, "
          f"the job restarted {acted - started:.1f} s after it")


async def _gpu_node(cluster: Cluster, name: str) -> None:
    await cluster.client.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                                "metadata": {"name": name}})
    node = await cluster.client.request("GET", f"/api/v1/nodes/{name}")
    resources = {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]}
    await cluster.client.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


async def test_without_the_ledger_crd_a_node_fault_cordons_nothing_until_it_is_back_and_then_once(
        cluster: Cluster, tmp_path: Path) -> None:
    """A node fault while the LedgerEntry CRD is not served writes no Node (a cordon without its ledger entry
    would have no cooldown and no window count); once the CRD is back, the fault is acted on, once. Both
    with the CRD missing at the controller's start (the ledger never loads) and deleted under the running
    controller (the loaded ledger's cordon guard, `Ledger.confirm_served`, finds it gone)."""
    nodes = [f"crd-gpu-{secrets.token_hex(3)}" for _ in range(2)]
    for name in nodes:
        await _gpu_node(cluster, name)

    async def node_now(name: str) -> dict[str, Any]:
        return dict(await cluster.client.request("GET", f"/api/v1/nodes/{name}"))

    async def cordon_events(name: str) -> list[dict[str, Any]]:
        listed = await cluster.client.request("GET", "/api/v1/events")
        return [e for e in listed.get("items") or [] if e.get("reason") == "KcoverCordonedNode"
                and e["involvedObject"].get("name") == name]

    async def xid(name: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "KcoverGPUHealthy", "status": "False", "reason": "XID79", "message": "XID 79 on GPU 0",
                "lastTransitionTime": now, "lastHeartbeatTime": now}
        await cluster.client.request("PATCH", f"/api/v1/nodes/{name}/status", body={"status": {"conditions": [cond]}},
                                     content_type="application/strategic-merge-patch+json")

    seen: dict[str, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]] = {}
    await _unserve(cluster, LEDGER)
    try:
        async with _kcover_controller(cluster, tmp_path, "detectors.entries.node-condition.config.min_duration_seconds=0",
                                      "recovery.max_cordoned_fraction=1.0", "recovery.max_cordons_per_window=10",
                                      "recovery.max_cordons_per_window_fraction=1.0") as (proc, url):
            async def ledger_failing() -> bool:
                status, body = await _get(url + "/readyz")
                return status == 503 and "[-] ledger failing" in body

            async def ledger_ok() -> bool:
                status, _ = await _get(url + "/readyz")
                return status == 200

            for phase, name in zip(("at start", "deleted"), nodes, strict=True):
                if phase == "deleted":
                    await _until(ledger_ok, "/readyz to pass with the ledger served", within=60.0)
                    await _unserve(cluster, LEDGER)
                else:
                    await _until(ledger_failing, "/readyz to fail on the ledger", within=60.0)
                await xid(name)
                await _until(ledger_failing, f"/readyz to fail on the ledger ({phase})", within=60.0)
                await asyncio.sleep(SETTLE)  # room for a wrongful cordon to show
                missing, events_missing = await node_now(name), await cordon_events(name)
                await _serve(cluster, LEDGER)

                async def cordoned(name: str = name) -> bool:
                    return bool((await node_now(name)).get("spec", {}).get("unschedulable"))
                await _until(cordoned, f"the node cordoned once the ledger is back ({phase})", within=60.0)
                await asyncio.sleep(SETTLE)  # room for a second cordon Event to show
                seen[phase] = (missing, events_missing, await cordon_events(name))
            alive = proc.returncode is None
    finally:
        await _serve(cluster, LEDGER)
    log = (tmp_path / "controller.log").read_text(errors="replace")
    assert alive, f"the controller exited: {log[-3000:]}"
    for phase, (missing, events_missing, events_back) in seen.items():
        spec = missing.get("spec", {})
        assert not spec.get("unschedulable"), f"cordoned without the ledger ({phase})"
        assert not any(t.get("key") == "kcover.io/unhealthy" for t in spec.get("taints") or []), phase
        assert events_missing == [], phase
        assert len(events_back) == 1, (phase, [e.get("message") for e in events_back])
    assert set(seen) == {"at start", "deleted"}
