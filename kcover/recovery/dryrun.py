"""Dry run as a gateway: decide and record exactly as for real, change nothing a workload or node feels.

Owns `DryRun`, a `kube.gateway.Gateway` over the real one. What a person reads passes through: Events
(with a reason and message of their own, `KcoverDryRun...` / "dry run, nothing was changed: ...", so no
alert or script mistakes them for the real action) and Recovery resources (marked `decision.dryRun`, and
in phase `RecordOnly` with cause `DryRun` where the real run's would say it acted: `dry_status`). What acts is recorded in
`would` and not sent: node rewrites, labels and conditions, evictions and deletes, DeviceTaintRules, the
controls ConfigMap. The ledger is kept in memory over the real one (`_Overlay`): a dry run honours
cooldowns, budgets and signals it recorded itself, as the real run would act once, without writing.

So recovery has no dry-run branch: the controller always writes through this gateway, and `active()`
(`recovery.dry_run`, live) says whether it records or passes every call through to the real one; this is
the one place that reads the setting. Turned off, what it kept is dropped (`changed()` tells the engine
to read the ledger again). It fails as the real gateway does for the reads it passes through.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcover import errors, model
from kcover.kube import gateway
from kcover.recovery import recoveries

EVENT_PREFIX = "dry run, nothing was changed: "
ACTED_PHASES = frozenset({recoveries.Phase.ACTING, recoveries.Phase.VERIFYING, recoveries.Phase.RECOVERED,
                          recoveries.Phase.STALLED})
"""The phases that say kcover acted (or is acting): a dry run's Recovery never reads so."""
DRY_CAUSE = "DryRun"
RECORDS_KEPT = 10_000
"""Dry-run Recoveries remembered, so a verifier's later phase does not rewrite one (oldest forgotten first)."""


@dataclass(frozen=True)
class Write:
    """One write a dry run did not send: the gateway call and what it was about."""

    call: str
    about: str
    detail: str = ""


def dry_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """A Recovery status that says the action was taken, as the dry run's: `RecordOnly`, cause `DryRun`, the
    message prefixed as the Events' are, and no acted, recovered or MTTR figure (nothing was done)."""
    out = {k: v for k, v in status.items() if k not in ("actedAt", "recoveredAt", "mttrSeconds")}
    out["phase"] = recoveries.Phase.RECORDED.value
    out["cause"] = DRY_CAUSE
    out["message"] = model.fit(EVENT_PREFIX + str(status.get("message", "")), 1024)
    return out


def dry_reason(reason: str) -> str:
    """`KcoverRestartedWorkload` -> `KcoverDryRunRestartedWorkload`: a reason no real action uses."""
    rest = reason.removeprefix("Kcover")
    return model.fit(f"KcoverDryRun{rest}", model.NAME_MAX, suffix="")


