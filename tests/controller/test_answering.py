"""The refusal answers' loop outlives a term that ends under it.

Against the simulated API server: an answer whose write the fence refuses (the Lease lost between the
queueing and the write) is not written and does not end the loop (a NotLeaderError out of it ended the
controller's task group, and the replica with it); the next answer, written while leading, is.
"""

from __future__ import annotations

import asyncio

from kcover.aio import clock as clock_
from kcover.controller import answering
from kcover.detectors import contract
from kcover.kube import client as client_
from kcover.sim import server as simserver


class Fence:
    def __init__(self) -> None:
        self.left = 0.0

    def write_seconds_left(self) -> float:
        return self.left


def _refusal(name: str) -> contract.Refusal:
    return contract.Refusal(namespace="tenant", kind="Event", api_version="v1", name=name, uid=f"uid-{name}",
                            reason="namespace_not_allowed", text=f"{name} refused")


async def _answers(kube: client_.KubeClient) -> list[str]:
    items = (await kube.request("GET", "/api/v1/namespaces/tenant/events"))["items"]
    return sorted(e["involvedObject"]["name"] for e in items if e.get("reason") == answering.REASON)


async def test_an_answer_the_fence_refuses_is_skipped_and_the_loop_goes_on() -> None:
    async with simserver.SimServer() as srv:
        srv.store.create("namespaces", {"metadata": {"name": "tenant"}})
        fence = Fence()
        async with client_.from_configuration(srv.kube_configuration()) as kube:
            answers = answering.Answers(kube, clock=clock_.SystemClock(), identity="ctl-a", is_leader=lambda: True,
                                        fence=fence)
            stop = asyncio.Event()
            task = asyncio.create_task(answers.run(stop), name="refusal-answers")
            answers(_refusal("first"))  # queued while leading; the term is over before it is written
            await asyncio.sleep(0.2)
            assert not task.done(), task.exception() if task.done() else ""
            fence.left = 10.0
            answers(_refusal("second"))
            async with asyncio.timeout(5):
                while answers.written < 1:  # noqa: ASYNC110  (polling the loop's counter)
                    await asyncio.sleep(0.02)
            assert await _answers(kube) == ["second"]
            stop.set()
            await asyncio.wait_for(task, 2.0)
