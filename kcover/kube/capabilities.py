"""What the API server offers kcover beyond the core APIs: discovered from the server, typed, said once.

Owns the discovery of the optional APIs kcover reads or writes, in the one place the cache, the agent,
the detectors and recovery ask:

* DRA ResourceSlices (`Capability.RESOURCE_SLICES`): the `resource.k8s.io` version serving
  `resourceslices`, most preferred first: v1 (Kubernetes 1.34 on), v1beta2 (1.33), v1beta1 (1.32),
  v1alpha3 (1.31). Before 1.34 the group is served only where the cluster enables it
  (`--runtime-config`); the v1alpha2 slices of 1.30 have another shape and are not read.
* DeviceTaintRules (`Capability.DEVICE_TAINT_RULES`, KEP-5055): the version serving `devicetaintrules`:
  v1, v1beta2 (1.36 with the `DRADeviceTaintRules` gate), v1alpha3 (1.33-1.35 with `DRADeviceTaints`).
* `allocatedResourcesStatus` (`Capability.ALLOCATED_RESOURCES_STATUS`, KEP-4680): whether core/v1
  `ContainerStatus` has the field in the server's OpenAPI v3 document (1.31 on). The kubelet fills it
  only with its `ResourceHealthStatus` gate (on by default from 1.36), and names DRA claims in it from 1.32.

Everything is asked of the server (`/apis/<group>`, `/apis/<group>/<version>`, `/openapi/v3/api/v1`);
no version string is compared. `discover()` answers all three as a `Capabilities`, `say()` logs it as
one `api_capabilities` line (with what kcover cannot do on this server) and sets the gauge
`kcover_api_capability{capability}`; `describe()` is the readiness detail. `served_version()` answers one
API for the callers that re-check on their own schedule (`locator()` for a reflector of a collection that
may not be served; the device-taint path in `recovery.devicetainting`).

It does not decide what kcover does without an API (the cache, the agent and recovery do). How it fails:
a 404 is "not served"; any other error is "unknown" (`Found.served` None, gauge -1, the error kept in
`Found.error`) from `discover()`, and an `errors.KubeError` from `served_version()` and a locator. Only
cancellation escapes `discover()`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from kcover import errors
from kcover import metrics as metrics_
from kcover.kube import client as client_

log = structlog.get_logger()


class Capability(enum.StrEnum):
    RESOURCE_SLICES = "resource_slices"
    DEVICE_TAINT_RULES = "device_taint_rules"
    ALLOCATED_RESOURCES_STATUS = "allocated_resources_status"


@dataclass(frozen=True)
class Api:
    """An optional API collection, and the versions kcover can use, most preferred first."""

    group: str
    plural: str
    versions: tuple[str, ...]

    def path(self, api_version: str) -> str:
        """`/apis/resource.k8s.io/v1beta1/resourceslices` for `resource.k8s.io/v1beta1`."""
        return f"/apis/{api_version}/{self.plural}"


RESOURCE_SLICES = Api("resource.k8s.io", "resourceslices", ("v1", "v1beta2", "v1beta1", "v1alpha3"))
"""The slice fields kcover reads (driver, pool, nodeName, device names and attributes) are in all four;
v1beta1 and v1alpha3 keep a device's attributes under `basic` (see `agent.dradevices`)."""
DEVICE_TAINT_RULES = Api("resource.k8s.io", "devicetaintrules", ("v1", "v1beta2", "v1alpha3"))
"""The rule's spec (deviceSelector driver/pool/device, taint key/value/effect) is the same in all three."""

OPENAPI_CORE = "/openapi/v3/api/v1"
CONTAINER_STATUS_SCHEMA = "io.k8s.api.core.v1.ContainerStatus"
ALLOCATED_RESOURCES_STATUS_FIELD = "allocatedResourcesStatus"

WITHOUT: Mapping[Capability, str] = {
    Capability.RESOURCE_SLICES: "GPU nodes are found by capacity only and agent faults name no DRA device",
    Capability.DEVICE_TAINT_RULES: "a faulty DRA device is isolated by acting on its node, not the device alone",
    Capability.ALLOCATED_RESOURCES_STATUS: "no device health from pod status: the dra_health detector sees none",
}
"""What kcover cannot do where a capability is not served (the `api_capabilities` log line)."""


class Found(NamedTuple):
    """One capability as the server answered."""

    served: bool | None
    """True served, False not served, None unknown (the discovery request failed)."""
    api_version: str = ""
    """For an API: the `group/version` kcover uses (`resource.k8s.io/v1beta1`); "" otherwise."""
    error: str = ""


