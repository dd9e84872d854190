"""The fleet replay's world and its reference policies, on hand-made traces of a six-node fleet.

One 4-node job on nodes 0-3, nodes 4 and 5 spare; every fault is placed on purpose. What is asserted is
what the world records happened (interruptions, restarts, cordons), never a policy's own word.
"""

from __future__ import annotations

from collections.abc import Sequence

from kcover.sim.fleet import baselines, virtualtime
from kcover.sim.fleet import policy as pol
from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace as trace_
from kcover.sim.fleet import world as world_

HOUR = 3600.0
XID = tax.SignalKind.XID
JOB = "train-4n"


def small(**changes: object) -> st.Params:
    base: dict[str, object] = {"nodes": 6, "jobs": ((1, 4),), "days": 1.0, "seed": 5}
    base.update(changes)
    return st.Params(**base)  # type: ignore[arg-type]


def replay(policy: pol.Policy, onsets: Sequence[trace_.Onset], params: st.Params | None = None) -> world_.World:
    world = world_.World(params or small(), tax.load(), onsets, policy)
    virtualtime.run(world.run())
    return world


def onset(time: float, node: int, cls: str, signal: tax.SignalKind = XID, xid: int | None = 79,
          gpu: int | None = 2) -> trace_.Onset:
    return trace_.Onset(time, node, gpu if signal is XID else None, cls, signal, xid if signal is XID else None)


def strikes(world: world_.World, fault: int = 0) -> list[st.Interruption]:
    return [i for i in world.interruptions if i.fault is not None and i.fault.id == fault]


def test_kubernetes_alone_restarts_in_place_and_a_bad_gpu_fails_again_until_a_person_finds_it() -> None:
    world = replay(baselines.KubernetesAlone(), [onset(HOUR, 1, "faulty-gpu")])
    fault = world.faults[0]
    hits = strikes(world)
    assert len(hits) >= 3, "restarted in place on the bad GPU, the job fails again and again"
    assert all(i.by == "kubernetes" for i in hits[:-1])
    assert fault.isolated_by == "person"
    assert fault.isolated_at == HOUR + world.params.person_hours * HOUR
    assert all(i.at < fault.isolated_at for i in hits), "nothing strikes after the node is isolated"
    assert world.restarts["policy"] == 0
    nccl = world.params.nccl_timeout_minutes * 60
    assert hits[0].decided_at is not None
    assert hits[0].decided_at - hits[0].at >= nccl, "Kubernetes resumes the job only once the watchdog ended every rank"
    assert 1 not in world.jobs[JOB].ranks


def test_a_transient_fault_strikes_once_and_a_bug_fails_its_job_then_is_fixed() -> None:
    world = replay(baselines.KubernetesAlone(), [onset(HOUR, 0, "nccl-watchdog", tax.SignalKind.NCCL),
                                                  onset(5 * HOUR, 2, "software-bug", tax.SignalKind.EXIT)])
    assert len(strikes(world, 0)) == 1
    bug = world.faults[1]
    bounds = world.taxonomy.bug_failures
    assert bounds.min <= len(strikes(world, 1)) <= bounds.max
    assert not bug.active
    assert bug.failures_left == 0
    assert not world.cordons


def test_a_fault_on_an_idle_node_waits_for_a_job() -> None:
    """A faulty GPU on a spare node strikes nothing until a job lands there."""
    world = replay(baselines.KubernetesAlone(), [onset(HOUR, 5, "faulty-gpu")])
    assert not world.interruptions
    assert world.faults[0].active
    assert world.faults[0].first_signal == HOUR, "an XID 79 shows on an idle GPU"


