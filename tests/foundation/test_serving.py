from __future__ import annotations

import asyncio
import time

import aiohttp

from kcover import metrics, serving


async def test_health_ready_and_metrics_over_http() -> None:
    m = metrics.Metrics()
    m.config_reload_failures.inc()
    health = serving.Health(stall_seconds=0.5)
    state = {"synced": False}
    health.add_readiness("caches", lambda: (state["synced"], "pods 0/1 synced"))
    server = serving.Server(health, m, host="127.0.0.1", port=0)
    await server.start()
    stop = asyncio.Event()
    beat = asyncio.create_task(health.heartbeat(stop))
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
            async with http.get("/healthz") as r:
                assert r.status == 200
            async with http.get("/readyz") as r:
                assert r.status == 503
                assert "[-] caches failing: pods 0/1 synced" in await r.text()
            state["synced"] = True
            async with http.get("/readyz") as r:
                assert r.status == 200
            async with http.get("/metrics") as r:
                assert r.status == 200
                assert "kcover_config_reload_failures_total 1.0" in await r.text()
            # a blocked event loop makes liveness fail, seen by the watchdog thread outside the loop
            time.sleep(0.8)  # noqa: ASYNC251 -- blocking the loop on purpose
            ok, detail = health.liveness()
            assert not ok
            assert "stalled" in detail
            assert health.stalls == 1, "the watchdog thread saw the stall while the loop was blocked"
            async with http.get("/healthz") as r:  # the first probe answered after the stall still fails
                assert r.status == 503
                assert "stalled" in await r.text()
            async with http.get("/metrics") as r:
                assert "kcover_event_loop_stalls_total 1.0" in await r.text()
            await asyncio.sleep(0.6)  # the loop ticks again for a whole stall period: live again
            async with http.get("/healthz") as r:
                assert r.status == 200
    finally:
        stop.set()
        await beat
        await server.stop()


def test_a_check_that_raises_reports_not_ready() -> None:
    health = serving.Health()

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    health.add_readiness("x", broken)
    ok, results = health.readiness()
    assert not ok
    assert results["x"] == "failing: check raised RuntimeError: boom"


async def _exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    await writer.wait_closed()
    return answer


async def test_the_server_answers_what_probes_and_scrapers_send_and_refuses_the_rest() -> None:
    m = metrics.Metrics()
    health = serving.Health()

    def broken() -> dict[str, dict[str, str]]:
        raise RuntimeError("no state")

    health.detectors = broken
    server = serving.Server(health, m, host="127.0.0.1", port=0)
    await server.start()
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)  # sends nothing, ever
    try:
        head = await _exchange(server.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Length: " in head
        assert head.endswith(b"\r\n\r\n")  # no body for HEAD
        got = await _exchange(server.port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Connection: close\r\n" in got
        assert b"kcover_event_loop_stalls_total" in got
        assert (await _exchange(server.port, b"POST /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        assert (await _exchange(server.port, b"GET /nothing HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert (await _exchange(server.port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        too_large = b"GET /readyz HTTP/1.1\r\nX: " + b"a" * (serving.MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
        assert (await _exchange(server.port, too_large)).startswith(b"HTTP/1.1 400 ")
        failed = await _exchange(server.port, b"GET /detectors HTTP/1.1\r\n\r\n")
        assert failed.startswith(b"HTTP/1.1 500 ")
        assert failed.endswith(b"RuntimeError: no state\n")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}/readyz") as r:
            assert (r.status, await r.text()) == (200, "ready\n")  # no checks registered
    finally:
        started = time.monotonic()
        await asyncio.wait_for(server.stop(), 5)
        assert time.monotonic() - started < serving.REQUEST_SECONDS  # the idle client did not hold the stop
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # its connection was closed
        idle_writer.close()
