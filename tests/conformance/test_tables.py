"""Conformance: server-side Table output (what `kubectl get` prints) for the built-in kinds kubectl users
touch here: the real server's column definitions (recorded in kcover/sim/recorded/table-columns.json)
and its cells for pods, nodes, events, namespaces, configmaps, Jobs and Leases.

The recording is of one Kubernetes minor (kcover/sim/recorded/VERSION); a server of another minor prints
its own columns (1.29's Jobs have no STATUS column, its descriptions differ), so there these tests are
skipped, saying so. kcover itself reads no Table."""

# ruff: noqa: PT018  (compound asserts read as one expectation about one answer)
from __future__ import annotations

import asyncio
import datetime as dt
import re
import secrets
from typing import Any

import orjson
import pytest
from conformance_client import Api, minor, recorded_version

from kcover.sim import printers

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
AGE = re.compile(r"^\d+s$")
MERGE = "application/merge-patch+json"


@pytest.fixture(autouse=True)
async def _recorded_here(conformance_api: Api) -> None:
    server = await conformance_api.server_version()
    if minor(server) != minor(recorded_version()):
        pytest.skip(f"the Table columns were recorded from kube-apiserver {recorded_version()}; "
                    f"{server} prints its own")


def ago(seconds: int) -> str:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def table_of(api: Api, path: str, key: str, **query: Any) -> list[list[Any]]:
    resp = await api.client.call_api(path, "GET", query_params=list(query.items()), header_params={"Accept": TABLE},
                                     auth_settings=["BearerToken"], _preload_content=False,
                                     _return_http_data_only=True)
    body = orjson.loads(await resp.read())
    resp.release()
    assert (body["kind"], body["apiVersion"]) == ("Table", "meta.k8s.io/v1"), body
    assert body["columnDefinitions"] == printers.recorded_columns()[key]
    assert all("object" in row and row["object"]["kind"] == "PartialObjectMetadata" for row in body["rows"])
    return [row["cells"] for row in body["rows"]]


async def test_pod_rows(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    containers = [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]
    await conformance_api.ok("POST", path, body={"metadata": {"name": "crashing"},
                                                 "spec": {"containers": containers}})
    await conformance_api.ok("POST", path, body={"metadata": {"name": "pending"},
                                                 "spec": {"containers": containers[:1],
                                                          "readinessGates": [{"conditionType": "x.io/ok"}]}})
    running = {"running": {"startedAt": ago(60)}}
    status = {"phase": "Running", "podIP": "10.1.2.3", "podIPs": [{"ip": "10.1.2.3"}],
              "conditions": [{"type": "Ready", "status": "False"}],
              "containerStatuses": [
                  {"name": "a", "image": "busybox", "imageID": "", "ready": True, "restartCount": 0,
                   "started": True, "state": running},
                  {"name": "b", "image": "busybox", "imageID": "", "ready": False, "restartCount": 3,
                   "started": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": ago(7260),
                                                "finishedAt": ago(7230)}}}]}
    await conformance_api.ok("PATCH", f"{path}/crashing/status", body={"status": status}, content_type=MERGE)
    rows = {r[0]: r for r in await table_of(conformance_api, path, "pods")}
    crashing, pending = rows["crashing"], rows["pending"]
    assert crashing[:4] == ["crashing", "1/2", "CrashLoopBackOff", "3 (120m ago)"] and AGE.match(crashing[4])
    assert crashing[5:] == ["10.1.2.3", "<none>", "<none>", "<none>"]
    assert pending[:4] == ["pending", "0/1", "Pending", "0"]
    assert pending[5:] == ["<none>", "<none>", "<none>", "0/1"]
    one = await table_of(conformance_api, f"{path}/pending", "pods")
    assert [r[:4] for r in one] == [["pending", "0/1", "Pending", "0"]]


async def test_node_rows(conformance_api: Api) -> None:
    name = "conf-node-" + secrets.token_hex(3)
    await conformance_api.ok("POST", "/api/v1/nodes", body={
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/gpu": "", "kubernetes.io/role": "worker"}},
        "spec": {"unschedulable": True}})
    try:
        status = {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                  "lastHeartbeatTime": ago(5), "lastTransitionTime": ago(5)}],
                  "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}],
                  "nodeInfo": {"kubeletVersion": "v1.36.3", "architecture": "amd64", "osImage": "Ubuntu",
                               "kernelVersion": "6.8.0", "containerRuntimeVersion": "containerd://2.1",
                               "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": "",
                               "operatingSystem": "linux"}}
        await conformance_api.ok("PATCH", f"/api/v1/nodes/{name}/status", body={"status": status},
                                 content_type=MERGE)
        rows = await table_of(conformance_api, "/api/v1/nodes", "nodes", fieldSelector=f"metadata.name={name}")
        assert len(rows) == 1 and AGE.match(rows[0][3])
        assert rows[0][:3] + rows[0][4:] == [name, "NotReady,SchedulingDisabled", "gpu,worker", "v1.36.3",
                                             "10.0.0.9", "<none>", "Ubuntu", "6.8.0 (amd64)", "containerd://2.1"]
    finally:
        await conformance_api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_event_rows(conformance_api: Api, ns: str) -> None:
    event = {"metadata": {"name": "e1"}, "type": "Warning", "reason": "BackOff", "message": "  back-off  \n",
             "count": 3, "firstTimestamp": ago(7230), "lastTimestamp": ago(7230),
             "source": {"component": "kubelet", "host": "n1"},
             "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p", "fieldPath": "spec.containers{b}"}}
    await conformance_api.ok("POST", f"/api/v1/namespaces/{ns}/events", body=event)
    expected = [["120m", "Warning", "BackOff", "pod/p", "spec.containers{b}", "kubelet, n1", "back-off", "120m", 3,
                 "e1"]]
    assert await table_of(conformance_api, f"/api/v1/namespaces/{ns}/events", "events") == expected
    assert await table_of(conformance_api, f"/apis/events.k8s.io/v1/namespaces/{ns}/events", "events") == expected


