"""The recovery ledger: restart times and cordons, kept in one ConfigMap so a new leader honours them.

Owns the ConfigMap `recovery.ledger_namespace/ledger_name`: one data key per restart unit
(`w.<workload uid>` or `w.<uid>.g<group>` for a LeaderWorkerSet group) holding compact JSON
`{"t": [epoch seconds...], "d": "<what>"}`, and one per node (`n.<node>`) holding `{"c": epoch, "r": reason}`.

Why a ConfigMap rather than annotations on each workload: one object to read at start (no LIST of
every workload kind), no write permission on users' custom resources, node and workload state in one
place, and the write is a plain PUT with the resourceVersion as precondition. That precondition is
also the fencing: a restart or cordon is recorded here *before* the delete or node write, so if two
replicas both believe they lead, only one record succeeds; the other gets 409, re-reads, re-checks
cooldown and budget against what the winner wrote, and refuses.

Reads happen once (`load()`) and after each 409; a steady-state restart costs one write here.
Size: entries older than the longest window are pruned on every write; with the default budget of
five restarts an entry is under 150 bytes, so the 1 MiB ConfigMap limit holds about 7,000 workloads
restarted within one window. Past ~900 KiB the oldest entries are dropped and `ledger_full` is logged.

Fails with `errors.NotLeaderError` when asked to write while not leading, `errors.KubeError` when the
API keeps refusing (after `MAX_ATTEMPTS` conflicts, or on other errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import structlog

from kcover import errors
from kcover.kube import client as kube_client
from kcover.recovery import policy

log = structlog.get_logger()

MAX_ATTEMPTS = 5
"""Read-modify-write attempts before giving up on a contended ledger."""
SIZE_LIMIT = 900 * 1024
"""Bytes of data kept; the API server refuses ConfigMaps past 1 MiB in all."""

T = TypeVar("T")


@dataclass
class State:
    """The parsed ledger. Mutated only on copies inside `Ledger.update()`."""

    restarts: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    cordons: dict[str, float] = field(default_factory=dict)
    cordon_reasons: dict[str, str] = field(default_factory=dict)

    def copy(self) -> State:
        return State({k: list(v) for k, v in self.restarts.items()}, dict(self.notes), dict(self.cordons),
                     dict(self.cordon_reasons))

    def history(self, in_flight_restarts: int = 0) -> policy.History:
        return policy.History(restarts={k: tuple(v) for k, v in self.restarts.items()},
                              cordons=dict(self.cordons), in_flight_restarts=in_flight_restarts)

    def prune(self, before: float) -> None:
        for key in list(self.restarts):
            kept = [t for t in self.restarts[key] if t >= before]
            if kept:
                self.restarts[key] = kept
            else:
                del self.restarts[key]
                self.notes.pop(key, None)
        for node in [n for n, t in self.cordons.items() if t < before]:
            del self.cordons[node]
            self.cordon_reasons.pop(node, None)

    def encode(self) -> dict[str, str]:
        data: dict[str, str] = {}
        for key, times in self.restarts.items():
            data[key] = orjson.dumps({"t": [round(t, 3) for t in times], "d": self.notes.get(key, "")}).decode()
        for node, at in self.cordons.items():
            data[f"n.{node}"] = orjson.dumps({"c": round(at, 3), "r": self.cordon_reasons.get(node, "")}).decode()
        return data

    @classmethod
    def decode(cls, data: dict[str, str]) -> State:
        state = cls()
        for key, raw in data.items():
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                log.warning("ledger_entry_unreadable", key=key)
                continue
            if not isinstance(entry, dict):
                continue
            if key.startswith("n.") and isinstance(entry.get("c"), int | float):
                state.cordons[key[2:]] = float(entry["c"])
                state.cordon_reasons[key[2:]] = str(entry.get("r", ""))
            elif key.startswith("w.") and isinstance(entry.get("t"), list):
                state.restarts[key] = sorted(float(t) for t in entry["t"] if isinstance(t, int | float))
                state.notes[key] = str(entry.get("d", ""))
        return state


class Ledger:
    """In-memory copy of the ledger ConfigMap plus fenced read-modify-write of it."""

    def __init__(self, kube: kube_client.KubeClient, *, namespace: str, name: str,
                 is_leader: Callable[[], bool], retention_seconds: Callable[[], float]) -> None:
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self._is_leader = is_leader
        self._retention = retention_seconds
        self._state = State()
        self._rv: str | None = None
        self._exists = False
        self._loaded = False
        self._lock = asyncio.Lock()
        self.conflicts = 0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    @property
    def loaded(self) -> bool:
        return self._loaded

    def history(self, in_flight_restarts: int = 0) -> policy.History:
        return self._state.history(in_flight_restarts)

    async def load(self) -> None:
        """Read the ConfigMap (absent means empty)."""
        try:
            obj = await self._kube.request("GET", self.path)
        except errors.NotFoundError:
            self._state, self._rv, self._exists = State(), None, False
        else:
            data = obj.get("data") or {}
            self._state = State.decode({str(k): str(v) for k, v in data.items()})
            self._rv = str(obj["metadata"]["resourceVersion"])
            self._exists = True
        self._loaded = True

    async def ensure_loaded(self) -> None:
        """Read the ConfigMap once, however many callers ask at the same time."""
        async with self._lock:
            if not self._loaded:
                await self.load()

    async def update(self, mutate: Callable[[State], T | None], *, now: float) -> T | None:
        """Apply `mutate` to a copy of the current state and write it with the RV as precondition.

        `mutate` returns None to write, or a refusal (anything else) to write nothing and return it.
        On 409 the ledger is re-read and `mutate` runs again on what the other writer left.
        """
        async with self._lock:
            if not self._loaded:
                await self.load()
            for _attempt in range(MAX_ATTEMPTS):
                state = self._state.copy()
                refusal = mutate(state)
                if refusal is not None:
                    return refusal
                state.prune(now - self._retention())
                data = self._bounded(state)
                try:
                    await self._write(data)
                except errors.ConflictError:
                    self.conflicts += 1
                    log.info("ledger_conflict", name=self.name, attempt=_attempt + 1)
                    await self.load()
                    continue
                except errors.NotFoundError:
                    if not self._exists:
                        raise
                    self._exists = False
                    self._rv = None
                    continue
                self._state = state
                return None
            raise errors.KubeError(f"ledger {self.namespace}/{self.name}: still conflicting after "
                                   f"{MAX_ATTEMPTS} attempts", status=409)

    def _bounded(self, state: State) -> dict[str, str]:
        data = state.encode()
        size = sum(len(k) + len(v) for k, v in data.items())
        if size <= SIZE_LIMIT:
            return data
        log.warning("ledger_full", name=self.name, bytes=size)
        oldest = sorted(state.restarts, key=lambda k: state.restarts[k][-1])
        while oldest and size > SIZE_LIMIT:
            key = oldest.pop(0)
            size -= len(key) + len(data.pop(key))
            del state.restarts[key]
            state.notes.pop(key, None)
        return data

    async def _write(self, data: dict[str, str]) -> None:
        if not self._is_leader():
            raise errors.NotLeaderError("not leading: ledger not written")
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.name, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/managed-by": "kcover"}},
                                "data": data}
        if self._exists:
            body["metadata"]["resourceVersion"] = self._rv
            result = await self._kube.request("PUT", self.path, body=body)
        else:
            result = await self._kube.request("POST", f"/api/v1/namespaces/{self.namespace}/configmaps",
                                              body=body)
        self._rv = str(result["metadata"]["resourceVersion"])
        self._exists = True
