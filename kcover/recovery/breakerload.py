"""What the breaker counts for one planned restart or cordon: `load(...) -> admission.Load`.

Owns the count of what kcover holds and is doing now, and did within `recovery.breaker_window_seconds`:
cordons held (the cache), cordons and restarts in flight (`planinputs.History`) and planned earlier in the
same plan, and the ledger's window; a node or unit counted once however many of those name it. Does not
own the limits it is compared to (`admission`) or the plan (`planning`). Pure, like both.
"""

from __future__ import annotations

from collections.abc import Set

from kcover import settings
from kcover.recovery import admission, ledgerentries, planinputs


def load(history: planinputs.History, snapshot: planinputs.Snapshot, rs: settings.RecoverySettings, now: float, *,
         planned_keys: Set[str], planned_cordons: Set[str], exclude_node: str = "", key: str = "") -> admission.Load:
    """The load a restart of `key`, or a cordon of `exclude_node`, is admitted against (itself not counted)."""
    led = history.ledger
    since = admission.window_start(rs, led.breaker(), now)
    cordoned = [n for n in snapshot.kcover_cordons(rs.taint_key) if n != exclude_node]
    in_flight = (history.cordons_in_flight | planned_cordons) - set(cordoned) - {exclude_node}
    in_window = led.cordons_since(since) + sum(1 for n in in_flight if not _cordoned_since(led.node(n), since))
    if exclude_node and _cordoned_since(led.node(exclude_node), since):
        in_window -= 1  # its earlier cordon: cordoning it again counts the node once
    keys = set(history.restarts_in_flight) | planned_keys
    units = led.units_restarted_since(since) + sum(1 for k in keys if not _restarted_since(led.unit(k), since))
    return admission.Load(restarts_in_flight=history.in_flight + len(planned_keys),
                          cordons_in_flight=len(in_flight), cordoned=len(cordoned),
                          gpu_nodes=snapshot.gpu_node_count(), cordons_in_window=in_window,
                          units_in_window=units,
                          unit_in_window=bool(key) and (key in keys or _restarted_since(led.unit(key), since)))


def _cordoned_since(node: ledgerentries.Node | None, since: float) -> bool:
    return node is not None and node.cordoned_at is not None and node.cordoned_at >= since


def _restarted_since(unit: ledgerentries.Unit | None, since: float) -> bool:
    return unit is not None and any(t >= since for t in unit.restarts)
