"""SimServer over HTTP: fault injection, request counts, pod logs, kubeconfig, kubectl."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from kcover.sim import server as simserver


@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer(seed=1) as s:
        yield s


async def get(srv: simserver.SimServer, path: str, **params: str) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as session, session.get(srv.url + path, params=params) as resp:
        body = await resp.read()
        try:
            return resp.status, orjson.loads(body), dict(resp.headers)
        except orjson.JSONDecodeError:
            return resp.status, body.decode(), dict(resp.headers)


def pod(name: str, *containers: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": c, "image": "i"} for c in containers]},
            "status": {"phase": "Running"}}


async def test_throttling_both_styles(srv: simserver.SimServer) -> None:
    srv.faults.throttle_rate = 1.0
    srv.faults.retry_after_seconds = 3
    code, body, headers = await get(srv, "/api/v1/pods")
    assert code == 429
    assert body.startswith("Too many requests, please try again later.")
    assert headers["Retry-After"] == "3"
    srv.faults.throttle_style = "status"
    code, body, _ = await get(srv, "/api/v1/pods")
    assert code == 429
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["retryAfterSeconds"] == 3
    srv.faults.reset()
    srv.faults.error_rate = 1.0
    code, body, _ = await get(srv, "/api/v1/pods")
    assert code == 500
    code, _, _ = await get(srv, "/version")  # discovery is never faulted
    assert code == 200


async def test_request_counts(srv: simserver.SimServer) -> None:
    await get(srv, "/api/v1/pods")
    await get(srv, "/api/v1/namespaces/default/pods/x")
    await get(srv, "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs")
    assert srv.request_counts == {"LIST pods": 1, "GET pods": 1, "LIST pytorchjobs.kubeflow.org": 1}


async def test_drop_and_expire_watches(srv: simserver.SimServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(srv.url + "/api/v1/pods", params={"watch": "1"}) as resp:
            await asyncio.sleep(0.2)
            assert srv.faults.drop_watches("pods") == 1
            assert await asyncio.wait_for(resp.content.read(), 5) == b""
        srv.faults.expire_next_watch("pods")
        rv = str(srv.store.resource_version)
        async with session.get(srv.url + "/api/v1/pods", params={"watch": "1", "resourceVersion": rv}) as resp:
            event = orjson.loads(await resp.content.readline())
            assert event["type"] == "ERROR"
            assert event["object"]["code"] == 410
        async with session.get(srv.url + "/api/v1/pods", params={"watch": "1", "resourceVersion": rv,
                                                                 "timeoutSeconds": "1"}) as resp:
            assert await resp.content.read() == b""  # one-shot: the next watch works


async def test_pod_logs(srv: simserver.SimServer) -> None:
    srv.store.create("pods", pod("p", "a", "b"))
    for i in range(5):
        srv.append_log("default", "p", "a", f"line {i}")
    code, body, headers = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a", tailLines="2")
    assert code == 200
    assert body == "line 3\nline 4\n"
    assert headers["Content-Type"].startswith("text/plain")
    code, body, _ = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a", limitBytes="3")
    assert body == "lin"
    code, body, _ = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a", timestamps="true",
                              tailLines="1")
    assert body.endswith("Z line 4\n")
    assert len(body.split(" ")[0]) == 27
    code, body, _ = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a", previous="true")
    assert code == 400
    srv.terminate_container_instance("default", "p", "a")
    srv.append_log("default", "p", "a", "after restart")
    code, body, _ = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a", previous="true")
    assert body.splitlines()[-1] == "line 4"
    code, body, _ = await get(srv, "/api/v1/namespaces/default/pods/p/log", container="a")
    assert body == "after restart\n"


async def test_kubectl(srv: simserver.SimServer, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    srv.store.create("nodes", {"metadata": {"name": "gpu-0"}, "spec": {}})
    srv.store.create("pods", pod("p", "a"))
    kc = srv.write_kubeconfig(tmp_path / "kc")
    for args, expected in ((["get", "pods", "-A"], "p"), (["get", "nodes"], "gpu-0"), (["get", "po", "p"], "p")):
        proc = await asyncio.create_subprocess_exec(kubectl, "--kubeconfig", str(kc), *args,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert expected in out.decode().split(), out.decode()


async def test_a_watch_delivers_what_waited_while_its_bookmark_fell_due() -> None:
    """A watch read in-process runs only as its reader pulls: changes written while the reader was away past
    the bookmark's time are waiting when it comes back, and come out (on Python 3.11 the watch used to ask
    for them with a timeout already spent, which cancels the read before it runs, and spun there delivering
    nothing, for ever: on the fleet replay's virtual clock, the clock stopped)."""
    interval = 0.05
    async with simserver.SimServer(listen=False, bookmark_interval=interval) as srv:
        kube = srv.client()
        try:
            async with kube.stream("/api/v1/namespaces/default/pods", query={
                    "watch": "true", "allowWatchBookmarks": "true", "resourceVersion": "0"}, read_timeout=30) as resp:
                srv.store.create("pods", pod("a", "c"))
                first = orjson.loads(await resp.content.readline())
                assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
                srv.store.create("pods", pod("b", "c"))
                srv.store.create("pods", pod("c", "c"))
                await asyncio.sleep(3 * interval)  # the reader away: the bookmark falls due with two changes queued
                async with asyncio.timeout(10):
                    names = [orjson.loads(await resp.content.readline()) for _ in range(2)]
                assert [(e["type"], e["object"]["metadata"]["name"]) for e in names] == [("ADDED", "b"), ("ADDED", "c")]
                srv.store.create("pods", pod("d", "c"))  # and it keeps delivering, bookmarks between when quiet
                async with asyncio.timeout(10):
                    while (event := orjson.loads(await resp.content.readline()))["type"] == "BOOKMARK":
                        pass
                assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "d")
        finally:
            await kube.close()
