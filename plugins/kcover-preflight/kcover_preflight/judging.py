"""The preflight verdict: which pairs are slow and which nodes the slow pairs implicate.

Owns the rule, as a pure function of a workload's reports (`judge`). A **pair is slow** when

* either end reported it failed (a `fail` batch, nccl-tests refused by `nccltests`), or
* its busbw is below the absolute threshold (`absolute_gbps`; 0, the default, turns it off; a report's
  own `node_check_busbw_threshold_gbps` applies when the setting is 0), or
* its busbw is below `relative_fraction` (default 0.5) of the **median busbw of the workload's pairs
  measured at the same message size**.

Only the workload's own nodes can be named: a pair entry is a node of the workload when it is one of
`nodes` (the addresses and names of the nodes the workload's pods run on, from the cluster, so a silent
rank's node is still judged from its peers' reports), or a member's node name, or the `node_ip` a member
reported; any other entry is not a node of this workload, and its pair is left out (`Judgement.foreign_pairs`);
a rank's checks speak for its own node only, and a failed `gpu_check` counts only on a GPU node whose
pod holds GPUs.

A **node is slow** when its GPU or storage check failed, or when both hold:

1. it is in a slow pair in every round that has a slow pair and in which it was paired, and
2. more than half of its measured pairs are slow.

Why this rule. In a round-robin every node meets every other node once. One degraded node X makes
all n-1 of its pairs slow and none of the others, so X is slow in every failing round and in all of
its pairs, while a healthy node Y has exactly one slow pair (the one with X): 1 of n-1, never a
majority for n >= 3. A single flaky pair A-B (no degraded node) fails only one round, which alone
satisfies (1) for A and B; (2) rejects them, where the Go project's rule (1 alone) would cordon both.
With k degraded nodes a healthy node has k slow pairs of n-1, so it stays unblamed while k < (n-1)/2;
past that, and once half or more of all pairs are slow, the median itself is a slow pair and the
relative test goes blind: a fleet that is uniformly slow looks healthy to it (use the absolute
threshold to catch that). With two nodes there is one pair: the relative test cannot fire (the pair
is its own median), and a failed or too-slow pair implicates both ends: nobody can tell which end is
at fault from one measurement.

Small messages are latency-bound (nccl-tests prints 0.00 GB/s for them), so a native nccl-tests
result is judged at its largest message size only; a Go-format batch has one size.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kcover_preflight import reports


class Verdict(enum.StrEnum):
    PENDING = "Pending"
    """Reports are still coming in."""
    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    """At least one node is slow."""
    INCOMPLETE = "Incomplete"
    """The collection timeout passed with ranks missing, and no node was found slow."""


@dataclass(frozen=True)
class Member:
    """One rank's report, with the node it ran on (its pod's, as vetted)."""

    rank: int
    node: str
    report: reports.Report
    gpu_node: bool = True
    """Whether `node` is a GPU node where this rank's pod holds GPUs: a failed `gpu_check` counts only then."""

    @property
    def failed_checks(self) -> list[str]:
        return [c for c in self.report.failed_checks if c != "gpu" or self.gpu_node]


@dataclass(frozen=True)
class PairResult:
    batch: int
    nodes: tuple[str, str]
    size_bytes: int | None
    busbw_gbps: float | None
    median_gbps: float | None
    slow: bool
    why: str = ""


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    pairs: tuple[PairResult, ...]
    slow_nodes: dict[str, str] = field(default_factory=dict)
    """Node -> why it is slow."""
    missing_ranks: tuple[int, ...] = ()
    foreign_pairs: int = 0
    """Pairs left out because an end is not a node of this workload."""

    def pairs_of(self, node: str) -> list[PairResult]:
        return [p for p in self.pairs if node in p.nodes]


def missing_ranks(members: Iterable[Member], size: int) -> tuple[int, ...]:
    seen = {m.rank for m in members}
    return tuple(r for r in range(size) if r not in seen)


def _merged(members: Sequence[Member]) -> dict[tuple[int, tuple[str, ...]], list[reports.Measurement]]:
    found: dict[tuple[int, tuple[str, ...]], list[reports.Measurement]] = {}
    for member in members:
        for batch in member.report.batches:
            measured = reports.measure(batch)
            if measured is not None:
                found.setdefault((measured.batch, measured.ends), []).append(measured)
    return found


