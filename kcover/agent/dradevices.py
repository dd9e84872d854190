"""GPU to DRA device on the agent's node: which device of which ResourceSlice a faulting GPU is.

Owns the agent's read of the DRA ResourceSlices of its own node (a list+watch of ResourceSlices with
the field selector `spec.nodeName=<node>`, through the shared reflector, in the `resource.k8s.io`
version the server serves: `kube.capabilities`; v1beta1 and v1alpha3 keep a device's attributes under
`basic`, v1beta2 and v1 on the device) and the mapping from a GPU UUID, as NVML and DCGM report it, to the devices those
slices publish. A DRA driver names each device's GPU in its attributes, as NVIDIA's GPU DRA driver
(`gpu.nvidia.com`) does: a whole GPU (`type: gpu`) carries `uuid` (`GPU-...`); a MIG device
(`type: mig`) carries its own `uuid` (`MIG-...`) and `parentUUID`, the GPU it is carved from. An
attribute may also be written qualified with the driver's domain (`gpu.nvidia.com/uuid`), which is
the same name. A GPU UUID therefore maps to the whole-GPU device with that `uuid` and to every MIG
device whose `parentUUID` it is: all of them sit on the faulting silicon. A MIG UUID maps to its one device.

`attach(event)` rewrites what a detector published: a fault on a GPU of a DRA device becomes one
report per device, each with `fault.dra` (driver, pool, device) and, when the kubelet's PodResources
answers, `fault.pods` of the pods holding that device. The controller then isolates the device rather
than the node (`recovery.policy`), after checking that a ResourceSlice of this node publishes it.

Untrusted input: a ResourceSlice is written by a DRA driver or anyone allowed to, so a malformed one
(attributes of the wrong shape, no name) contributes nothing for that device, and one GPU UUID
published by two devices (a forged or broken slice) maps to none: the fault goes out as before,
without a DRA device, and `dra_device_ambiguous` is logged. A node without slices (no DRA, the API
group not served, not yet synced) keeps the agent's node-level reports unchanged. Never raises to
its caller except cancellation; the reflector retries on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import structlog

from kcover import model
from kcover.kube import capabilities, watching
from kcover.kube import client as client_

log = structlog.get_logger()

PATH = capabilities.RESOURCE_SLICES.path("resource.k8s.io/v1")
"""Where the slices are read until discovery answers (`capabilities.locator`)."""
UUID = "uuid"
PARENT_UUID = "parentUUID"

PodsForDevices = Callable[[Sequence[str]], Awaitable[list[str]]]


class SliceDevice(NamedTuple):
    name: str
    uuid: str
    parent_uuid: str


class NodeSlice(NamedTuple):
    """A ResourceSlice of this node, reduced to what the mapping reads."""

    uid: str
    rv: str
    driver: str
    pool: str
    node: str
    devices: tuple[SliceDevice, ...]


def _d(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _string_attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str:
    """The string value of attribute `name` (or `<driver>/name`, the same in DRA), or ""."""
    for key in (name, f"{driver}/{name}"):
        value = _s(_d(attributes.get(key)).get("string"))
        if value:
            return value
    return ""


def project(raw: Mapping[str, Any]) -> NodeSlice | None:
    """One ResourceSlice -> its devices that name a GPU (pure; never raises on odd input)."""
    meta, spec = _d(raw.get("metadata")), _d(raw.get("spec"))
    driver, pool, uid = _s(spec.get("driver")), _s(_d(spec.get("pool")).get("name")), _s(meta.get("uid"))
    if not (driver and pool and uid):
        return None
    devices: list[SliceDevice] = []
    entries = spec.get("devices")
    for entry in entries if isinstance(entries, list) else []:
        name = _s(_d(entry).get("name"))
        attributes = _d(_d(entry).get("attributes")) or _d(_d(_d(entry).get("basic")).get("attributes"))
        uuid = _string_attribute(attributes, driver, UUID)
        parent = _string_attribute(attributes, driver, PARENT_UUID)
        if name and (uuid or parent):
            devices.append(SliceDevice(name, uuid, parent))
    return NodeSlice(uid, _s(meta.get("resourceVersion")), driver, pool, _s(spec.get("nodeName")), tuple(devices))


class Ambiguous(NamedTuple):
    """A UUID two devices claim as their own: no device is named."""

    uuid: str
    devices: tuple[str, ...]


def devices_for(slices: Iterable[NodeSlice], node: str, uuid: str) -> list[model.DraDevice] | Ambiguous:
    """The DRA devices of `node` that GPU (or MIG device) `uuid` is: the device whose `uuid` it is, and
    the MIG devices whose `parentUUID` it is (pure). Ambiguous when two devices claim the same `uuid`."""
    if not uuid:
        return []
    own: list[model.DraDevice] = []
    carved: list[model.DraDevice] = []
    for s in slices:
        if s.node != node:
            continue  # the field selector keeps others out; a slice moved to another node leaves
        for d in s.devices:
            if d.uuid != uuid and d.parent_uuid != uuid:
                continue
            try:
                device = model.DraDevice(driver=s.driver, pool=s.pool, device=d.name)
            except ValueError:
                continue  # a name past the API's limits: not a device kcover can name
            (own if d.uuid == uuid else carved).append(device)
    if len(own) > 1:
        return Ambiguous(uuid, tuple(sorted(d.resource_id for d in own)))
    return sorted(set(own + carved), key=lambda d: d.resource_id)


class DraDevices:
    """The DRA devices of this node's GPUs, from its ResourceSlices (list+watch), and `attach`."""

    def __init__(self, client: client_.KubeClient | None, node: str, *,
                 pods_for_devices: PodsForDevices | None = None,
                 options: watching.ReflectorOptions | None = None) -> None:
        self.node = node
        self._pods_for_devices = pods_for_devices
        self.reflector: watching.Reflector[NodeSlice] = watching.Reflector(
            client, PATH, project, sink=self._changed, name=f"resourceslices@{node}",
            options=options, query={"fieldSelector": f"spec.nodeName={node}"},
            locate=capabilities.locator(client, capabilities.RESOURCE_SLICES) if client is not None else None)
        self._said_ambiguous: set[str] = set()

    def _changed(self, old: NodeSlice | None, new: NodeSlice | None) -> None:
        if new is not None:
            log.info("dra_slice_read", node=self.node, driver=new.driver, pool=new.pool,
                     gpu_devices=len(new.devices))
        elif old is not None:
            log.info("dra_slice_gone", node=self.node, driver=old.driver, pool=old.pool)

    async def run(self, stop: asyncio.Event) -> None:
        await self.reflector.run(stop)

    def lookup(self, uuid: str) -> list[model.DraDevice]:
        found = devices_for(self.reflector.store.values(), self.node, uuid)
        if isinstance(found, Ambiguous):
            if uuid not in self._said_ambiguous:
                self._said_ambiguous.add(uuid)
                log.warning("dra_device_ambiguous", node=self.node, gpu_uuid=uuid, devices=list(found.devices),
                            why="more than one device of this node's ResourceSlices claims this uuid; the fault "
                                "is reported without a DRA device")
            return []
        return found

    async def attach(self, event: model.CollectorEvent) -> list[model.CollectorEvent]:
        """`event` as one report per DRA device its GPU is (with `fault.dra`, and `fault.pods` of each
        device's holders where the kubelet says), or `[event]` unchanged when it names no such GPU."""
        fault = event.fault
        if fault.dra is not None or not fault.gpu_uuid:
            return [event]
        devices = self.lookup(fault.gpu_uuid)
        if not devices:
            return [event]
        out: list[model.CollectorEvent] = []
        for device in devices:
            pods = fault.pods
            if not event.cleared and self._pods_for_devices is not None:
                try:
                    pods = tuple(await self._pods_for_devices([device.resource_id])) or fault.pods
                except Exception as exc:  # the pod lookup is best effort: the fault goes out regardless
                    log.warning("dra_pod_lookup_failed", node=self.node, device=device.resource_id, error=str(exc))
            key = f"{event.key}/{device.resource_id}"
            out.append(event.model_copy(update={
                "fault": fault.model_copy(update={"dra": device, "pods": pods}), "dedupe_key": key,
                "target": event.target.model_copy(update={"device_id": event.target.device_id or fault.gpu_uuid})}))
        log.info("dra_devices_attached", node=self.node, gpu_uuid=fault.gpu_uuid, reason=event.reason,
                 devices=[d.resource_id for d in devices])
        return out
