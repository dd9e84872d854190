"""Saving logs against a real HTTP API server (the simulated cluster): what ends up in the sink."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kcover import settings
from kcover.kube import client as client_
from kcover.recovery import logsaving
from kcover.sim import server as simserver

NS = "team-a"
NOW = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Ref:
    kind: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PodName:
    namespace: str
    name: str


JOB = Ref("PyTorchJob", NS, "llama", "8d1e0c55-aaaa-bbbb-cccc-000000000001")


@pytest.fixture
async def cluster() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer() as srv:
        yield srv


@pytest.fixture
async def kube(cluster: simserver.SimServer) -> AsyncIterator[client_.KubeClient]:
    async with client_.from_configuration(cluster.kube_configuration()) as kube:
        await kube.request("POST", "/api/v1/namespaces",
                           body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield kube


async def _pod(kube: client_.KubeClient, name: str, containers: list[str], init: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": c, "image": "trainer"} for c in containers],
                     "initContainers": [{"name": c, "image": "init"} for c in init]}}
    pod: dict[str, Any] = await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    return pod


def _policy(tmp_path: Path, **overrides: Any) -> settings.SaveLogsSettings:
    return settings.SaveLogsSettings(directory=str(tmp_path), **overrides)


async def test_current_and_previous_logs_are_saved_with_an_index(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    worker0 = await _pod(kube, "llama-worker-0", ["trainer", "sidecar"], init=["setup"])
    worker1 = await _pod(kube, "llama-worker-1", ["trainer"])
    cluster.append_log(NS, "llama-worker-0", "setup", "downloading dataset\n")
    cluster.append_log(NS, "llama-worker-0", "trainer", "step 1\nstep 2\nNCCL error: unhandled system error\n")
    cluster.terminate_container_instance(NS, "llama-worker-0", "trainer")
    cluster.append_log(NS, "llama-worker-0", "trainer", "step 1 (restarted)\n")
    cluster.append_log(NS, "llama-worker-1", "trainer", "waiting for rank 0\n")

    result = await logsaving.save(kube, JOB, [worker0, worker1], settings=_policy(tmp_path), now=NOW)

    assert result.error is None
    assert result.path == str(tmp_path / "20260304T050607Z-team-a-pytorchjob-llama-8d1e0c55")
    folder = Path(result.path)
    assert (folder / "llama-worker-0" / "trainer.previous.log").read_text() == (
        "step 1\nstep 2\nNCCL error: unhandled system error\n")
    assert (folder / "llama-worker-0" / "trainer.log").read_text() == "step 1 (restarted)\n"
    assert (folder / "llama-worker-0" / "setup.log").read_text() == "downloading dataset\n"
    assert (folder / "llama-worker-1" / "trainer.log").read_text() == "waiting for rank 0\n"
    assert not (folder / "llama-worker-1" / "trainer.previous.log").exists()  # 400: no terminated instance
    index = json.loads((folder / "index.json").read_text())
    assert index["workload"]["uid"] == JOB.uid
    assert index["complete"] is True
    assert index["errors"] == []
    assert [p["name"] for p in index["pods"]] == ["llama-worker-0", "llama-worker-1"]
    assert index["pods"][0]["containers"] == ["setup", "trainer", "sidecar"]
    assert {f["path"] for f in index["files"]} == {
        "llama-worker-0/setup.log", "llama-worker-0/trainer.log", "llama-worker-0/trainer.previous.log",
        "llama-worker-0/sidecar.log", "llama-worker-1/trainer.log"}
    assert result.files == 5
    assert result.bytes == sum(f["bytes"] for f in index["files"]) == index["bytes"]


def _stopped_first(pod: dict[str, Any], finished: dt.datetime, policy: str = "OnFailure") -> dict[str, Any]:
    """`pod` as a status read just after its trainer's first instance stopped (not restarted yet)."""
    stamp = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**pod, "spec": {**pod["spec"], "restartPolicy": policy},
            "status": {"containerStatuses": [{"name": "trainer", "restartCount": 0, "state": {
                "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": stamp}}}]}}


def _log_reads(cluster: simserver.SimServer, result: logsaving.SaveResult) -> int:
    """The server's count of pods/log reads, checked against the one the save reports (index and result)."""
    served = cluster.request_counts.get("GET pods/log", 0)
    assert result.path is not None
    assert result.reads == json.loads((Path(result.path) / "index.json").read_text())["reads"] == served
    return served


async def test_a_first_stop_whose_log_shows_it_is_read_once(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    """The usual fault under OnFailure: kcover reads before the kubelet restarts the container. The current
    log has a line from before the stop's second, so it is the stopped instance: no previous read."""
    pod = await _pod(kube, "w", ["trainer"])
    cluster.append_log(NS, "w", "trainer", "step 1\nNCCL error: unhandled system error\n")
    stopped = _stopped_first(pod, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2))

    result = await logsaving.save(kube, JOB, [stopped], settings=_policy(tmp_path), now=NOW)

    assert _log_reads(cluster, result) == 1
    assert result.error is None
    assert result.path is not None
    assert result.files == 1
    # saved as written: the times the proof read are not in the file
    assert (Path(result.path) / "w" / "trainer.log").read_text() == "step 1\nNCCL error: unhandled system error\n"
    assert not (Path(result.path) / "w" / "trainer.previous.log").exists()


