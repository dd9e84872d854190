"""`kcover sim fleet` end to end: a 2-day, 64-node replay of all four policies, kcover through its real code.

Checks the report's invariants (its counts add up, the lost GPU-hours' parts make the whole), that one
seed gives one report, that a fault on a bad GPU strikes again until it is isolated and never after, and
the command line (text, JSON, the plot, a trace written and replayed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kcover import cli
from kcover.sim.fleet import report
from kcover.sim.fleet import running as fleet
from kcover.sim.fleet import state as st
from kcover.sim.fleet import taxonomy as tax
from kcover.sim.fleet import trace as trace_

HOUR = 3600.0
PARAMS = st.Params(nodes=64, jobs=((1, 32), (2, 8), (3, 2)), days=2.0, seed=3)
INJECTED = [
    # a GPU corrupting data on the 32-node job: only its rank's exit shows, so only a person finds it
    trace_.Onset(2 * HOUR, 5, 1, "silent-data-corruption", tax.SignalKind.EXIT),
    # a GPU falling off the bus under an 8-node job
    trace_.Onset(20 * HOUR, 35, 4, "faulty-gpu", tax.SignalKind.XID, 79),
    # a bug in the other 8-node job
    trace_.Onset(30 * HOUR, 43, None, "software-bug", tax.SignalKind.EXIT),
]


def onsets() -> list[trace_.Onset]:
    taxonomy = tax.load()
    drawn = trace_.generate(taxonomy, nodes=PARAMS.nodes, gpus_per_node=PARAMS.gpus_per_node, days=PARAMS.days,
                            seed=PARAMS.seed, scale=8.0)
    return sorted([*drawn, *INJECTED])


@pytest.fixture(scope="module")
def replayed() -> tuple[dict[str, report.Figures], dict[str, object], list[trace_.Onset]]:
    trace = onsets()
    figs, timing = fleet.replay(PARAMS, tax.load(), trace, list(report.POLICIES))
    return figs, timing, trace


def test_every_policy_replays_the_same_trace(replayed: tuple[dict[str, report.Figures], dict[str, object],
                                                               list[trace_.Onset]]) -> None:
    figs, timing, trace = replayed
    assert set(figs) == set(report.POLICIES)
    assert len(trace) > len(INJECTED), "the generator drew faults as well"
    assert int(str(timing["kcover_api_requests"])) > 0, "kcover ran against the simulated API server"


@pytest.mark.parametrize("policy", report.POLICIES)
def test_the_counts_add_up(replayed: tuple[dict[str, report.Figures], dict[str, object], list[trace_.Onset]],
                           policy: str) -> None:
    fig = replayed[0][policy]
    for blame, row in fig.struck.items():
        assert row["isolated"] + row["restarted"] + row["nothing"] == row["faults"], blame
        assert row["right"] <= row["faults"]
    assert sum(row["faults"] for row in fig.struck.values()) == sum(row["faults"] for row in fig.by_class.values())
    assert sum(row["interruptions"] for row in fig.by_class.values()) == fig.interruptions
    assert fig.isolated_by_policy + fig.isolated_by_person + fig.never_isolated == fig.hardware_faults
    assert fig.repeat_interruptions <= fig.interruptions
    assert sum(fig.healthy_cordons_by_blame.values()) == fig.healthy_cordons <= fig.cordons
    assert fig.restarts_per_interruption == pytest.approx(fig.restarts / fig.interruptions)
    lost = fig.lost_gpu_hours
    parts = lost["decision"] + lost["restart"] + lost["waiting_for_nodes"] + lost["rework"]
    assert parts == pytest.approx(lost["all"], rel=1e-6), "every lost GPU-hour belongs to one interruption"
    assert lost["policy_part"] <= lost["all"] + 1e-6
    assert 0.0 < fig.ettr_fleet < 1.0
    assert min(fig.ettr_jobs.values()) <= fig.ettr_fleet <= max(fig.ettr_jobs.values())


def test_the_oracle_bounds_every_policy(replayed: tuple[dict[str, report.Figures], dict[str, object],
                                                        list[trace_.Onset]]) -> None:
    figs = replayed[0]
    oracle = figs["oracle"]
    assert oracle.repeat_interruptions == 0
    assert oracle.healthy_cordons == 0
    assert oracle.isolated_by_policy == oracle.hardware_faults
    for name in ("kcover", "kubernetes", "go"):
        assert figs[name].ettr_fleet <= oracle.ettr_fleet + 1e-9, name
    assert figs["kubernetes"].restarts == 0
    assert figs["kubernetes"].cordons == 0


def test_one_seed_one_report(replayed: tuple[dict[str, report.Figures], dict[str, object], list[trace_.Onset]]) -> None:
    figs, _, trace = replayed
    again, _ = fleet.replay(PARAMS, tax.load(), onsets(), list(report.POLICIES))
    assert onsets() == trace
    for name in report.POLICIES:
        first = report.document({name: figs[name]}, {})
        second = report.document({name: again[name]}, {})
        assert first == second, name


def test_a_bad_gpu_strikes_again_until_it_is_isolated_and_never_after() -> None:
    """The injected silent data corruption, replayed under each policy: it keeps failing the job on its node
    until someone isolates the node; the oracle isolates it at its first signal."""
    trace = sorted(INJECTED)
    for name in report.POLICIES:
        world = fleet_world(name, trace)
        (sdc,) = [f for f in world.faults if f.cls.name == "silent-data-corruption"]
        hits = [i for i in world.interruptions if i.fault is sdc]
        assert sdc.isolated_at is not None, name
        assert all(i.at <= sdc.isolated_at for i in hits), f"{name}: a strike after the node was isolated"
        if name == "oracle":
            assert len(hits) == 1
            assert sdc.isolated_at == hits[0].at
        else:
            assert len(hits) >= 2, f"{name}: the bad GPU was left in service and struck {len(hits)} time(s)"
            assert all(i.repeat for i in hits[1:])


def fleet_world(name: str, trace: list[trace_.Onset], overrides: dict[str, object] | None = None
                ) -> fleet.world_.World:
    from kcover.sim.fleet import virtualtime
    world = fleet.world_.World(PARAMS, tax.load(), trace, fleet.policy_of(name, PARAMS, overrides or {}))
    virtualtime.run(world.run())
    return world


def test_a_gpu_failing_one_job_twice_with_xid13_is_validated_and_isolated_before_its_next_diagnostic() -> None:
    """XID 13 is application-class: its first strike only restarts the job. Its second on the same GPU makes
    the node suspect, kcover asks its agent to validate it, and the failed diagnostic cordons it, without
    waiting for the hourly one; with the rule out of the way the GPU stays in service until that runs."""
    trace = [trace_.Onset(20 * HOUR + 60, 35, 4, "faulty-gpu", tax.SignalKind.XID, 13)]
    world = fleet_world("kcover", trace)
    (bad,) = world.faults
    hits = [i for i in world.interruptions if i.fault is bad]
    agents = world.policy.agents  # type: ignore[attr-defined]
    assert bad.isolated_by == "policy"
    assert len(hits) >= 2, [round(i.at) for i in hits]
    assert bad.isolated_at is not None
    assert hits[1].at < bad.isolated_at < hits[1].at + 120, "validated within two minutes of the second strike"
    assert agents[35].validations == 1
    assert agents[35].healthy_validations == 0
    decided = hits[1].decided_at
    assert decided is not None
    assert bad.isolated_at <= decided < hits[1].at + 120, "restarted after the cordon, within two minutes"
    assert len(hits) == 2, "the restart waited for the verdict: the job never started on the bad GPU again"
    assert sum(a.validations for a in agents.values()) == 1, "no other node was asked"
    diagnosed = fleet_world("kcover", trace, {"recovery": {"judgement": {"device_restarts": 99}}})
    (later,) = diagnosed.faults
    assert later.isolated_at is not None
    assert bad.isolated_at is not None
    assert bad.isolated_at < later.isolated_at, "validated sooner than the hourly diagnostic"
    assert sum(a.validations for a in diagnosed.policy.agents.values()) == 0  # type: ignore[attr-defined]


def test_a_bad_cable_whose_link_went_down_is_cordoned_when_the_job_fails_not_at_its_next_flap() -> None:
    """A network cable of a node under the 32-node job goes down once: the agent's `rdma-link` sees one
    link-down (evidence only), and NCCL's watchdog ends every rank ten minutes later. kcover cordons that node
    before it restarts the job, so the cable never strikes again; with `link_down` off it waits for the
    cable's second flap (the detector's own threshold), a repeat interruption later."""
    trace = [trace_.Onset(6 * HOUR, 12, 2, "network-cable", tax.SignalKind.LINK)]
    world = fleet_world("kcover", trace)
    (bad,) = world.faults
    hits = [i for i in world.interruptions if i.fault is bad]
    assert len(hits) == 1, [round(i.at) for i in hits]
    assert bad.isolated_by == "policy"
    assert bad.isolated_at is not None
    assert hits[0].decided_at is not None
    assert bad.isolated_at <= hits[0].decided_at, "cordoned before the job's restart"
    assert hits[0].at + 600 <= bad.isolated_at < hits[0].at + 660, "at the watchdog's exits"
    assert all(not c.healthy for c in world.cordons), "no healthy node cordoned"
    waited = fleet_world("kcover", trace, {"recovery": {"judgement": {"link_down": "off"}}})
    (later,) = waited.faults
    again = [i for i in waited.interruptions if i.fault is later]
    assert len(again) >= 2, "without the evidence the cable struck again before its second flap cordoned it"
    assert later.isolated_at is not None
    assert later.isolated_at > bad.isolated_at


def test_the_command_line_prints_the_table_writes_json_a_plot_and_a_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sim", "fleet", "--nodes", "24", "--job-mix", "1x16,1x4", "--days", "1", "--seed", "2",
            "--fault-rate-scale", "10"]
    written = tmp_path / "trace.jsonl"
    picture = tmp_path / "fleet.png"
    assert cli.main([*base, "--write-trace", str(written), "--plot", str(picture)]) == 0
    text = capsys.readouterr().out
    assert "HEADLINE: kcover's effective training time is" in text
    assert "effective training time, fleet (%)" in text
    assert "healthy nodes cordoned" in text
    for name in report.POLICIES:
        assert name in text.splitlines()[6], "one column per policy"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main([*base, "--trace", str(written), "--report", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["policies"]) == set(report.POLICIES)
    assert doc["meta"]["onsets"] == len(written.read_text().splitlines())
    assert doc["meta"]["checkpoint_minutes"] == 30.0
    assert doc["meta"]["restart_minutes"] == 10.0
    assert doc["kcover_to_oracle_points"] == pytest.approx(
        100 * (doc["policies"]["oracle"]["ettr_fleet"] - doc["policies"]["kcover"]["ettr_fleet"]), abs=1e-3)
    assert cli.main(["sim", "fleet", "--nodes", "8", "--job-mix", "2x8"]) == 2
    assert "needs 16 nodes" in capsys.readouterr().err


def test_the_world_pops_no_event_before_a_policy_that_acted_early_has_reached_it() -> None:
    """A policy that acts before the world's next event returns early; the world asks it again for that
    event's time rather than letting the event happen before the policy's own clock got there."""
    from kcover.sim.fleet import baselines, virtualtime

    class EarlyActor(baselines.KubernetesAlone):
        def __init__(self) -> None:
            self.calls: list[tuple[float, bool]] = []
            self.acted = False

        async def advance(self, until: float) -> bool:
            reached = self.acted or until <= HOUR
            if not reached:
                self.acted = True
                self.world.now = HOUR  # acts at one hour, before the world's next event
                await self.world.cordon(0, cause="test")
            self.calls.append((until, reached))
            return reached

    policy = EarlyActor()
    world = fleet.world_.World(PARAMS, tax.load(), [trace_.Onset(10 * HOUR, 3, None, "host-maintenance",
                                                                 tax.SignalKind.NOTREADY)], policy)
    virtualtime.run(world.run())
    early = next(i for i, (_, reached) in enumerate(policy.calls) if not reached)
    assert policy.calls[early + 1] == (policy.calls[early][0], True), "asked again for the same time"
    assert world.cordons[0].at == HOUR
    assert policy.calls[-1] == (PARAMS.horizon, True)