async def test_namespace_configmap_lease_and_job_rows(conformance_api: Api, ns: str) -> None:
    rows = await table_of(conformance_api, "/api/v1/namespaces", "namespaces", fieldSelector=f"metadata.name={ns}")
    assert rows[0][:2] == [ns, "Active"] and AGE.match(rows[0][2])
    await conformance_api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps",
                             body={"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
    rows = await table_of(conformance_api, f"/api/v1/namespaces/{ns}/configmaps", "configmaps")
    assert rows[0][:2] == ["c", 2]
    await conformance_api.ok("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                             body={"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}})
    rows = await table_of(conformance_api, f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                          "leases.coordination.k8s.io")
    assert rows[0][:2] == ["l", "me"]
    job = {"metadata": {"name": "j"}, "spec": {
        "completions": 2, "parallelism": 2, "manualSelector": True, "selector": {"matchLabels": {"app": "j"}},
        "template": {"metadata": {"labels": {"app": "j"}}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"},
                                                     {"name": "d", "image": "alpine"}]}}}}
    await conformance_api.ok("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body=job)
    rows = await table_of(conformance_api, f"/apis/batch/v1/namespaces/{ns}/jobs", "jobs.batch")
    assert rows[0][:4] == ["j", "Running", "0/2", ""] and rows[0][5:] == ["c,d", "busybox,alpine", "app=j"]


async def _table_watch(api: Api, path: str, query: dict[str, Any], until: int) -> list[Any]:
    resp = await api.client.call_api(path, "GET", query_params=[("watch", "true"), *query.items()],
                                     header_params={"Accept": TABLE}, auth_settings=["BearerToken"],
                                     _preload_content=False, _return_http_data_only=True, _request_timeout=20)
    assert resp.status == 200
    events = []
    try:
        async with asyncio.timeout(15):
            while len(events) < until:
                line = await resp.content.readline()
                if not line:
                    break
                event = orjson.loads(line)
                if event["type"] != "BOOKMARK":
                    events.append(event)
    finally:
        resp.close()
    return events


async def test_a_watch_answers_tables_with_the_columns_on_the_first_event_only(conformance_api: Api, ns: str) -> None:
    """`kubectl get -w` watches with the Table Accept header: each event's object is a Table of one row, the
    Table's resourceVersion the object's; only the first carries the column definitions."""
    path = f"/api/v1/namespaces/{ns}/configmaps"
    await conformance_api.ok("POST", path, body={"metadata": {"name": "watched"}, "data": {"a": "1"}})
    listed = await conformance_api.ok("GET", path)

    async def change() -> None:
        await asyncio.sleep(0.3)
        await conformance_api.ok("PATCH", f"{path}/watched", body={"data": {"b": "2"}}, content_type=MERGE)
        await conformance_api.ok("DELETE", f"{path}/watched")

    changing = asyncio.ensure_future(change())
    events = await _table_watch(conformance_api, path, {"resourceVersion": listed["metadata"]["resourceVersion"]}, 2)
    await changing
    initial = await _table_watch(conformance_api, path, {"timeoutSeconds": "2"}, 1)
    assert initial == []  # the object is gone: no synthetic ADDED
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    first, second = (e["object"] for e in events)
    assert (first["kind"], first["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert first["columnDefinitions"] == printers.recorded_columns()["configmaps"]
    assert second["columnDefinitions"] is None
    for table in (first, second):
        (row,) = table["rows"]
        assert row["object"]["kind"] == "PartialObjectMetadata"
        assert table["metadata"] == {"resourceVersion": row["object"]["metadata"]["resourceVersion"]}
        assert row["cells"][:2] == ["watched", 2] and AGE.match(row["cells"][2])
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


async def test_a_watch_from_the_start_lists_tables_then_changes(conformance_api: Api, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/pods"
    for name in ("p1", "p2"):
        await conformance_api.ok("POST", path, body={"metadata": {"name": name},
                                                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    events = await _table_watch(conformance_api, path, {"includeObject": "None"}, 2)
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert events[0]["object"]["columnDefinitions"] == printers.recorded_columns()["pods"]
    assert events[1]["object"]["columnDefinitions"] is None
    assert sorted(e["object"]["rows"][0]["cells"][0] for e in events) == ["p1", "p2"]
    assert all(e["object"]["rows"][0]["object"] is None for e in events)
