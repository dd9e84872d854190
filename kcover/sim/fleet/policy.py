"""The seam between the fleet replay's world and what decides recovery in it.

Owns `Policy`: what the world (`world.World`) tells and asks of a policy, and all it may rely on. kcover
through its real code (`kcoverpolicy`), the baselines and the oracle (`baselines`) implement it; they act
on the world only through `World.restart_job`, `cordon` and `uncordon`, at `world.now`. A protocol; no
behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kcover.sim.fleet import state as st

if TYPE_CHECKING:
    from kcover.sim.fleet import world as world_


class Policy(Protocol):
    """What decides recovery in a replay: kcover (real code), a baseline or the oracle."""

    name: str
    force_deletes: bool
    """Pods lost on a NotReady node are replaced at once (the oracle), not when evicted."""

    async def attach(self, world: world_.World) -> None: ...

    async def notify(self, notice: st.Notice, cause: st.Fault | None) -> None:
        """What happened; `cause` is the truth behind a signal, for the oracle's eyes only."""
        ...

    async def advance(self, until: float) -> bool:
        """Do the policy's own work up to `until`: True once there; False when it returned earlier, after
        acting (at `world.now`), so the world looks at its events again before going on to `until`."""
        ...

    async def close(self) -> None: ...