class _Overlay:
    """Objects a dry run created or changed, kept in memory over what the real API server holds."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], gateway.DataBody] = {}
        self.deleted: set[tuple[str, str]] = set()
        self._rv = itertools.count(1)

    def stamp(self, body: gateway.DataBody) -> gateway.DataBody:
        out = copy.deepcopy(body)
        meta = out.setdefault("metadata", {})
        meta["resourceVersion"] = f"dry-run-{next(self._rv)}"
        key = (meta.get("namespace", ""), meta.get("name", ""))
        self.objects[key] = out
        self.deleted.discard(key)
        return copy.deepcopy(out)

    def read(self, namespace: str, name: str, real: gateway.DataBody | None) -> gateway.DataBody | None:
        key = (namespace, name)
        if key in self.deleted:
            return None
        found = self.objects.get(key)
        return copy.deepcopy(found) if found is not None else real

    def check(self, body: gateway.DataBody, real: gateway.DataBody | None) -> None:
        """The precondition a replace would meet: the resourceVersion the writer read."""
        meta = body.get("metadata", {})
        current = self.read(meta.get("namespace", ""), meta.get("name", ""), real)
        if current is None:
            raise errors.NotFoundError(f"{meta.get('name')}: not found (dry run)", status=404)
        if current.get("metadata", {}).get("resourceVersion") != meta.get("resourceVersion"):
            raise errors.ConflictError(f"{meta.get('name')}: the object has been modified (dry run)", status=409)


class DryRun:
    """`Gateway` that, while `active()`, writes Events and Recoveries through `real` and records everything
    else in `would`; inactive, it is `real`."""

    def __init__(self, real: gateway.Gateway, *, active: Callable[[], bool] = lambda: True) -> None:
        self._real = real
        self._active = active
        self._was = active()
        self.would: list[Write] = []
        """The writes not sent, oldest first (for tests and diagnostics)."""
        self._clear()

    def _clear(self) -> None:
        self._ledger = _Overlay()
        self._config_maps = _Overlay()
        self._rules: dict[str, gateway.SpecBody] = {}
        self._nodes: dict[str, gateway.NodeBody] = {}
        self._records: dict[tuple[str, str], None] = {}
        """Recoveries whose status this dry run wrote as `dry_status` (insertion-ordered, bounded)."""

    @property
    def dry(self) -> bool:
        """Recording rather than writing now."""
        now = self._active()
        if now != self._was:
            self._was = now
            self._clear()
        return now

    def changed(self) -> bool:
        """Whether `active()` changed since the last look (then what the dry run kept was dropped)."""
        before = self._was
        return self.dry != before

    def _note(self, call: str, about: str, detail: str = "") -> None:
        self.would.append(Write(call, about, detail))

    # ------------------------------------------------------------------------------------ audit

    async def post_event(self, body: gateway.EventBody) -> None:
        if not self.dry:
            return await self._real.post_event(body)
        out = copy.deepcopy(body)
        out["reason"] = dry_reason(body.get("reason", ""))
        out["action"] = model.fit(f"DryRun{body.get('action', '')}", model.NAME_MAX, suffix="")
        out["message"] = model.fit(EVENT_PREFIX + body.get("message", ""), model.MESSAGE_MAX)
        await self._real.post_event(out)

    async def recovery_status_subresource(self) -> bool:
        return await self._real.recovery_status_subresource()

    async def create_recovery(self, body: gateway.SpecBody) -> None:
        if self.dry:  # the record says what kcover would have done: marked so nobody reads it as done
            body = copy.deepcopy(body)
            body.setdefault("spec", {}).setdefault("decision", {})["dryRun"] = True
            meta = body.get("metadata") or {}
            status = self._dry((str(meta.get("namespace", "")), str(meta.get("name", ""))), body.get("status") or {})
            if status is None:
                body.pop("status", None)
            elif status:
                body["status"] = dict(status)
        await self._real.create_recovery(body)

    async def patch_recovery_status(self, namespace: str, name: str, status: Mapping[str, Any], *,
                                    subresource: bool) -> None:
        dry = self._dry((namespace, name), status)
        if dry is not None:
            await self._real.patch_recovery_status(namespace, name, dry, subresource=subresource)

    def _dry(self, key: tuple[str, str], status: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The status a Recovery gets: as given, or while dry an acted phase as `dry_status`; None when this
        dry run already wrote that Recovery's (the verifier's Recovered would read as done)."""
        if not (self.dry and status.get("phase") in ACTED_PHASES):
            return status
        if key in self._records:
            return None
        self._records[key] = None
        while len(self._records) > RECORDS_KEPT:
            del self._records[next(iter(self._records))]
        return dry_status(status)

    async def list_recoveries(self, *, limit: int, continue_token: str = "") -> tuple[list[gateway.SpecBody], str]:
        return await self._real.list_recoveries(limit=limit, continue_token=continue_token)

    async def delete_recovery(self, namespace: str, name: str) -> None:
        await self._real.delete_recovery(namespace, name)

    # ------------------------------------------------------------------------------------ nodes

    async def get_node(self, name: str) -> gateway.NodeBody:
        if not self.dry:
            return await self._real.get_node(name)
        held = self._nodes.get(name)
        return copy.deepcopy(held) if held is not None else await self._real.get_node(name)

    async def replace_node(self, body: gateway.NodeBody) -> gateway.NodeBody:
        if not self.dry:
            return await self._real.replace_node(body)
        name = body.get("metadata", {}).get("name", "")
        self._note("replace_node", f"Node {name}")
        self._nodes[name] = copy.deepcopy(body)
        return copy.deepcopy(body)

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        if not self.dry:
            return await self._real.patch_node_labels(name, labels)
        self._note("patch_node_labels", f"Node {name}", ",".join(f"{k}={v}" for k, v in sorted(labels.items())))

    async def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        if not self.dry:
            return await self._real.patch_node_annotations(name, annotations)
        self._note("patch_node_annotations", f"Node {name}",
                   ",".join(f"{k}={v}" for k, v in sorted(annotations.items())))

    async def patch_node_conditions(self, name: str, conditions: Sequence[gateway.NodeConditionBody]) -> None:
        if not self.dry:
            return await self._real.patch_node_conditions(name, conditions)
        self._note("patch_node_conditions", f"Node {name}", ",".join(f"{c['type']}={c['status']}" for c in conditions))

    # ------------------------------------------------------------------------------------ pods

    async def evict_pod(self, namespace: str, name: str, uid: str) -> gateway.Removal:
        if not self.dry:
            return await self._real.evict_pod(namespace, name, uid)
        self._note("evict_pod", f"Pod {namespace}/{name}", uid)
        return gateway.Removal.REMOVED

    async def delete_pod(self, namespace: str, name: str, uid: str) -> gateway.Removal:
        if not self.dry:
            return await self._real.delete_pod(namespace, name, uid)
        self._note("delete_pod", f"Pod {namespace}/{name}", uid)
        return gateway.Removal.REMOVED

    # ------------------------------------------------------------------------------------ ledger

    async def ledger_served(self, namespace: str) -> bool:
        return await self._real.ledger_served(namespace)  # a dry run keeps its ledger over the real one

    async def list_ledger_entries(self, namespace: str, ledger: str) -> list[gateway.DataBody]:
        if not self.dry:
            return await self._real.list_ledger_entries(namespace, ledger)
        real = {item.get("metadata", {}).get("name", ""): item
                for item in await self._real.list_ledger_entries(namespace, ledger)}
        names = set(real) | {name for (ns, name) in self._ledger.objects if ns == namespace}
        out = []
        for name in sorted(names):
            found = self._ledger.read(namespace, name, real.get(name))
            if found is not None and found.get("metadata", {}).get("labels", {}).get(gateway.LEDGER_LABEL) == ledger:
                out.append(found)
        return out

    async def get_ledger_entry(self, namespace: str, name: str) -> gateway.DataBody | None:
        if not self.dry:
            return await self._real.get_ledger_entry(namespace, name)
        if (namespace, name) in self._ledger.objects or (namespace, name) in self._ledger.deleted:
            return self._ledger.read(namespace, name, None)
        return await self._real.get_ledger_entry(namespace, name)

    async def create_ledger_entry(self, body: gateway.DataBody) -> gateway.DataBody:
        if not self.dry:
            return await self._real.create_ledger_entry(body)
        meta = body.get("metadata", {})
        if await self.get_ledger_entry(meta.get("namespace", ""), meta.get("name", "")) is not None:
            raise errors.ConflictError(f"ledger entry {meta.get('name')} already exists (dry run)", status=409)
        return self._ledger.stamp(body)

    async def replace_ledger_entry(self, body: gateway.DataBody) -> gateway.DataBody:
        if not self.dry:
            return await self._real.replace_ledger_entry(body)
        meta = body.get("metadata", {})
        self._ledger.check(body, await self._real_entry(meta.get("namespace", ""), meta.get("name", "")))
        return self._ledger.stamp(body)

    async def delete_ledger_entry(self, namespace: str, name: str, resource_version: str) -> None:
        if not self.dry:
            return await self._real.delete_ledger_entry(namespace, name, resource_version)
        self._ledger.objects.pop((namespace, name), None)
        self._ledger.deleted.add((namespace, name))

    async def _real_entry(self, namespace: str, name: str) -> gateway.DataBody | None:
        if (namespace, name) in self._ledger.objects:
            return None
        return await self._real.get_ledger_entry(namespace, name)

    # ------------------------------------------------------------------------------------ controls

    async def get_config_map(self, namespace: str, name: str) -> gateway.DataBody | None:
        if not self.dry:
            return await self._real.get_config_map(namespace, name)
        if (namespace, name) in self._config_maps.objects:
            return self._config_maps.read(namespace, name, None)
        return await self._real.get_config_map(namespace, name)

    async def create_config_map(self, body: gateway.DataBody) -> gateway.DataBody:
        if not self.dry:
            return await self._real.create_config_map(body)
        meta = body.get("metadata", {})
        self._note("create_config_map", f"ConfigMap {meta.get('namespace')}/{meta.get('name')}")
        return self._config_maps.stamp(body)

    async def replace_config_map(self, body: gateway.DataBody) -> gateway.DataBody:
        if not self.dry:
            return await self._real.replace_config_map(body)
        meta = body.get("metadata", {})
        self._note("replace_config_map", f"ConfigMap {meta.get('namespace')}/{meta.get('name')}")
        return self._config_maps.stamp(body)

    # ------------------------------------------------------------------------------------ devices

    async def get_device_taint_rule(self, api_version: str, name: str) -> gateway.SpecBody | None:
        if not self.dry:
            return await self._real.get_device_taint_rule(api_version, name)
        if name in self._rules:
            return copy.deepcopy(self._rules[name])
        return await self._real.get_device_taint_rule(api_version, name)

    async def create_device_taint_rule(self, api_version: str, body: gateway.SpecBody) -> None:
        if not self.dry:
            return await self._real.create_device_taint_rule(api_version, body)
        name = body.get("metadata", {}).get("name", "")
        self._note("create_device_taint_rule", f"DeviceTaintRule {name}")
        self._rules[name] = copy.deepcopy(body)

    async def delete_device_taint_rule(self, api_version: str, name: str, uid: str) -> None:
        if not self.dry:
            return await self._real.delete_device_taint_rule(api_version, name, uid)
        self._note("delete_device_taint_rule", f"DeviceTaintRule {name}")
        self._rules.pop(name, None)
