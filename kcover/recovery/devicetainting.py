"""Device-level isolation under DRA: kcover's DeviceTaintRules (KEP-5055), and whether the server has them.

Owns three things. Whether the server serves DeviceTaintRules, and in which version (asked of
`kube.capabilities`, which knows the versions: v1, v1beta2, v1alpha3), re-checked every
`recovery.device_taints.discovery_interval_seconds`. The
rule kcover writes for one device: one cluster-scoped DeviceTaintRule per device, named from a hash
of `driver/pool/device`, selecting exactly that driver, pool and device, with taint
`recovery.device_taints.key` and `.effect`, labelled `app.kubernetes.io/managed-by: kcover` and
annotated with the device and its node. Removal: only a rule carrying kcover's label and the same
device annotation is deleted (with its uid and resourceVersion as preconditions); a rule a person or
another tool wrote for the device is never touched.

It does not decide when to taint (the plan does; where DeviceTaintRules are not served it plans the
node-level answer instead). How it fails: API errors other than 404 and
409 propagate as `errors.KubeError`; a failed discovery counts as "not served" until the next check.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable

import structlog

from kcover import errors, metrics, model, settings
from kcover.aio import clock as clock_
from kcover.kube import capabilities, gateway
from kcover.kube import client as kube_client

log = structlog.get_logger()

PLURAL = capabilities.DEVICE_TAINT_RULES.plural
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kcover"
DEVICE_ANNOTATION = "kcover.io/device"
NODE_ANNOTATION = "kcover.io/node"
REASON_ANNOTATION = "kcover.io/taint-reason"
CAUSE_ANNOTATION = "kcover.io/cause"


class Outcome(enum.StrEnum):
    CREATED = "created"
    EXISTS = "exists"
    """kcover's rule for the device was already there (a replay, or another fault on the same device)."""
    FOREIGN = "foreign"
    """A rule of that name exists but is not kcover's: left alone, the device counted as not isolated."""
    REMOVED = "removed"
    ABSENT = "absent"
    """No rule of kcover's for the device: nothing to remove."""
    UNSERVED = "unserved"
    """The API server serves no DeviceTaintRules."""


def rule_name(device: model.DraDevice) -> str:
    """The name of kcover's rule for `device`: stable, a valid DNS subdomain whatever the device names."""
    digest = hashlib.sha256(device.resource_id.encode()).hexdigest()[:20]
    return f"kcover-device-{digest}"


def rule_body(device: model.DraDevice, *, node: str, api_version: str, key: str,
              effect: settings.DeviceTaintEffect, reason: str, cause: str) -> gateway.SpecBody:
    """The DeviceTaintRule kcover writes for one device (pure)."""
    return {
        "apiVersion": api_version, "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(device), "labels": {MANAGED_BY: MANAGER},
                     "annotations": {DEVICE_ANNOTATION: device.resource_id, NODE_ANNOTATION: node,
                                     REASON_ANNOTATION: model.fit(reason, 512), CAUSE_ANNOTATION: cause}},
        "spec": {"deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
                 "taint": {"key": key, "value": taint_value(reason), "effect": effect.value}},
    }


def taint_value(reason: str) -> str:
    """A label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends) from the fault's reason."""
    head = reason.split(":", 1)[0]
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in head)[:63]
    return cleaned.strip("._-")


def is_ours(rule: gateway.SpecBody, device: model.DraDevice) -> bool:
    meta = rule.get("metadata") or {}
    return ((meta.get("labels") or {}).get(MANAGED_BY) == MANAGER
            and (meta.get("annotations") or {}).get(DEVICE_ANNOTATION) == device.resource_id)


class DeviceTaints:
    """Writes and removes kcover's DeviceTaintRules through the gateway; knows whether the server serves them."""

    def __init__(self, kube: kube_client.KubeClient, gw: gateway.Gateway, *,
                 options: Callable[[], settings.DeviceTaintSettings], metrics_: metrics.Metrics,
                 clock: clock_.Clock) -> None:
        self._kube = kube
        self._gw = gw
        self._options = options
        self.metrics = metrics_
        self._clock = clock
        self._version: str | None = None
        self._checked_at: float | None = None
        self.unserved_said = False
        """Whether the node-level answer was announced (an Event, once per process and each time it stops being
        served)."""

    # ------------------------------------------------------------------------------------ discovery

    @property
    def known_served(self) -> bool:
        """The last discovery found DeviceTaintRules served (True before the first one: the plan then taints,
        and the executor finds out)."""
        return self._checked_at is None or self._version is not None

    async def served_version(self) -> str | None:
        """`resource.k8s.io/<version>` serving DeviceTaintRules, or None; cached for the discovery interval."""
        now = self._clock.monotonic()
        if self._checked_at is not None and now - self._checked_at < self._options().discovery_interval_seconds:
            return self._version
        found = await self._discover()
        if found != self._version or self._checked_at is None:
            log.info("device_taints_discovered", served=found or "none")
        if found is not None:
            self.unserved_said = False
        self._version, self._checked_at = found, now
        self.metrics.device_taints_served.set(1 if found else 0)
        capabilities.record(self.metrics, capabilities.Capability.DEVICE_TAINT_RULES, found is not None)
        return found

    async def _discover(self) -> str | None:
        try:
            return await capabilities.served_version(self._kube, capabilities.DEVICE_TAINT_RULES)
        except errors.KubeError as exc:
            log.warning("device_taint_discovery_failed", error=str(exc))
            return None

    # ------------------------------------------------------------------------------------ writes

    async def taint(self, device: model.DraDevice, *, node: str, reason: str, cause: str) -> Outcome:
        api_version = await self.served_version()
        if api_version is None:
            return Outcome.UNSERVED
        options = self._options()
        body = rule_body(device, node=node, api_version=api_version, key=options.key, effect=options.effect,
                         reason=reason, cause=cause)
        try:
            await self._gw.create_device_taint_rule(api_version, body)
            return Outcome.CREATED
        except errors.ConflictError:  # AlreadyExists: ours from before, or someone else's of that name
            existing = await self._gw.get_device_taint_rule(api_version, rule_name(device))
            return Outcome.EXISTS if existing is not None and is_ours(existing, device) else Outcome.FOREIGN

    async def untaint(self, device: model.DraDevice) -> Outcome:
        api_version = await self.served_version()
        if api_version is None:
            return Outcome.UNSERVED
        existing = await self._gw.get_device_taint_rule(api_version, rule_name(device))
        if existing is None:
            return Outcome.ABSENT
        if not is_ours(existing, device):
            return Outcome.FOREIGN
        try:
            await self._gw.delete_device_taint_rule(api_version, rule_name(device),
                                                    existing.get("metadata", {}).get("uid", ""))
        except errors.ConflictError:  # changed since read: leave it to the next cleared event
            return Outcome.FOREIGN
        return Outcome.REMOVED
