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


def test_loop_lag_is_how_late_the_heartbeat_is_not_its_interval() -> None:
    """The heartbeat ticks every `interval` (1 s here): a watchdog looking just before the next tick sees a
    heartbeat almost 1 s old on an idle loop, which is no lag; lag is how far past its due time a beat is."""
    health = serving.Health(stall_seconds=4.0, clock=lambda: 0.0)
    assert health.interval == 1.0
    health.beat(now=10.0)
    health.watch(now=10.99)  # idle: the next beat is due at 11.0
    assert health.lag_seconds == 0.0
    health.woke(now=11.3)  # the loop ran the heartbeat 0.3 s late
    health.beat(now=11.3)
    health.watch(now=11.5)
    assert round(health.lag_seconds, 6) == 0.3
    health.watch(now=14.0)  # no beat since 11.3: 1.7 s past the one due at 12.3
    assert round(health.lag_seconds, 6) == 1.7
    assert health.liveness(now=14.0)[0]  # under stall_seconds: alive, and late
    health.watch(now=16.0)
    assert not health.liveness(now=16.0)[0]
    assert health.stalls == 1


async def test_a_degradation_keeps_the_process_ready_and_says_so_at_readyz_and_detectors() -> None:
    health = serving.Health()
    health.add_readiness("detectors", lambda: (True, "2 detectors"))
    blind = {"text": ""}
    health.add_degradation("gpu-sight", lambda: blind["text"])
    health.detectors = lambda: {"nvml": {"state": "unavailable", "detail": "no driver"}}
    server = serving.Server(health, metrics.Metrics(), host="127.0.0.1", port=0)
    await server.start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
            async with http.get("/readyz") as r:
                assert (r.status, await r.text()) == (200, "[+] detectors ok: 2 detectors\nready\n")
            async with http.get("/detectors") as r:
                assert (await r.json())["degraded"] == {}
            blind["text"] = "kcover agent cannot see this node's GPUs"
            async with http.get("/readyz") as r:
                assert r.status == 200
                assert await r.text() == ("[+] detectors ok: 2 detectors\n"
                                          "[!] gpu-sight degraded: kcover agent cannot see this node's GPUs\n"
                                          "ready (degraded)\n")
            async with http.get("/detectors") as r:
                doc = await r.json()
            assert doc == {"detectors": {"nvml": {"state": "unavailable", "detail": "no driver"}},
                           "degraded": {"gpu-sight": "kcover agent cannot see this node's GPUs"}}
    finally:
        await server.stop()


def test_a_degradation_check_that_raises_says_so() -> None:
    health = serving.Health()

    def broken() -> str:
        raise RuntimeError("boom")

    health.add_degradation("x", broken)
    assert health.degraded() == {"x": "check raised RuntimeError: boom"}
    assert health.readiness()[0]
    health.remove_degradation("x")
    assert health.degraded() == {}