def _node_names(members: Sequence[Member], nodes: Mapping[str, str]) -> dict[str, str]:
    """A pair entry -> the workload's node it names: `nodes` first (the cluster's word), then members' node
    names, then the `node_ip` each member reported."""
    names: dict[str, str] = dict(nodes)
    for m in members:
        if m.node:
            names.setdefault(m.node, m.node)
    for m in members:
        if m.report.node_ip and m.node:
            names.setdefault(m.report.node_ip, m.node)
    return names


def judge(members: Sequence[Member], *, size: int, relative_fraction: float = 0.5,
          absolute_gbps: float = 0.0, nodes: Mapping[str, str] | None = None) -> Judgement:
    """The verdict on a workload's reports (`size` ranks expected): on a complete set, or on what came
    in by the collection timeout. `nodes`: address or name -> node, for the nodes the workload's pods run
    on. Pure."""
    names = _node_names(members, nodes or {})
    threshold = absolute_gbps or max((m.report.threshold_gbps for m in members), default=0.0)

    # one result per (round, pair): either end may carry the numbers; a failure at either end counts
    merged: list[tuple[int, tuple[str, str], int | None, float | None, str]] = []
    foreign = 0
    for (batch, ends), seen in sorted(_merged(members).items()):
        named = {names.get(end) for end in ends}
        if len(ends) != 2 or None in named or len(named) != 2:
            foreign += 1  # an end that is not one of the workload's nodes: nothing to say about it
            continue
        a, b = sorted(str(n) for n in named)
        failures = [m.why for m in seen if m.failed]
        sizes = [m.size_bytes for m in seen if m.size_bytes is not None and not m.failed]
        values = [m.busbw_gbps for m in seen if m.busbw_gbps is not None and not m.failed]
        busbw = min(values) if values and not failures else None
        merged.append((batch, (a, b), max(sizes) if sizes else None, busbw, "; ".join(dict.fromkeys(failures))))

    by_size: dict[int, list[float]] = {}
    for _, _, size_bytes, busbw, _ in merged:
        if size_bytes is not None and busbw is not None:
            by_size.setdefault(size_bytes, []).append(busbw)
    medians = {s: statistics.median(v) for s, v in by_size.items()}

    pairs: list[PairResult] = []
    for batch, pair_nodes, size_bytes, busbw, failure in merged:
        median = medians.get(size_bytes) if size_bytes is not None else None
        why = failure
        if not why and busbw is not None:
            if threshold > 0 and busbw < threshold:
                why = f"busbw {busbw:.2f} GB/s below the threshold of {threshold:g} GB/s"
            elif relative_fraction > 0 and median is not None and busbw < relative_fraction * median:
                why = (f"busbw {busbw:.2f} GB/s below {relative_fraction:g} x the median {median:.2f} GB/s "
                       f"at {size_bytes} B")
        pairs.append(PairResult(batch, pair_nodes, size_bytes, busbw, median, bool(why), why))

    slow: dict[str, str] = {}
    for m in members:
        if m.failed_checks:
            slow[m.node] = f"{' and '.join(m.failed_checks)} check failed on rank {m.rank}"
    failing_rounds = {p.batch for p in pairs if p.slow}
    for node in sorted({n for p in pairs for n in p.nodes}):
        mine = [p for p in pairs if node in p.nodes]
        bad = [p for p in mine if p.slow]
        rounds = {p.batch for p in mine}
        everywhere = all(any(p.batch == r for p in bad) for r in failing_rounds & rounds)
        if bad and everywhere and 2 * len(bad) > len(mine) and node not in slow:
            slow[node] = f"slow in {len(bad)} of its {len(mine)} pairs ({bad[0].why})"

    missing = missing_ranks(members, size)
    if slow:
        verdict = Verdict.DEGRADED
    elif missing:
        verdict = Verdict.INCOMPLETE
    else:
        verdict = Verdict.HEALTHY
    return Judgement(verdict, tuple(pairs), slow, missing, foreign)
