"""Which DRA device a faulting GPU is: ResourceSlices as NVIDIA's GPU DRA driver publishes them, and bad ones.

Tables over the pure parts (`project`, `devices_for`), then `attach` on a `DraDevices` loaded through
its reflector's own list path, and the reporter's rule that a DRA device's fault leaves the node's
condition alone. The end-to-end path (agent, API server, controller) is
tests/integration/agent/test_dra_device_mapping.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from kcover import model
from kcover.agent import dradevices, reporting

DRIVER = "gpu.nvidia.com"
NODE = "gpu-node-1"


def _slice(devices: list[dict[str, Any]], *, uid: str = "s1", node: str = NODE, pool: str = NODE,
           driver: str = DRIVER) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-{driver}", "uid": uid, "resourceVersion": "7"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": 1,
                                                                   "resourceSliceCount": 1}, "devices": devices}}


def _gpu(index: int, uuid: str) -> dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                                                   "index": {"int": index}}}


def _mig(index: int, uuid: str, parent: str) -> dict[str, Any]:
    """A MIG device as the driver names it (`gpu-<minor>-mig-<profile>-<start>-<size>`)."""
    return {"name": f"gpu-{index}-mig-19-{uuid[-1]}-1", "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": uuid}, "parentUUID": {"string": parent},
        "profile": {"string": "1g.10gb"}}}


def _dev(name: str, pool: str = NODE) -> model.DraDevice:
    return model.DraDevice(driver=DRIVER, pool=pool, device=name)


def _map(raw: list[dict[str, Any]], uuid: str) -> list[model.DraDevice] | dradevices.Ambiguous:
    slices = [s for s in (dradevices.project(r) for r in raw) if s is not None]
    return dradevices.devices_for(slices, NODE, uuid)


MIXED = _slice([_gpu(0, "GPU-a"), _gpu(1, "GPU-b"), _mig(1, "MIG-b0", "GPU-b"), _mig(1, "MIG-b1", "GPU-b")])

BASIC = _slice([{"name": d["name"], "basic": {"attributes": d["attributes"]}}
                for d in (_gpu(0, "GPU-a"), _mig(1, "MIG-b0", "GPU-b"))])
"""A ResourceSlice as resource.k8s.io/v1beta1 and v1alpha3 carry it: each device's attributes under `basic`."""

CASES = [
    ("whole GPU", [MIXED], "GPU-a", [_dev("gpu-0")]),
    ("a MIG device by its own UUID", [MIXED], "MIG-b1", [_dev("gpu-1-mig-19-1-1")]),
    ("a GPU: itself and the MIG devices carved from it", [MIXED], "GPU-b",
     [_dev("gpu-1"), _dev("gpu-1-mig-19-0-1"), _dev("gpu-1-mig-19-1-1")]),
    ("unknown UUID", [MIXED], "GPU-z", []),
    ("empty UUID", [MIXED], "", []),
    ("qualified attribute name", [_slice([{"name": "gpu-3", "attributes": {
        f"{DRIVER}/uuid": {"string": "GPU-q"}}}])], "GPU-q", [_dev("gpu-3")]),
    ("another node's slice", [_slice([_gpu(0, "GPU-a")], node="other")], "GPU-a", []),
    ("uuid not a string", [_slice([{"name": "gpu-0", "attributes": {"uuid": {"int": 5}}}])], "5", []),
    ("attributes not a map", [_slice([{"name": "gpu-0", "attributes": ["uuid", "GPU-a"]}])], "GPU-a", []),
    ("device without a name", [_slice([{"attributes": {"uuid": {"string": "GPU-a"}}}])], "GPU-a", []),
    ("devices not a list", [_slice({"gpu-0": 1})], "GPU-a", []),  # type: ignore[arg-type]
    ("v1beta1 and v1alpha3 slices (1.31-1.33): attributes under `basic`", [BASIC], "GPU-b",
     [_dev("gpu-1-mig-19-0-1")]),
    ("a v1beta1 whole GPU", [BASIC], "GPU-a", [_dev("gpu-0")]),
    ("a device name past the API's limits", [_slice([_gpu(0, "GPU-a") | {"name": "g" * 300}])], "GPU-a", []),
    ("slice without a driver", [_slice([_gpu(0, "GPU-a")], driver="")], "GPU-a", []),
    ("two devices claim one UUID", [_slice([_gpu(0, "GPU-a")]), _slice([_gpu(7, "GPU-a")], uid="s2", pool="p2")],
     "GPU-a", dradevices.Ambiguous("GPU-a", (f"{DRIVER}/{NODE}/gpu-0", f"{DRIVER}/p2/gpu-7"))),
]


