"""The `logscan` detector: classify container failures that `pod-status` reported from their logs.

Owns the loop that takes the source detector's Pod events off the bus, reads the failed container's
log tail through the context's `LogReader` (`context.log_reader`; bounded in lines, bytes and
concurrency), classifies it with the pure table in `classifying` and publishes one enrichment event
per container failure. It reads only the source event's typed fields: the container from
`fault.container`, the failure's identity from its `dedupe_key` (pod-status gives one key per
termination), never its `attributes`. It never writes to the API. Without a log reader it raises
`DetectorUnavailableError`; a failed read is logged and forgotten, so a later event retries it.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import structlog
from pydantic import BaseModel

from kcover import model
from kcover.detectors import contract
from kcover_logscan import classifying, remembering
from kcover_logscan import config as config_

log = structlog.get_logger()

TriggerKey = tuple[str, str, str]
"""(pod uid, container, source event key) of one container failure: the source's key names the
termination (pod-status: pod uid, container and termination ordinal)."""


def trigger_key(event: model.CollectorEvent, config: config_.LogscanConfig) -> TriggerKey | None:
    """The container failure `event` reports, or None when logscan has nothing to do with it. Pure."""
    if event.detector != config.source_detector or event.target.kind is not model.TargetKind.POD:
        return None
    if event.cleared or (config.reasons and event.reason not in config.reasons):
        return None
    container = event.fault.container
    if not container or not event.target.name:
        return None
    return (event.target.uid or f"{event.target.namespace}/{event.target.name}", container, event.key)


def build_event(source: model.CollectorEvent, found: classifying.Classification, *, detector: str,
                severity: model.Severity, previous: bool) -> model.CollectorEvent:
    """The enrichment event for `source`, classified as `found`. Pure."""
    container = source.fault.container
    first = found.lines[0] if found.lines else ""
    return model.CollectorEvent(
        detector=detector, target=source.target, severity=severity,
        reason=classifying.reason_for(found.failure_class),
        message=f"container {container} failed with a {found.failure_class.value} error: {first}",
        dedupe_key=f"{detector}/{source.key}", fault=model.Fault(container=container),
        attributes={"class": found.failure_class.value, "pattern": found.pattern, "lines": list(found.lines),
                    "source_event": source.id, "source_reason": source.reason, "previous": previous})


class LogscanDetector:
    """Reads and classifies the log tails of containers the pod-status detector saw fail."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = config_.LogscanConfig

    def __init__(self, name: str, config: config_.LogscanConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self._seen = remembering.Seen(config.remember)

    def _reader(self) -> contract.LogReader:
        reader = self.context.log_reader
        if reader is None:
            raise contract.DetectorUnavailableError(
                "logscan needs a log reader (context.log_reader: the controller's); none was provided")
        return reader

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        reader = self._reader()
        subscription = bus.subscribe(self.name)
        try:
            async with asyncio.TaskGroup() as group:
                scans: set[asyncio.Task[None]] = set()
                consumer = group.create_task(self._consume(subscription, bus, reader, group, scans),
                                             name=f"{self.name}:consume")
                await stop.wait()
                consumer.cancel()
                for scan in scans:
                    scan.cancel()
        finally:
            subscription.unsubscribe()

    async def _consume(self, subscription: contract.Subscription, bus: contract.Bus, reader: contract.LogReader,
                       group: asyncio.TaskGroup, scans: set[asyncio.Task[None]]) -> None:
        slots = asyncio.Semaphore(self.config.concurrency)
        async for event in subscription:
            key = trigger_key(event, self.config)
            if key is None or not self._seen.add(key):
                continue
            await slots.acquire()
            scan = group.create_task(self._scan(event, key, bus, reader),
                                     name=f"{self.name}:scan:{event.target.namespace}/{event.target.name}/{key[1]}")
            scans.add(scan)
            scan.add_done_callback(scans.discard)
            scan.add_done_callback(lambda _: slots.release())

    def _attempts(self) -> tuple[bool, ...]:
        source = self.config.log_source
        if source is config_.LogSource.CURRENT:
            return (False,)
        if source is config_.LogSource.PREVIOUS:
            return (True,)
        return (False, True)

    async def _scan(self, event: model.CollectorEvent, key: TriggerKey, bus: contract.Bus,
                    reader: contract.LogReader) -> None:
        target = event.target
        container = key[1]
        cfg = self.config
        for previous in self._attempts():
            try:
                text = await reader.read_log(target.namespace, target.name, container, previous=previous,
                                             tail_lines=cfg.tail_lines, limit_bytes=cfg.limit_bytes)
            except contract.NotFoundError:
                continue
            except contract.KubeError as exc:
                if exc.status == 400:  # "previous terminated container ... not found"
                    continue
                self._seen.discard(key)
                log.warning("logscan_read_failed", namespace=target.namespace, pod=target.name,
                            container=container, previous=previous, status=exc.status, error=str(exc))
                return
            except Exception as exc:  # the reader is plugged in: its bugs must not stop other scans
                self._seen.discard(key)
                log.exception("logscan_read_failed", namespace=target.namespace, pod=target.name,
                              container=container, previous=previous, error=repr(exc))
                return
            found = classifying.classify(text[-cfg.limit_bytes:], cfg.patterns, max_lines=cfg.max_lines,
                                         max_line_length=cfg.max_line_length)
            if found is None:
                continue
            classified = build_event(event, found, detector=self.name, severity=cfg.severities[found.failure_class],
                                     previous=previous)
            log.info("logscan_classified", namespace=target.namespace, pod=target.name, container=container,
                     failure_class=found.failure_class.value, pattern=found.pattern)
            await bus.publish(classified)
            return
        log.info("logscan_unclassified", namespace=target.namespace, pod=target.name, container=container)
