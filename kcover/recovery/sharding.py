"""The ledger's per-unit layout: one small object per restart unit or node, so a write costs the same at any scale.

Owns how the ledger's data (`ledger.State.encode()`: a key per restart unit `w.<uid>[.g<group>]` and per
node `n.<node>`, plus the `signals` map `<signal>|<key> -> epoch`) is spread over objects: the `LedgerEntry`
(kcover.io/v1alpha1, helm/kcover/files/ledgerentry-crd.yaml) `<ledger name>.<key>` (a hash for keys that
do not make a valid name) in the ledger's namespace, labelled `kcover.io/ledger=<ledger name>`, whose
`data` holds that key's entry and the signals that moved that unit. A kind of kcover's own rather than
ConfigMaps: RBAC cannot grant ConfigMaps by label, so per-unit ConfigMaps would need write access to
every ConfigMap in the release namespace (the chart's configuration among them). A write sends only the objects whose content changed (the unit just restarted, intents finished
since), each a PUT with its resourceVersion as precondition (the fencing write, per unit: two replicas
that both believe they lead cannot both record a restart of one unit), a POST for a new unit, and a
DELETE with a resourceVersion precondition for units past retention (at most `DELETES_PER_WRITE` per
write, the rest at later writes, so a write after a quiet hour stays cheap). No object grows with the
number of workloads: a unit's entry with its budget of restarts and a pending intent is under 2 KiB.

Reads: `load()` lists the labelled objects once (at the start of a term), plus the one-ConfigMap
ledger of earlier versions (ConfigMap `<ledger name>`), whose entries are taken over: the first write
creates their objects and then empties it (with its resourceVersion as precondition: a leader of the
earlier version writing it meanwhile makes this one re-read and merge). After a 409 only
the objects that conflicted are read again (`refresh()`).

Fails with `errors.ConflictError` when a precondition failed (the caller refreshes and retries),
`errors.NotLeaderError` from `guard`, and `errors.KubeError` for anything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from kcover import errors
from kcover.kube import client as kube_client
from kcover.kube import retrying

API_VERSION = "kcover.io/v1alpha1"
KIND = "LedgerEntry"
PLURAL = "ledgerentries"
LEDGER_LABEL = "kcover.io/ledger"
SIGNALS_KEY = "signals"
DELETES_PER_WRITE = 8
"""Expired units deleted per write at most; the others go at later writes (or stay, harmless, until then)."""
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def object_name(ledger_name: str, key: str) -> str:
    """`<ledger>.<key>` when that is a valid ConfigMap name, else `<ledger>.h.<hash of key>`."""
    name = f"{ledger_name}.{key}"
    if len(name) <= 253 and _NAME.match(name):
        return name
    return f"{ledger_name}.h.{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def split(ledger_name: str, data: dict[str, str]) -> dict[str, dict[str, str]]:
    """The ledger's data as object name -> that object's data (its entry, and its signals as `signals`)."""
    out: dict[str, dict[str, str]] = {}
    for key, value in data.items():
        if key != SIGNALS_KEY:
            out.setdefault(object_name(ledger_name, key), {})[key] = value
    signals: dict[str, dict[str, float]] = {}
    raw = data.get(SIGNALS_KEY)
    if raw:
        for signal_key, at in orjson.loads(raw).items():
            unit = str(signal_key).rpartition("|")[2]
            signals.setdefault(unit, {})[signal_key] = at
    for unit, held in signals.items():
        out.setdefault(object_name(ledger_name, unit), {})[SIGNALS_KEY] = orjson.dumps(
            dict(sorted(held.items()))).decode()
    return out


def join(parts: Iterable[dict[str, str]]) -> dict[str, str]:
    """Objects' data merged back into the ledger's data (the newest time of a signal found twice wins)."""
    data: dict[str, str] = {}
    signals: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            if key == SIGNALS_KEY:
                try:
                    held = orjson.loads(value)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(held, dict):
                    for k, at in held.items():
                        if isinstance(at, int | float) and not isinstance(at, bool):
                            signals[str(k)] = max(float(at), signals.get(str(k), float("-inf")))
            else:
                data.setdefault(key, value)
    if signals:
        data[SIGNALS_KEY] = orjson.dumps(signals).decode()
    return data


@dataclass
class _Held:
    rv: str
    data: dict[str, str]


class PerUnitStore:
    """The ConfigMaps of one ledger as this replica last read or wrote them."""

    def __init__(self, kube: kube_client.KubeClient, *, namespace: str, name: str,
                 fence: retrying.Fence | None = None) -> None:
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self._fence = fence
        self._objects: dict[str, _Held] = {}
        self._legacy: _Held | None = None
        """The one-ConfigMap ledger of earlier versions, while it still holds data to take over."""
        self._stale: set[str] = set()
        self._doomed: set[str] = set()
        """Objects of units gone from the ledger, deleted a few per write."""
        self.requests = 0
        """Writes sent (for the scale probe and tests)."""

    @property
    def base(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/{PLURAL}"

    @property
    def legacy_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    async def load(self) -> dict[str, str]:
        """List every object of this ledger (and the old single ConfigMap); the ledger's data."""
        self._objects, self._stale = {}, set()
        query: dict[str, str | int] = {"labelSelector": f"{LEDGER_LABEL}={self.name}", "limit": 500}
        while True:
            page = await self._kube.request("GET", self.base, query=query)
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                self._objects[str(meta["name"])] = _Held(str(meta["resourceVersion"]), _data(item))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {**query, "continue": token}
        try:
            legacy = await self._kube.request("GET", self.legacy_path)
        except errors.NotFoundError:
            self._legacy = None
        else:
            held = _data(legacy)
            self._legacy = _Held(str(legacy["metadata"]["resourceVersion"]), held) if held else None
        return self.data()

    @property
    def taking_over(self) -> bool:
        """An old single-ConfigMap ledger still holds data: the next write must be `write()` of everything."""
        return self._legacy is not None

    def data(self) -> dict[str, str]:
        parts = [held.data for held in self._objects.values()]
        if self._legacy is not None:
            parts.append(self._legacy.data)  # last: what per-unit objects hold wins
        return join(parts)

    async def refresh(self) -> dict[str, str]:
        """Read again the objects whose write conflicted; the ledger's data."""
        for name in sorted(self._stale):
            path = self.legacy_path if name == self.name else f"{self.base}/{name}"
            try:
                obj = await self._kube.request("GET", path)
            except errors.NotFoundError:
                if name == self.name:
                    self._legacy = None
                else:
                    self._objects.pop(name, None)
                continue
            held = _Held(str(obj["metadata"]["resourceVersion"]), _data(obj))
            if name == self.name:
                self._legacy = held if held.data else None
            else:
                self._objects[name] = held
        self._stale = set()
        return self.data()

    async def write(self, data: dict[str, str], *, guard: Callable[[], None]) -> int:
        """Write what changed between the objects held and `data`; returns the requests sent."""
        wanted = split(self.name, data)
        sent = 0
        for name, content in wanted.items():
            held = self._objects.get(name)
            if held is not None and held.data == content:
                continue
            guard()
            if held is None:
                result = await self._send("POST", self.base, name, self._body(name, content, None))
            else:
                result = await self._send("PUT", f"{self.base}/{name}", name, self._body(name, content, held.rv))
            self._objects[name] = _Held(str(result["metadata"]["resourceVersion"]), content)
            sent += 1
        expired = [n for n in self._objects if n not in wanted][:DELETES_PER_WRITE]
        for name in expired:
            guard()
            options = {"apiVersion": "v1", "kind": "DeleteOptions",
                       "preconditions": {"resourceVersion": self._objects[name].rv}}
            try:
                await self._send("DELETE", f"{self.base}/{name}", name, options)
            except errors.NotFoundError:
                pass
            self._objects.pop(name, None)
            sent += 1
        if self._legacy is not None:  # taken over (its units written above): emptied, its precondition the fence
            guard()
            await self._send("PUT", self.legacy_path, self.name, self._body(self.name, {}, self._legacy.rv, legacy=True))
            self._legacy = None
            sent += 1
        self.requests += sent
        return sent

    async def write_units(self, units: dict[str, dict[str, str]], *, guard: Callable[[], None]) -> int:
        """Write the units given (ledger key -> its data; empty: the unit is gone, its object deleted) and no
        other, plus the deletes an earlier write left (past `DELETES_PER_WRITE`); returns the requests sent.
        Costs the same however many units the ledger holds, and one round trip however many units change
        (they are distinct objects, written at once). Not while `taking_over`."""
        sent = 0
        doomed = []
        upserts: list[tuple[str, dict[str, str], _Held | None]] = []
        for key, content in units.items():
            name = object_name(self.name, key)
            held = self._objects.get(name)
            if not content:
                if held is not None:
                    doomed.append(name)
                continue
            if held is not None and held.data == content:
                continue
            upserts.append((name, content, held))

        async def upsert(name: str, content: dict[str, str], held: _Held | None) -> None:
            guard()
            if held is None:
                result = await self._send("POST", self.base, name, self._body(name, content, None))
            else:
                result = await self._send("PUT", f"{self.base}/{name}", name, self._body(name, content, held.rv))
            self._objects[name] = _Held(str(result["metadata"]["resourceVersion"]), content)

        if len(upserts) == 1:
            await upsert(*upserts[0])
        elif upserts:
            try:
                async with asyncio.TaskGroup() as tg:
                    for name, content, held in upserts:
                        tg.create_task(upsert(name, content, held), name=f"ledger-write:{name}")
            except BaseExceptionGroup as group:  # the first failure stands for the others (ConflictError, ...)
                raise group.exceptions[0] from None
        sent += len(upserts)
        self._doomed.update(doomed)
        for name in sorted(self._doomed)[:DELETES_PER_WRITE]:
            held = self._objects.get(name)
            self._doomed.discard(name)
            if held is None:
                continue
            guard()
            options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": held.rv}}
            try:
                await self._send("DELETE", f"{self.base}/{name}", name, options)
            except errors.NotFoundError:
                pass
            self._objects.pop(name, None)
            sent += 1
        self.requests += sent
        return sent

    async def _send(self, method: str, path: str, name: str, body: dict[str, Any]) -> Any:
        try:
            return await self._kube.request(method, path, body=body, fence=self._fence)
        except (errors.ConflictError, errors.NotFoundError) as exc:
            if method == "DELETE" and isinstance(exc, errors.NotFoundError):
                raise
            self._stale.add(name)
            raise errors.ConflictError(f"ledger object {self.namespace}/{name} changed meanwhile: {exc}",
                                       status=409) from exc

    def _body(self, name: str, data: dict[str, str], rv: str | None, *, legacy: bool = False) -> dict[str, Any]:
        labels = {"app.kubernetes.io/managed-by": "kcover"}
        if not legacy:
            labels[LEDGER_LABEL] = self.name
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels}
        if rv is not None:
            meta["resourceVersion"] = rv
        api_version, kind = ("v1", "ConfigMap") if legacy else (API_VERSION, KIND)
        return {"apiVersion": api_version, "kind": kind, "metadata": meta, "data": data}


def _data(obj: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
