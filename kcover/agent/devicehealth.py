"""A DRA device's return to service, on the agent: when a device it reported faulty is healthy again.

Owns the agent's table of faults per DRA device (`fault.dra`, filled in by `dradevices.DraDevices.attach`)
and the rule that ends them, the same hold the agent's Node condition uses
(`agent.condition_hold_seconds`): a fault without a `check` (an XID) ends when it has not recurred for
the hold; one with a `check` (a health poll, a DCGM check) when its detector publishes it cleared and
it stays cleared for the hold, a recurrence starting it over. Only faults whose Event asks the
controller to act (`codec.needs_recovery`), the ones that may have tainted the device, are tracked.
When every fault of a device has ended, `healthy` hands the device back once and forgets it, and
`healthy_event` is what the reporter writes for it: a cleared Info about the device, encoded with
`kcover.io/device-healthy` (`codec.encode_annotations(..., device_healthy=True)`), on which the
controller removes kcover's DeviceTaintRule of that device.

Pure: no I/O, no clock of its own (callers pass monotonic seconds), never raises on odd events. What
it does not do: write anything, retry, rate-limit (the reporter does), or survive an agent restart
(the table is in memory; a device tainted before a restart is not spoken for after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kcover import codec, model

HEALTHY_REASON = "GPUDeviceHealthy"


@dataclass
class Ending:
    """One fault of a device: active until cleared (faults with a check), then held."""

    active: bool
    cleared_at: float | None
    """Monotonic seconds when last seen cleared (faults without a check: when last seen)."""


@dataclass
class Device:
    """A DRA device with faults the agent reported, and what the healthy report says about it."""

    dra: model.DraDevice
    node: str
    detector: str
    gpu_uuid: str
    gpu_index: int | None
    faults: dict[str, Ending] = field(default_factory=dict)


def _key(event: model.CollectorEvent) -> str:
    fault = event.fault
    return f"{event.detector}/{fault.check or event.reason}/{'' if fault.xid is None else fault.xid}"


def apply(devices: dict[str, Device], event: model.CollectorEvent, now: float) -> bool:
    """Fold one event into the table (pure but for mutating it). True when it is a fault on a device,
    so a healthy report for that device not yet written is void."""
    dra = event.fault.dra
    if dra is None:
        return False
    if not event.cleared:
        if not codec.needs_recovery(event):
            return False
        node = event.target.node or event.target.name
        device = devices.setdefault(dra.resource_id, Device(dra, node, event.detector, event.fault.gpu_uuid,
                                                            event.fault.gpu_index))
        persistent = bool(event.fault.check)
        device.faults[_key(event)] = Ending(active=persistent, cleared_at=None if persistent else now)
        return True
    if not event.fault.check:
        return False  # faults without a check end by not recurring; their cleared reports say nothing more
    known = devices.get(dra.resource_id)
    ending = known.faults.get(_key(event)) if known is not None else None
    if ending is not None and ending.active:
        ending.active, ending.cleared_at = False, now
    return False


def healthy(devices: dict[str, Device], now: float, hold_seconds: float) -> list[Device]:
    """The devices every fault of which stayed ended for longer than `hold_seconds`, removed from the
    table (each is handed back once)."""
    done = [d for d in devices.values()
            if all(not e.active and e.cleared_at is not None and now - e.cleared_at > hold_seconds
                   for e in d.faults.values())]
    for device in done:
        del devices[device.dra.resource_id]
    return sorted(done, key=lambda d: d.dra.resource_id)


def healthy_event(device: Device, hold_seconds: float) -> model.CollectorEvent:
    """The report that `device` is healthy again (the reporter writes it with `device_healthy=True`)."""
    gpu = f" (GPU {device.gpu_uuid})" if device.gpu_uuid else ""
    return model.CollectorEvent(
        detector=device.detector, severity=model.Severity.INFO, reason=HEALTHY_REASON,
        message=f"DRA device {device.dra.resource_id}{gpu} is healthy again: no fault for {hold_seconds:g}s",
        target=model.Target(kind=model.TargetKind.DEVICE, node=device.node, name=device.node,
                            device_id=device.gpu_uuid),
        fault=model.Fault(gpu_uuid=device.gpu_uuid, gpu_index=device.gpu_index, dra=device.dra),
        cleared=True, dedupe_key=f"{HEALTHY_REASON}/{device.dra.resource_id}")
