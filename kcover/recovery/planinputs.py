"""What the plan reads: `Snapshot` (the cluster, from the cache), `LedgerView` (the ledger) and `History`.

Owns the Protocols through which `planning.plan` (and the hooks, the resumer, the held restarts' replanning)
see the cluster and the ledger, and `History`: what kcover did (the ledger) and is doing (steps in flight).
`caching.ClusterCache` provides a `Snapshot`, `ledger.Ledger` a `LedgerView`; `EMPTY_LEDGER` is a ledger
that holds nothing.

Does not own the plan (`planning`), the ledger's store (`ledger`) or its entries (`ledgerentries`). It does
no I/O and holds no state of its own; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kcover import codec
from kcover.kube import projections as proj
from kcover.recovery import controls, ledger, ledgerentries


class Snapshot(controls.View, Protocol):
    """What the plan reads of the cluster (`caching.ClusterCache` provides it)."""

    def pod_by_name(self, namespace: str, name: str) -> proj.Pod | None: ...

    def pods_of_workload(self, uid: str) -> Sequence[proj.Pod]: ...

    def pods_on_node(self, name: str) -> Sequence[proj.Pod]: ...

    def workload_by_name(self, group: str, kind: str, namespace: str, name: str) -> proj.Workload | None: ...

    def gpu_node_count(self) -> int: ...

    def cordoned_by_kcover(self) -> Sequence[str]: ...

    def kcover_cordons(self, taint_key: str) -> Sequence[str]: ...


class LedgerView(Protocol):
    """What the plan reads of the ledger (`ledger.Ledger` provides it)."""

    def unit(self, key: str) -> ledgerentries.Unit | None: ...

    def node(self, name: str) -> ledgerentries.Node | None: ...

    def breaker(self) -> ledgerentries.Breaker: ...

    def acted_on(self, signal: str, key: str) -> float | None: ...

    def cordons_since(self, since: float) -> int: ...

    def units_restarted_since(self, since: float) -> int: ...

    def failures_at(self, node: str, since: float) -> list[ledger.Failure]: ...

    def device_taints_since(self, since: float) -> int: ...


class _Empty:
    def unit(self, key: str) -> ledgerentries.Unit | None:
        return None

    def node(self, name: str) -> ledgerentries.Node | None:
        return None

    def breaker(self) -> ledgerentries.Breaker:
        return ledgerentries.Breaker()

    def acted_on(self, signal: str, key: str) -> float | None:
        return None

    def cordons_since(self, since: float) -> int:
        return 0

    def units_restarted_since(self, since: float) -> int:
        return 0

    def failures_at(self, node: str, since: float) -> list[ledger.Failure]:
        return []

    def device_taints_since(self, since: float) -> int:
        return 0


EMPTY_LEDGER: LedgerView = _Empty()


@dataclass(frozen=True)
class History:
    """What kcover did (the ledger) and is doing (steps in flight), as the plan sees them."""

    ledger: LedgerView = EMPTY_LEDGER
    restarts_in_flight: Mapping[str, int] = field(default_factory=dict)
    """Unit key -> restarts of it planned and not finished."""
    cordons_in_flight: frozenset[str] = frozenset()
    """Nodes whose cordon is planned and not yet in the cache."""
    cordons_written: frozenset[str] = frozenset()
    """Those of `cordons_in_flight` the API server has taken (the cache not showing them yet): no pod is
    scheduled there any more."""
    device_taints_served: bool = True
    """The API server serves DeviceTaintRules (discovered)."""
    device_taints_in_flight: Mapping[str, str] = field(default_factory=dict)
    """resourceID -> node of the device taints planned and not finished."""
    suspects_in_flight: frozenset[str] = frozenset()
    """Nodes a suspect validation is planned for and not yet recorded in the ledger (an earlier plan of the
    same batch asked it): a restart for a fault there waits for the verdict too."""
    agent_condition: str = codec.AGENT_CONDITION_TYPE
    """The Node condition kcover's agent sets (`agent.condition_type`): a node that does not show it has no
    agent to answer a validation, so no restart waits for a verdict there."""

    @property
    def in_flight(self) -> int:
        return sum(self.restarts_in_flight.values())
