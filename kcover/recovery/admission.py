"""Admission: may this restart or this cordon happen now? The one home of the refusals the ledger decides.

Owns the checks that read what kcover did (the ledger) and what it is doing (actions in flight): a
replayed signal (`ALREADY_ACTED`), a pod a restart already removed (`ALREADY_RESTARTED`), the unit's
cooldown and restart budget, the node's cooldown, the bound on restarts in flight (`THROTTLED`: held, never
a trip), and the breaker (`BREAKER_LATCHED`, `BREAKER_COOLDOWN`, and `BREAKER_OPEN`: a trip, which latches
it by default): cordons held at once (a fraction of the GPU nodes and an absolute cap), cordons per window
(a count and a fraction, the smaller wins) and different units restarted per window, those in flight
counted; device taints held and in flight against their own caps (per node, per window). `planning.plan`
calls these with the ledger as the cache-time view, and the executors call the same functions again
inside the fenced ledger write, on the entry as the API server holds it then: so a second replica that
believes it leads is refused by the very rule the first one passed, and no refusal has two homes.

Pure: plain values in, a `Refusal` or None out.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from kcover import settings
from kcover.recovery import ledgerentries
from kcover.recovery.steps import Code


@dataclass(frozen=True)
class Refusal:
    code: Code
    text: str


@dataclass(frozen=True)
class Load:
    """What kcover is doing and holds right now, as the breaker counts it."""

    restarts_in_flight: int = 0
    """Restarts planned and not finished (this one not included)."""
    cordons_in_flight: int = 0
    """Cordons planned and not yet visible in the cache (this one not included)."""
    cordoned: int = 0
    """Nodes the cache shows cordoned by kcover."""
    gpu_nodes: int = 0
    cordons_in_window: int = 0
    """Nodes kcover cordoned within `recovery.breaker_window_seconds`, those in flight included."""
    units_in_window: int = 0
    """Different restart units restarted within the window, those in flight included (this one not)."""
    unit_in_window: bool = False
    """This unit itself restarted within the window (so it adds nothing to `units_in_window`)."""


def _when(at: float) -> str:
    return f"{dt.datetime.fromtimestamp(at, dt.UTC):%Y-%m-%dT%H:%M:%SZ}"


def replayed(acted_at: float | None, signal: str, what: str) -> Refusal | None:
    """This outside signal already moved this unit or node."""
    if acted_at is None:
        return None
    return Refusal(Code.ALREADY_ACTED, f"{what}: signal {signal} was already acted on at {_when(acted_at)}; "
                                       "a signal moves a unit once")


def breaker(state: ledgerentries.Breaker, rs: settings.RecoverySettings, now: float) -> Refusal | None:
    """The latched breaker, and the cooldown after a person reset it."""
    if state.latched:
        assert state.opened_at is not None
        return Refusal(Code.BREAKER_LATCHED, f"breaker latched open since {_when(state.opened_at)} ({state.reason}); "
                       f"a person resets it: `kcover breaker reset`, or annotate ConfigMap {rs.controls_name} "
                       "kcover.io/breaker-reset=true")
    if state.closed_at is not None and now - state.closed_at < rs.breaker_cooldown_seconds:
        left = rs.breaker_cooldown_seconds - (now - state.closed_at)
        return Refusal(Code.BREAKER_COOLDOWN, f"the breaker was reset {now - state.closed_at:.0f}s ago; kcover waits "
                       f"{left:.0f}s more (recovery.breaker_cooldown_seconds)")
    return None


def restart(unit: ledgerentries.Unit | None, *, what: str, rs: settings.RecoverySettings, now: float,
            breaker_state: ledgerentries.Breaker, load: Load | None, pod_created: float | None = None,
            pod_terminating: bool = False) -> Refusal | None:
    """May the unit be restarted now? `pod_created`: when the faulting pod was created (epoch), if known;
    `pod_terminating`: the faulting pod is being deleted.
    `load` None leaves out the limits on what is in flight (checked when planning, with the reservations):
    the fenced ledger write re-checks what another replica could have changed."""
    latched = breaker(breaker_state, rs, now)
    if latched is not None:
        return latched
    times = ledgerentries.restarts_within(unit, now - rs.restart_window_seconds)
    # creationTimestamp has whole seconds: a pod stamped a second or more before the restart predates it
    if times and (pod_terminating or (pod_created is not None and pod_created + 1.0 <= times[-1])):
        return Refusal(Code.ALREADY_RESTARTED, f"{what} was restarted at {_when(times[-1])}, after its faulting pod "
                       "was created: that restart removed (or is removing) the pod")
    if times and now - times[-1] < rs.workload_cooldown_seconds:
        return Refusal(Code.COOLDOWN, f"{what} was restarted {now - times[-1]:.0f}s ago; cooldown is "
                       f"{rs.workload_cooldown_seconds:.0f}s")
    if len(times) >= rs.max_restarts_per_window:
        until = times[0] + rs.restart_window_seconds
        return Refusal(Code.BUDGET_EXHAUSTED, f"restart budget exhausted: {what} was restarted {len(times)} times in "
                       f"the last {rs.restart_window_seconds:.0f}s (max {rs.max_restarts_per_window}); kcover will "
                       f"not restart it again before {_when(until)}")
    if load is None:
        return None
    if not load.unit_in_window and load.units_in_window >= rs.max_restarted_workloads_per_window:
        return Refusal(Code.BREAKER_OPEN, f"breaker tripped: {load.units_in_window} different workloads restarted "
                       f"within {rs.breaker_window_seconds:g}s (recovery.max_restarted_workloads_per_window "
                       f"{rs.max_restarted_workloads_per_window}): a shared cause, not {what}'s own fault")
    if load.restarts_in_flight >= rs.max_concurrent_restarts:
        return Refusal(Code.THROTTLED, f"{load.restarts_in_flight} restarts already in flight "
                       f"(recovery.max_concurrent_restarts {rs.max_concurrent_restarts}): {what} waits for one to end")
    return None


def cordon(node: ledgerentries.Node | None, name: str, *, rs: settings.RecoverySettings, now: float,
           breaker_state: ledgerentries.Breaker, load: Load | None) -> Refusal | None:
    """May `name` be cordoned now? The node's cooldown and the cordon breaker, cordons in flight counted
    (`load` None: as for `restart`)."""
    latched = breaker(breaker_state, rs, now)
    if latched is not None:
        return latched
    last = node.cordoned_at if node is not None else None
    if last is not None and now - last < rs.node_cooldown_seconds:
        return Refusal(Code.NODE_COOLDOWN, f"Node {name} faulted again {now - last:.0f}s after kcover cordoned it, "
                       f"and is in service: it is not cordoned again within recovery.node_cooldown_seconds "
                       f"({rs.node_cooldown_seconds:.0f}s); look at it")
    if load is None:
        return None
    held = load.cordoned + load.cordons_in_flight
    if load.gpu_nodes <= 0:
        return Refusal(Code.BREAKER_OPEN, f"breaker open: kcover counts no GPU nodes (kube.gpu_resources), so no "
                       f"fraction of them may be cordoned; Node {name} is not cordoned")
    if held >= held_cordon_limit(rs, load.gpu_nodes):
        return Refusal(Code.BREAKER_OPEN, f"breaker tripped: kcover holds {load.cordoned} of {load.gpu_nodes} GPU "
                       f"nodes cordoned and {load.cordons_in_flight} cordons in flight (recovery.max_cordoned_fraction "
                       f"{rs.max_cordoned_fraction:g}, recovery.max_cordoned_nodes {rs.max_cordoned_nodes}); Node "
                       f"{name} is not cordoned")
    per_window = window_cordon_limit(rs, load.gpu_nodes)
    if load.cordons_in_window >= per_window:
        return Refusal(Code.BREAKER_OPEN, f"breaker tripped: kcover cordoned {load.cordons_in_window} nodes within "
                       f"{rs.breaker_window_seconds:g}s (limit {per_window}: the smaller of "
                       f"recovery.max_cordons_per_window {rs.max_cordons_per_window} and "
                       f"recovery.max_cordons_per_window_fraction {rs.max_cordons_per_window_fraction:g} of "
                       f"{load.gpu_nodes} GPU nodes); Node {name} is not cordoned")
    return None


def held_cordon_limit(rs: settings.RecoverySettings, gpu_nodes: int) -> int:
    """Nodes kcover may hold cordoned at once: `max_cordoned_nodes` or `max_cordoned_fraction` of the GPU nodes
    (rounded up), the smaller; a cordon while this many are held trips the breaker."""
    return min(rs.max_cordoned_nodes, math.ceil(rs.max_cordoned_fraction * gpu_nodes)) if gpu_nodes > 0 else 0


def window_start(rs: settings.RecoverySettings, breaker: ledgerentries.Breaker, now: float) -> float:
    """Where the breaker's window begins: `recovery.breaker_window_seconds` ago, or at a person's reset of the
    latched breaker if that is later (a reset accounts for what tripped it: counting those actions again
    would trip the breaker on the first action after the cooldown). The limits on what is held at once
    still count everything."""
    return max(now - rs.breaker_window_seconds, breaker.closed_at or 0.0)


def window_cordon_limit(rs: settings.RecoverySettings, gpu_nodes: int) -> int:
    """Cordons allowed per breaker window: the count or the fraction of the GPU nodes (at least one), the smaller."""
    return min(rs.max_cordons_per_window, max(1, int(rs.max_cordons_per_window_fraction * gpu_nodes)))


def until_budget_frees(unit: ledgerentries.Unit | None, rs: settings.RecoverySettings, now: float) -> float:
    """When the unit's oldest restart in the window leaves it (a held restart may run then)."""
    times = ledgerentries.restarts_within(unit, now - rs.restart_window_seconds)
    return times[0] + rs.restart_window_seconds if times else now


