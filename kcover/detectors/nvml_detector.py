"""NVML detector (agent): XID critical errors as they happen, and GPU health by polling.

Owns turning the node's NVML view into `CollectorEvent`s: XID events from `nvmlEventSetWait` (a worker
thread waits at most `wait_timeout_ms` per call so `stop` is honoured promptly), judged by the XID
policy (`kcover.nvml.xid_policy`) with a per-GPU occurrence history; and, every
`health_interval_seconds` (or at once after a double-bit ECC event), a poll of each GPU for a lost GPU,
volatile double-bit ECC errors, row-remap failure, pending row remaps and pages pending retirement.
Events carry their meaning in typed fields: `fault` (XID, GPU index and UUID, the pods on the GPU,
or the health `check`), `recommended` (the XID policy's or the health check's action) and, for XIDs,
`occurrences` within `window_seconds` as the policy counted them. Health faults are published when
they appear and again with `cleared=True` when they go away, so the reporter can restore the node
condition. It never writes to the API.

Backend: `context.nvml` (a `kcover.nvml.backend.Nvml`), or the real pynvml adapter when None. The XID
policy: `context.xid_policy` (the one the agent loaded from settings), else the shipped one. Pods on a
GPU: `context.pod_lookup`, asked for the GPU's UUID and, on a MIG-enabled GPU, the UUIDs of its MIG
instances (read once at start), when the agent can ask the kubelet.

Fails: no driver or no GPU -> `errors.DetectorUnavailableError` (the supervisor marks it unavailable
and the agent stays healthy); other NVML errors propagate and the supervisor restarts it with backoff.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel, ConfigDict, Field

from kcover import bus as bus_
from kcover import errors, model
from kcover.aio import waiting
from kcover.detectors import contract
from kcover.nvml import backend, real, xid_policy

log = structlog.get_logger()


class NvmlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wait_timeout_ms: int = Field(500, ge=10, le=10_000, description="Milliseconds one NVML event wait may block: bounds how long shutdown waits for the worker thread.")
    health_interval_seconds: float = Field(10.0, gt=0, description="Seconds between health polls (GPU lost, ECC, row remap, retired pages): cheap queries, and a lost GPU is seen within one interval.")
    report_pending_remap: bool = Field(True, description="Report rows (or pages) waiting for a GPU reset as a Warning; they do not make the GPU unhealthy.")


@dataclass(frozen=True)
class _Fault:
    key: str
    reason: str
    severity: model.Severity
    action: xid_policy.Action
    message: str


def health_faults(nvml: backend.Nvml, index: int) -> list[_Fault]:
    """Blocking: the health faults GPU `index` shows now. Pure apart from the NVML reads."""
    try:
        nvml.probe(index)
    except errors.NvmlError as exc:
        if exc.code == backend.CODE_GPU_LOST:
            return [_Fault("gpu_lost", "GPULost", model.Severity.ERROR, xid_policy.Action.CORDON_NODE,
                           f"NVML reports the GPU as lost (fallen off the bus): {exc}")]
        raise
    faults: list[_Fault] = []
    for query in (_dbe, _remap, _pages):
        try:
            faults += query(nvml, index)
        except errors.NvmlError as exc:
            if exc.code == backend.CODE_GPU_LOST:
                return [_Fault("gpu_lost", "GPULost", model.Severity.ERROR, xid_policy.Action.CORDON_NODE,
                               f"NVML reports the GPU as lost (fallen off the bus): {exc}")]
            if exc.code != backend.CODE_NOT_SUPPORTED:
                raise
    return faults


def _dbe(nvml: backend.Nvml, index: int) -> list[_Fault]:
    count = nvml.ecc_double_bit_volatile(index)
    if count <= 0:
        return []
    return [_Fault("double_bit_ecc", "DoubleBitECC", model.Severity.ERROR, xid_policy.Action.CORDON_NODE,
                   f"{count} uncorrectable (double-bit) ECC errors since the driver loaded; the GPU needs a reset")]


def _remap(nvml: backend.Nvml, index: int) -> list[_Fault]:
    rows = nvml.remapped_rows(index)
    out: list[_Fault] = []
    if rows.failure:
        out.append(_Fault("row_remap_failure", "RowRemapFailure", model.Severity.ERROR,
                          xid_policy.Action.CORDON_NODE,
                          f"row remapping failed (no spare rows; {rows.uncorrectable} rows remapped for "
                          "uncorrectable errors): the GPU needs service"))
    if rows.pending:
        out.append(_Fault("row_remap_pending", "RowRemapPending", model.Severity.WARNING,
                          xid_policy.Action.REPORT,
                          f"a row remap waits for a GPU reset ({rows.correctable} correctable, "
                          f"{rows.uncorrectable} uncorrectable rows remapped)"))
    return out


def _pages(nvml: backend.Nvml, index: int) -> list[_Fault]:
    if not nvml.pending_page_retirement(index):
        return []
    return [_Fault("retired_pages_pending", "RetiredPagesPending", model.Severity.WARNING,
                   xid_policy.Action.REPORT, "retired pages wait for a GPU reset to take effect")]


class NvmlDetector:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model: ClassVar[type[BaseModel]] = NvmlConfig

    def __init__(self, name: str, config: NvmlConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.config = config
        self.context = context
        self.policy: contract.XidPolicy = context.xid_policy or xid_policy.load()
        self.nvml: backend.Nvml = context.nvml if context.nvml is not None else real.RealNvml()
        self._devices: list[backend.DeviceInfo] = []
        self._by_uuid: dict[str, backend.DeviceInfo] = {}
        self._mig: dict[str, tuple[str, ...]] = {}
        """GPU UUID -> the UUIDs of its MIG instances (MIG on): a fault on the GPU is a fault on each of them."""
        self._history: dict[tuple[str, int], collections.deque[float]] = {}
        self._active: dict[tuple[int, str], _Fault] = {}
        self._poll_now = asyncio.Event()
        for xid_class in xid_policy.XidClass:
            context.metrics.xid_classes.labels(xid_class.value)

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        nvml = self.nvml
        try:
            await asyncio.to_thread(nvml.init)
        except errors.NvmlError as exc:
            if exc.code in (backend.CODE_LIBRARY_MISSING, backend.CODE_NO_GPU):
                raise errors.DetectorUnavailableError(f"NVML unavailable on this node: {exc}") from exc
            raise
        try:
            count = await asyncio.to_thread(nvml.device_count)
            self._devices = [await asyncio.to_thread(nvml.device_info, i) for i in range(count)]
            self._by_uuid = {d.uuid: d for d in self._devices}
            self._mig = {d.uuid: await asyncio.to_thread(mig_uuids, nvml, d.index) for d in self._devices}
            await asyncio.to_thread(nvml.register_events,
                                    backend.EventType.XID_CRITICAL | backend.EventType.DOUBLE_BIT_ECC)
            log.info("nvml_detector_started", detector=self.name, gpus=len(self._devices),
                     mig_instances=sum(len(v) for v in self._mig.values()))
            self.context.metrics.health_checks.started(self.name)
            async with asyncio.TaskGroup() as group:
                group.create_task(self._events(bus, stop), name=f"{self.name}:events")
                group.create_task(self._health(bus, stop), name=f"{self.name}:health")
        finally:
            await asyncio.to_thread(nvml.shutdown)

    # ------------------------------------------------------------------ XID events

    async def _events(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                events = await asyncio.to_thread(self.nvml.wait, self.config.wait_timeout_ms)
            except errors.NvmlError as exc:
                log.warning("nvml_event_wait_failed", detector=self.name, error=str(exc), code=exc.code)
                self._poll_now.set()
                await waiting.sleep_or_stop(stop, 1.0)
                continue
            for event in events:
                if event.event_type & backend.EventType.XID_CRITICAL:
                    await self._on_xid(bus, event)
                if event.event_type & backend.EventType.DOUBLE_BIT_ECC:
                    self._poll_now.set()

    async def _on_xid(self, bus: bus_.Bus, event: backend.NvmlEvent) -> None:
        now = self.context.clock.monotonic()
        device = self._by_uuid.get(event.gpu_uuid)
        history = self._history.setdefault((event.gpu_uuid, event.data), collections.deque())
        window = self.policy.longest_window_seconds
        while history and window > 0 and now - history[0] > window:
            history.popleft()
        decision = self.policy.decide(event.data, list(history), now)
        history.append(now)
        self.context.metrics.xids.labels(str(decision.xid), decision.xid_class.value).inc()
        self.context.metrics.xid_classes.labels(decision.xid_class.value).inc()
        if decision.action is xid_policy.Action.IGNORE:
            log.info("nvml_xid_ignored", detector=self.name, xid=decision.xid, gpu_uuid=event.gpu_uuid)
            return
        what = decision.name or "not in the XID policy"
        message = (f"XID {decision.xid} ({what}) on GPU {device.index if device else '?'} {event.gpu_uuid}: "
                   f"class {decision.xid_class.value}, recommended action {decision.action.value}"
                   + (f" after {decision.occurrences} occurrences" if decision.escalated else ""))
        attributes: dict[str, Any] = {"class": decision.xid_class.value, "escalated": decision.escalated,
                                      "known_xid": decision.known}
        await self._publish(bus, device, event.gpu_uuid, reason=decision.reason, severity=decision.severity,
                            message=message, attributes=attributes, xid=decision.xid, recommended=decision.action,
                            occurrences=decision.occurrences, window_seconds=decision.window_seconds,
                            dedupe_key=f"{self.name}/xid/{event.gpu_uuid}/{decision.xid}/{decision.action.value}")

    # ------------------------------------------------------------------ health poll

    async def _health(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._poll_now.clear()
            metrics = self.context.metrics
            for device in self._devices:
                try:
                    faults = await asyncio.to_thread(health_faults, self.nvml, device.index)
                except errors.NvmlError:
                    metrics.nvml_polls.labels(result="failed").inc()
                    raise  # the supervisor restarts the detector
                await self._reconcile(bus, device, faults)
            metrics.nvml_polls.labels(result="ok").inc()
            metrics.health_checks.succeeded(self.name)
            await waiting.first_of(stop, self._poll_now, timeout=self.config.health_interval_seconds)

    async def _reconcile(self, bus: bus_.Bus, device: backend.DeviceInfo, faults: list[_Fault]) -> None:
        now_keys = {f.key for f in faults}
        for fault in faults:
            if not self.config.report_pending_remap and fault.action is xid_policy.Action.REPORT:
                continue
            if (device.index, fault.key) in self._active:
                continue
            self._active[(device.index, fault.key)] = fault
            await self._publish(bus, device, device.uuid, reason=fault.reason, severity=fault.severity,
                                message=f"GPU {device.index} {device.uuid}: {fault.message}",
                                attributes={"class": "hardware"}, check=fault.key, recommended=fault.action,
                                dedupe_key=f"{self.name}/{fault.key}/{device.uuid}/active")
        for (index, key), fault in list(self._active.items()):
            if index != device.index or key in now_keys:
                continue
            del self._active[(index, key)]
            await self._publish(bus, device, device.uuid, reason=f"{fault.reason}Cleared",
                                severity=model.Severity.INFO,
                                message=f"GPU {device.index} {device.uuid}: {fault.reason} no longer reported",
                                attributes={"class": "hardware"}, check=key, cleared=True,
                                dedupe_key=f"{self.name}/{key}/{device.uuid}/cleared")

    # ------------------------------------------------------------------ publishing

    async def _pods_holding(self, ids: tuple[str, ...]) -> list[str]:
        """The pods holding any of `ids` (a GPU and its MIG instances), through the agent's lookup."""
        lookup = self.context.pod_lookup
        return [] if lookup is None else list(await lookup.pods_for_devices(list(ids)))

    async def _publish(self, bus: bus_.Bus, device: backend.DeviceInfo | None, uuid: str, *, reason: str,
                       severity: model.Severity, message: str, attributes: dict[str, Any], dedupe_key: str,
                       xid: int | None = None, check: str = "", recommended: model.Action | None = None,
                       cleared: bool = False, occurrences: int = 1, window_seconds: float = 0.0) -> None:
        node = self.context.node_name
        if device is not None:
            attributes = dict(attributes, pci_bus_id=device.pci_bus_id)
        pods: tuple[str, ...] = ()
        if not cleared:
            try:
                pods = tuple(await self._pods_holding((uuid, *self._mig.get(uuid, ()))))
            except Exception as exc:  # pod lookup is best effort; the fault is reported regardless
                log.warning("nvml_pod_lookup_failed", detector=self.name, gpu_uuid=uuid, error=str(exc))
        fault = model.Fault(xid=xid, gpu_index=device.index if device is not None else None, gpu_uuid=uuid,
                            check=check, pods=pods)
        event = model.CollectorEvent(
            detector=self.name, target=model.Target(kind=model.TargetKind.DEVICE, node=node, name=node,
                                                    device_id=uuid),
            severity=severity, reason=reason, message=message, observed_at=self.context.clock.now(),
            dedupe_key=dedupe_key, fault=fault, recommended=recommended, cleared=cleared,
            occurrences=occurrences, window_seconds=window_seconds, attributes=attributes)
        log.info("nvml_fault_observed", detector=self.name, reason=reason, gpu_uuid=uuid,
                 recommended_action=recommended.value if recommended else None, cleared=cleared)
        await bus.publish(event)


def mig_uuids(nvml: backend.Nvml, index: int) -> tuple[str, ...]:
    """Blocking: the UUIDs of GPU `index`'s MIG instances; () when MIG is off or not supported."""
    try:
        return tuple(m.uuid for m in nvml.mig_devices(index))
    except errors.NvmlError as exc:
        if exc.code == backend.CODE_NOT_SUPPORTED:
            return ()
        raise