def test_the_go_policy_restarts_on_every_exit_once_per_cooldown_and_cordons_only_on_dcgm() -> None:
    world = replay(baselines.GoController(), [onset(HOUR, 1, "faulty-gpu")])
    hits = strikes(world)
    assert hits[0].by == "policy"
    assert hits[0].decided_at == hits[0].at + baselines.GoController.REACTION_SECONDS
    fault = world.faults[0]
    assert fault.isolated_by == "policy", "a faulty GPU fails the hourly diagnostic: the Go policy cordons"
    assert [c.cause for c in world.cordons] == ["DCGM diagnostic failed"]
    assert fault.isolated_at is not None
    assert fault.isolated_at <= HOUR + world.params.diag_interval_seconds + 1.0
    gsp = replay(baselines.GoController(), [onset(HOUR, 1, "gpu-system-processor", xid=119)])
    assert gsp.faults[0].isolated_by == "person", "no DCGM failure: the Go policy never isolates a GSP fault"
    assert len(strikes(gsp)) > 2


def test_the_go_policy_ignores_exits_within_its_cooldown() -> None:
    """Every rank exits at the watchdog's timeout: one restart, not four."""
    world = replay(baselines.GoController(), [onset(HOUR, 0, "network-switch", tax.SignalKind.NCCL)])
    assert world.restarts["policy"] == 1
    assert world.repeated_restarts == 0


def test_the_oracle_isolates_hardware_at_its_first_signal_and_never_a_healthy_node() -> None:
    world = replay(baselines.Oracle(), [onset(HOUR, 1, "gpu-hbm3", xid=48),
                                        onset(6 * HOUR, 2, "software-bug", tax.SignalKind.EXIT),
                                        onset(12 * HOUR, 3, "host-maintenance", tax.SignalKind.NOTREADY)])
    hbm = world.faults[0]
    assert hbm.isolated_by == "policy"
    assert hbm.isolated_at == hbm.first_signal == HOUR
    assert len(strikes(world, 0)) == 1
    assert [c.node for c in world.cordons] == [1]
    assert not any(c.healthy for c in world.cordons)
    assert all(i.decided_at == i.at for i in world.interruptions), "every restart at the first signal"
    assert world.unneeded_restarts == world.repeated_restarts == 0


def test_pods_lost_on_a_notready_node_come_back_only_after_the_eviction() -> None:
    params = small()
    kube = replay(baselines.KubernetesAlone(), [onset(HOUR, 1, "power-supply", tax.SignalKind.NOTREADY)], params)
    down = strikes(kube)[0]
    assert down.resumed_at is not None
    assert down.resumed_at >= HOUR + params.eviction_seconds + params.restart_minutes * 60
    oracle = replay(baselines.Oracle(), [onset(HOUR, 1, "power-supply", tax.SignalKind.NOTREADY)], params)
    assert strikes(oracle)[0].resumed_at == HOUR + params.pod_stop_seconds + params.restart_minutes * 60


def test_a_stop_loses_the_work_since_the_last_checkpoint() -> None:
    params = small(checkpoint_minutes=30.0)
    world = replay(baselines.Oracle(), [onset(HOUR + 20 * 60, 0, "nccl-watchdog", tax.SignalKind.EXIT)], params)
    (down,) = world.interruptions
    assert down.rework == 20 * 60
    job = world.jobs[JOB]
    lost = (down.resumed_at or 0) - down.at + down.rework
    assert job.productive == params.horizon - lost


def test_a_healthy_node_cordoned_costs_its_gpus_until_returned() -> None:
    """A policy that cordons a spare node for nothing: it is back after the repair time, and its GPU-hours count."""

    class Cordoner(baselines.KubernetesAlone):
        name = "cordoner"

        async def attach(self, world: world_.World) -> None:
            await super().attach(world)
            world.at(HOUR, lambda: world.cordon(5, cause="nothing"))

    params = small(days=2.0)
    world = replay(Cordoner(), [], params)
    (record,) = world.cordons
    assert record.healthy
    assert record.returned_at == HOUR + params.repair_hours * HOUR
    assert record.idle_seconds == params.repair_hours * HOUR
