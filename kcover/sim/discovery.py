"""Discovery documents of the simulated API server: /version, /api, /api/v1, /apis, /apis/<g>/<v>.

Owns the shapes kubectl and client libraries read to find resources (APIVersions, APIGroupList,
APIGroup, APIResourceList with verbs, scope, kind and short names). Built from `registry`; holds no
state. Aggregated discovery is not offered: clients fall back to these legacy documents.
"""

from __future__ import annotations

from typing import Any

from kcover.sim import registry

Obj = dict[str, Any]
GIT_VERSION = "v1.36.0-kcover-sim"
_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "binding": ["create"], "eviction": ["create"]}


def version() -> Obj:
    return {"major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
            "gitVersion": GIT_VERSION, "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0",
            "compiler": "gc", "platform": "linux/amd64"}


def api_versions(server_address: str) -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(reg: registry.Registry, group: str, versions: list[str]) -> Obj:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(reg: registry.Registry) -> Obj:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(reg, g, vs) for g, vs in reg.group_versions().items()]}


def api_group(reg: registry.Registry, group: str) -> Obj | None:
    versions = reg.group_versions().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(reg, group, versions)}


def api_resource_list(reg: registry.Registry, group: str, version: str) -> Obj | None:
    served = [r for r in reg.resources if r.group == group and r.version == version]
    if not served:
        return None
    resources: list[Obj] = []
    for r in served:
        entry: Obj = {"name": r.plural, "singularName": r.singular or r.kind.lower(), "namespaced": r.namespaced,
                      "kind": r.kind, "verbs": r.verbs}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        resources.append(entry)
        for sub in r.subresources:
            item: Obj = {"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced,
                         "kind": "Binding" if sub == "binding" else r.kind,
                         "verbs": _SUBRESOURCE_VERBS.get(sub, ["get"])}
            if sub == "eviction":  # served in another group: kubectl drain evicts only where it says so
                item.update(group="policy", version="v1", kind="Eviction")
            resources.append(item)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}