@dataclass(frozen=True)
class Capabilities:
    """What one API server offered when asked (`discover()`)."""

    server: str
    """The server's `gitVersion` from /version, for the log ("" when it did not answer)."""
    found: Mapping[Capability, Found]

    def served(self, capability: Capability) -> bool | None:
        found = self.found.get(capability)
        return found.served if found is not None else None

    def api_version(self, capability: Capability) -> str:
        """The `group/version` serving it; "" when not served or unknown."""
        found = self.found.get(capability)
        return found.api_version if found is not None and found.served else ""

    def unavailable(self) -> list[Capability]:
        """The capabilities not served (unknown ones are not counted: they may be served)."""
        return [c for c in Capability if self.served(c) is False]

    def describe(self) -> str:
        """`resource_slices=resource.k8s.io/v1 device_taint_rules=no allocated_resources_status=yes` (the
        capabilities asked, in `Capability` order)."""
        return " ".join(f"{c.value}={_word(self.found[c])}" for c in Capability if c in self.found)


def _word(found: Found) -> str:
    if found.served is None:
        return "unknown"
    if not found.served:
        return "no"
    return found.api_version or "yes"


# ------------------------------------------------------------------------------------------- discovery

async def served_version(kube: client_.KubeClient, api: Api) -> str | None:
    """The `group/version` serving `api`, most preferred first, or None when none does (the group or every
    version answers 404, or lists no such resource). Raises `errors.KubeError` when the server did not say."""
    try:
        group = await kube.request("GET", f"/apis/{api.group}")
    except errors.NotFoundError:
        return None
    offered = {str(v.get("version")) for v in _list(_dict(group).get("versions")) if isinstance(v, dict)}
    for version in api.versions:
        if version not in offered:
            continue
        try:
            listing = await kube.request("GET", f"/apis/{api.group}/{version}")
        except errors.NotFoundError:
            continue  # listed by the group but gone since (a restart with another runtime-config)
        if any(isinstance(r, dict) and r.get("name") == api.plural for r in _list(_dict(listing).get("resources"))):
            return f"{api.group}/{version}"
    return None


async def has_allocated_resources_status(kube: client_.KubeClient) -> bool:
    """Whether core/v1 ContainerStatus has `allocatedResourcesStatus` in the server's OpenAPI v3 document.
    A server without OpenAPI v3 (404) has no such field; other failures raise `errors.KubeError`."""
    try:
        document = await kube.request("GET", OPENAPI_CORE)
    except errors.NotFoundError:
        return False
    schemas = _dict(_dict(_dict(document).get("components")).get("schemas"))
    properties = _dict(_dict(schemas.get(CONTAINER_STATUS_SCHEMA)).get("properties"))
    if not properties:
        raise errors.KubeError(f"{OPENAPI_CORE}: no {CONTAINER_STATUS_SCHEMA} schema with properties")
    return ALLOCATED_RESOURCES_STATUS_FIELD in properties


async def discover(kube: client_.KubeClient, *, asked: Iterable[Capability] = tuple(Capability)) -> Capabilities:
    """Ask the server about the `asked` capabilities (default all). The agent asks only for ResourceSlices:
    the `allocatedResourcesStatus` answer is a 1.6 MB document, not worth a fetch from every node."""
    found: dict[Capability, Found] = {}
    for capability in asked:
        try:
            if capability is Capability.ALLOCATED_RESOURCES_STATUS:
                found[capability] = Found(await has_allocated_resources_status(kube))
            else:
                api = RESOURCE_SLICES if capability is Capability.RESOURCE_SLICES else DEVICE_TAINT_RULES
                version = await served_version(kube, api)
                found[capability] = Found(version is not None, version or "")
        except errors.KubeError as exc:
            found[capability] = Found(None, error=str(exc))
    server = ""
    try:
        server = str(_dict(await kube.request("GET", "/version")).get("gitVersion") or "")
    except errors.KubeError:
        pass
    return Capabilities(server=server, found=found)


def say(capabilities: Capabilities, metrics: metrics_.Metrics) -> None:
    """One `api_capabilities` log line (what is served, and what kcover cannot do without the rest) and
    `kcover_api_capability{capability}` 1 / 0 / -1 (served, not served, unknown)."""
    for capability, found in capabilities.found.items():
        record(metrics, capability, found.served)
    unknown = {c.value: f.error for c, f in capabilities.found.items() if f.served is None}
    log.info("api_capabilities", server=capabilities.server,
             **{c.value: _word(f) for c, f in capabilities.found.items()},
             cannot=[f"{c.value}: {WITHOUT[c]}" for c in capabilities.unavailable()],
             **({"unknown": unknown} if unknown else {}))


def record(metrics: metrics_.Metrics, capability: Capability, served: bool | None) -> None:
    """Set `kcover_api_capability{capability}`: 1 served, 0 not served, -1 unknown."""
    metrics.api_capability.labels(capability=capability.value).set(-1 if served is None else int(served))


def locator(kube: client_.KubeClient, api: Api) -> Callable[[], Awaitable[str | None]]:
    """For `watching.Reflector(locate=...)`: the collection path of the version serving `api` now, or None
    when none does (the reflector then watches nothing and counts as synced, empty, until it asks again).
    Raises `errors.KubeError` when the server did not say (the reflector backs off and asks again)."""
    async def locate() -> str | None:
        version = await served_version(kube, api)
        return api.path(version) if version is not None else None
    return locate


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