async def test_a_first_stop_restarted_before_the_read_has_its_failed_instance_read_as_the_previous(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    """The kubelet restarted the container between the status kcover acted on and the read: the current
    log is the new instance, every line after the stop, so the previous log is read and holds the failure."""
    pod = await _pod(kube, "w", ["trainer"])
    finished = dt.datetime.now(dt.UTC).replace(microsecond=0)
    cluster.append_log(NS, "w", "trainer", "step 1\nNCCL error: unhandled system error\n")
    cluster.terminate_container_instance(NS, "w", "trainer")
    cluster.append_log(NS, "w", "trainer", "step 1 (restarted)\n")

    result = await logsaving.save(kube, JOB, [_stopped_first(pod, finished)], settings=_policy(tmp_path), now=NOW)

    assert _log_reads(cluster, result) == 2
    assert result.path is not None
    assert result.files == 2
    folder = Path(result.path)
    assert (folder / "w" / "trainer.previous.log").read_text() == "step 1\nNCCL error: unhandled system error\n"
    assert (folder / "w" / "trainer.log").read_text() == "step 1 (restarted)\n"


async def test_a_first_stop_whose_lines_all_fall_in_its_last_second_is_read_twice(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    """Lines in the stop's own second could be a fast restart's: nothing proven, the previous log is asked
    for (a 400 here: the kubelet has not restarted it), and what the current read got is kept."""
    pod = await _pod(kube, "w", ["trainer"])
    finished = dt.datetime.now(dt.UTC).replace(microsecond=0)
    cluster.append_log(NS, "w", "trainer", "crashed at start\n")

    result = await logsaving.save(kube, JOB, [_stopped_first(pod, finished)], settings=_policy(tmp_path), now=NOW)

    assert _log_reads(cluster, result) == 2
    assert result.path is not None
    assert (result.files, result.container_errors) == (1, 0)
    assert (Path(result.path) / "w" / "trainer.log").read_text() == "crashed at start\n"


async def test_a_first_stop_whose_read_failed_is_not_read_again_as_the_previous(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    """A read that failed (here the pod is gone: 404) is listed in the index; the previous log goes through
    the same server and kubelet, so it is not asked for."""
    pod = await _pod(kube, "w", ["trainer"])
    await kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/w", body={"gracePeriodSeconds": 0})
    stopped = _stopped_first(pod, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2))

    result = await logsaving.save(kube, JOB, [stopped], settings=_policy(tmp_path), now=NOW)

    assert _log_reads(cluster, result) == 1
    assert result.path is not None
    assert (result.files, result.container_errors) == (0, 1)
    index = json.loads((Path(result.path) / "index.json").read_text())
    assert [(e["container"], e["previous"], e["status"]) for e in index["errors"]] == [("trainer", False, 404)]


async def test_logs_are_bounded_to_their_tail(cluster: simserver.SimServer, kube: client_.KubeClient,
                                              tmp_path: Path) -> None:
    pod = await _pod(kube, "p", ["trainer"])
    cluster.append_log(NS, "p", "trainer", "".join(f"line {i:04d}\n" for i in range(1000)))

    by_lines = await logsaving.save(kube, JOB, [pod], now=NOW,
                                    settings=_policy(tmp_path / "a", max_lines_per_container=3))
    by_bytes = await logsaving.save(kube, JOB, [pod], now=NOW,
                                    settings=_policy(tmp_path / "b", max_bytes_per_container=20))

    assert by_lines.path is not None
    assert by_bytes.path is not None
    assert (Path(by_lines.path) / "p" / "trainer.log").read_text() == "line 0997\nline 0998\nline 0999\n"
    assert (Path(by_bytes.path) / "p" / "trainer.log").read_text() == "line 0998\nline 0999\n"
    for result in (by_lines, by_bytes):
        assert result.path is not None
        index = json.loads((Path(result.path) / "index.json").read_text())
        assert index["files"][0]["truncated"] is True


async def test_pods_known_by_name_are_looked_up_and_missing_ones_reported(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    await _pod(kube, "p", ["trainer"])
    cluster.append_log(NS, "p", "trainer", "hello\n")

    result = await logsaving.save(kube, JOB, [PodName(NS, "p"), PodName(NS, "gone")], settings=_policy(tmp_path),
                                  now=NOW)

    assert result.error is None
    assert result.files == 1
    assert result.container_errors == 1
    assert result.path is not None
    index = json.loads((Path(result.path) / "index.json").read_text())
    assert index["errors"][0]["pod"] == "gone"
    assert index["errors"][0]["status"] == 404


async def test_a_slow_api_server_cannot_hold_recovery_hostage(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    pod = await _pod(kube, "p", ["trainer"])
    cluster.faults.latency_seconds = 0.8
    registry = CollectorRegistry()
    metrics = logsaving.LogSaveMetrics(registry)

    result = await logsaving.save(kube, JOB, [pod], settings=_policy(tmp_path, timeout_seconds=0.3), now=NOW,
                                  metrics=metrics)

    assert result.error is not None
    assert "timed out" in result.error
    assert registry.get_sample_value("kcover_log_save_failures_total", {"reason": "timeout"}) == 1
    assert result.path is not None
    index = json.loads((Path(result.path) / "index.json").read_text())
    assert index["complete"] is False
    cluster.faults.latency_seconds = 0.0
    await asyncio.sleep(0.8)  # let the server's delayed handlers finish before it shuts down


async def test_retention_prunes_oldest_folders_after_a_save(
        cluster: simserver.SimServer, kube: client_.KubeClient, tmp_path: Path) -> None:
    pod = await _pod(kube, "p", ["trainer"])
    cluster.append_log(NS, "p", "trainer", "x" * 100 + "\n")
    policy = _policy(tmp_path, retention_count=2)
    paths = []
    for minutes in range(4):
        result = await logsaving.save(kube, JOB, [pod], settings=policy, now=NOW + dt.timedelta(minutes=minutes))
        paths.append(result.path)

    assert sorted(os.listdir(tmp_path)) == [Path(p).name for p in paths[-2:] if p]