def until_cooldown_ends(unit: ledgerentries.Unit | None, rs: settings.RecoverySettings, now: float) -> float:
    times = ledgerentries.restarts_within(unit, now - rs.restart_window_seconds)
    return times[-1] + rs.workload_cooldown_seconds if times else now


@dataclass(frozen=True)
class DeviceLoad:
    """The device taints the breaker counts besides the ledger's: those planned and not yet recorded."""

    on_node: int = 0
    """Device taints in flight on this device's node (this one not included)."""
    total: int = 0
    """Device taints in flight across the cluster (this one not included)."""


def device_taint(node: ledgerentries.Node | None, device: str, name: str, *, rs: settings.RecoverySettings, now: float,
                 breaker_state: ledgerentries.Breaker, recent: int, load: DeviceLoad) -> Refusal | None:
    """May `device` (a resourceID) of Node `name` be tainted now? The latched breaker, and the device taints'
    own caps, in-flight taints counted: `recovery.device_taints.max_per_node` (`DEVICE_TAINT_LIMIT`, a cap)
    and `max_per_window` (`BREAKER_OPEN`, a trip: that many devices failing at once is a fleet's). `recent`:
    device taints the ledger holds made within the window. A device the ledger already holds tainted needs
    no admission (its rule is written again, idempotently, and counted once)."""
    latched = breaker(breaker_state, rs, now)
    if latched is not None:
        return latched
    held = node.devices if node is not None else {}
    if device in held:
        return None
    opts = rs.device_taints
    on_node = len(held) + load.on_node
    if on_node >= opts.max_per_node:
        return Refusal(Code.DEVICE_TAINT_LIMIT, f"kcover holds {len(held)} devices of Node {name} tainted and "
                       f"{load.on_node} taints of it in flight (max {opts.max_per_node}, "
                       f"recovery.device_taints.max_per_node); device {device} is not tainted")
    if recent + load.total >= opts.max_per_window:
        return Refusal(Code.BREAKER_OPEN, f"breaker open: kcover made {recent} device taints in the last "
                       f"{opts.window_seconds:.0f}s and {load.total} are in flight (max {opts.max_per_window}, "
                       f"recovery.device_taints.max_per_window); device {device} is not tainted")
    return None