@pytest.mark.parametrize(("raw", "uuid", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_gpu_uuid_maps_to_the_dra_devices_its_node_publishes(raw: list[dict[str, Any]], uuid: str,
                                                                want: Any) -> None:
    assert _map(raw, uuid) == want


@pytest.mark.parametrize("raw", [{}, {"metadata": None, "spec": "x"}, {"spec": {"driver": 3}}, []])
def test_a_malformed_slice_projects_to_nothing(raw: Any) -> None:
    assert dradevices.project(raw if isinstance(raw, dict) else {"spec": raw}) is None


def _event(uuid: str, *, cleared: bool = False, pods: tuple[str, ...] = ()) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="nvml", severity=model.Severity.INFO if cleared else model.Severity.ERROR, reason="XID79",
        target=model.Target(kind=model.TargetKind.DEVICE, node=NODE, name=NODE, device_id=uuid),
        fault=model.Fault(xid=79, gpu_index=1, gpu_uuid=uuid, pods=pods), cleared=cleared,
        recommended=None if cleared else model.Action.CORDON_NODE_AND_RESTART)


def _loaded(raw: list[dict[str, Any]], holders: dict[str, list[str]] | None = None) -> dradevices.DraDevices:
    async def pods_for_devices(ids: Any) -> list[str]:
        return [p for i in ids for p in (holders or {}).get(i, [])]

    devices = dradevices.DraDevices(None, NODE, pods_for_devices=pods_for_devices)
    devices.reflector.load(raw)
    return devices


async def test_attach_reports_one_fault_per_device_with_its_holders() -> None:
    devices = _loaded([MIXED], {f"{DRIVER}/{NODE}/gpu-1-mig-19-0-1": ["ml/a-0"],
                                f"{DRIVER}/{NODE}/gpu-1-mig-19-1-1": ["ml/b-0"]})
    out = await devices.attach(_event("GPU-b"))
    assert [(e.fault.dra.device if e.fault.dra else None, e.fault.pods) for e in out] == [
        ("gpu-1", ()), ("gpu-1-mig-19-0-1", ("ml/a-0",)), ("gpu-1-mig-19-1-1", ("ml/b-0",))]
    assert len({e.key for e in out}) == 3, "each device's report keeps a key of its own"
    assert all(e.fault.xid == 79 and e.recommended is model.Action.CORDON_NODE_AND_RESTART for e in out)


async def test_attach_leaves_a_gpu_without_a_dra_device_as_it_was() -> None:
    event = _event("GPU-z", pods=("ml/x-0",))
    assert await _loaded([MIXED]).attach(event) == [event]
    unsynced = _event("GPU-a")
    assert await _loaded([]).attach(unsynced) == [unsynced]  # no slices (no DRA, or not listed yet)


async def test_attach_keeps_the_pods_the_node_named_when_the_device_lookup_finds_none() -> None:
    out = await _loaded([MIXED]).attach(_event("GPU-a", pods=("ml/x-0",)))
    assert [(e.fault.dra, e.fault.pods) for e in out] == [(_dev("gpu-0"), ("ml/x-0",))]


async def test_an_ambiguous_uuid_is_reported_without_a_device() -> None:
    raw = [_slice([_gpu(0, "GPU-a")]), _slice([_gpu(1, "GPU-a")], uid="s2", pool="forged")]
    out = await _loaded(raw).attach(_event("GPU-a"))
    assert [e.fault.dra for e in out] == [None]


def test_a_dra_devices_node_level_fault_leaves_the_node_condition_alone() -> None:
    faults: dict[str, reporting.Fault] = {}
    on_device = _event("GPU-a").model_copy(update={"fault": _event("GPU-a").fault.model_copy(
        update={"dra": _dev("gpu-0")})})
    reporting.apply(faults, on_device, 0.0)
    assert faults == {}
    reporting.apply(faults, _event("GPU-a"), 0.0)  # the same fault on a GPU without DRA: the node's
    assert len(faults) == 1


def test_a_node_level_fault_reported_before_the_slices_were_read_still_clears() -> None:
    """A health fault seen before the agent listed its slices is the node's; its end, reported once the
    GPU maps to a device, must still clear it, or the condition would stay False."""
    faults: dict[str, reporting.Fault] = {}
    lost = model.CollectorEvent(
        detector="nvml", severity=model.Severity.ERROR, reason="GPULost",
        target=model.Target(kind=model.TargetKind.DEVICE, node=NODE, name=NODE, device_id="GPU-a"),
        fault=model.Fault(gpu_index=0, gpu_uuid="GPU-a", check="gpu_lost"), recommended=model.Action.CORDON_NODE)
    reporting.apply(faults, lost, 0.0)
    cleared = lost.model_copy(update={"cleared": True, "recommended": None, "severity": model.Severity.INFO,
                                      "fault": lost.fault.model_copy(update={"dra": _dev("gpu-0")})})
    reporting.apply(faults, cleared, 1.0)
    assert [f.active for f in faults.values()] == [False]
    assert reporting.condition(faults, 10.0, 5.0).status == reporting.condition({}, 0.0, 5.0).status
