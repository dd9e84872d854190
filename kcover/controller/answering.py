"""Answers to refused signals: one warning Event in the refused object's own namespace.

Owns the write behind `DetectorContext.refusals`. Detectors judge and rate-limit (the event watcher
answers at most once per namespace and reason per window, and a token bucket in all); this module
queues what they hand over (at most `capacity`, more are dropped and counted in `dropped`) and, on
the leader only, writes each as a core/v1 Event (`KcoverSignalRefused`) about the refused object,
fenced to the leader's term like every recovery write. A follower drops what it is handed: the
leader's own detector sees the same signal and answers it.

A failed write is logged and dropped; it never stops the controller. The answer is addressed to the
namespace of what was refused, never elsewhere, so a tenant's forgeries leave Events only where the
tenant could already write them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from kcover import errors
from kcover.aio import clock as clock_
from kcover.aio import waiting
from kcover.detectors import contract
from kcover.kube import client as client_
from kcover.kube import events, retrying
from kcover.recovery import auditing

log = structlog.get_logger()

REASON = "KcoverSignalRefused"


class Answers:
    """Queue of refusals to answer, and the loop that answers them while leading."""

    def __init__(self, kube: client_.KubeClient, *, clock: clock_.Clock, identity: str,
                 is_leader: Callable[[], bool], fence: retrying.Fence | None = None, capacity: int = 100) -> None:
        self._kube = kube
        self._clock = clock
        self._identity = identity
        self._is_leader = is_leader
        self.fence = fence
        """Bounds each write to the leader's term (set once the controller built its elector)."""
        self._queue: asyncio.Queue[contract.Refusal] = asyncio.Queue(maxsize=capacity)
        self.written = 0
        self.dropped = 0

    def __call__(self, refusal: contract.Refusal) -> None:
        """The `RefusalSink`: never blocks; drops when not leading or when the queue is full."""
        if not self._is_leader():
            return
        try:
            self._queue.put_nowait(refusal)
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Write queued answers until `stop` is set."""
        while (refusal := await waiting.or_stop(self._queue.get(), stop)) is not None:
            await self.answer(refusal)

    async def answer(self, refusal: contract.Refusal) -> None:
        about = events.About(refusal.kind, refusal.api_version, refusal.name, refusal.namespace, refusal.uid)
        body = events.body(about, reason=REASON, action="Refuse", message=refusal.text, warning=True,
                           now=self._clock.now(), controller=auditing.REPORTING_CONTROLLER, instance=self._identity)
        if not self._is_leader():
            return
        try:
            await self._kube.request("POST", events.path_of(body), body=body, fence=self.fence)
        except errors.NotLeaderError:
            return  # the term ended before the write (its fence): a follower answers nothing
        except errors.KubeError as exc:
            log.warning("refusal_answer_failed", namespace=refusal.namespace, reason=refusal.reason, error=str(exc))
            return
        self.written += 1
        log.info("refusal_answered", namespace=refusal.namespace, refused=refusal.name, reason=refusal.reason)
