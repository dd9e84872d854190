"""Reports as a workload's init containers would write them, built from recorded nccl-tests outputs.

Owns making a whole workload's set of reports (one per rank, every round of the round-robin schedule)
from two nccl-tests outputs: what a healthy pair printed, and what a pair with a degraded node printed.
A pair with a slow node gets the degraded output, the others the healthy one. Either in kcover's
native format (the output itself in `nccl_tests`) or in the Go project's (`allreduce_ms`, shape, dtype
bytes and world size, taken from the output's largest row), so both can be checked to judge alike.
For the `preflight-slow-node` scenario and tests; pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kcover_preflight import initcontainer, nccltests, reports


def go_batch_numbers(output: str, world_size: int) -> dict[str, object]:
    """The Go-format fields stating the largest row of `output` (time in ms, shape, dtype bytes, ranks)."""
    row = nccltests.parse(output).largest
    dtype_bytes = row.size_bytes // row.count
    return {"allreduce_ms": row.out_of_place.time_us / 1000.0, "allreduce_shape": [row.count],
            "dtype_bytes": dtype_bytes, "world_size": world_size}


def workload_reports(*, workload: str, nodes: Sequence[str], ips: Sequence[str], healthy: str, degraded: str,
                     slow: Collection[str] = (), go_format: bool = False, world_size: int = 4,
                     threshold_gbps: str = "0") -> list[reports.Report]:
    """One report per rank (rank r ran on `nodes[r]` with IP `ips[r]`)."""
    rounds = initcontainer.schedule(len(nodes))
    out = []
    for rank, (node, ip) in enumerate(zip(nodes, ips, strict=True)):
        batches = []
        for index, pairs in enumerate(rounds):
            peer = initcontainer.peer_of(rank, pairs)
            if peer is None:
                batches.append(reports.Batch(batch_idx=index, pair=[ip], self_ip=ip, status=reports.BatchStatus.SKIP))
                continue
            low, high = sorted((rank, peer))
            output = degraded if (node in slow or nodes[peer] in slow) else healthy
            fields: dict[str, object] = ({**go_batch_numbers(output, world_size)} if go_format
                                         else {"nccl_tests": output, "world_size": world_size})
            batches.append(reports.Batch.model_validate({"batch_idx": index, "pair": [ips[low], ips[high]],
                                                         "self_ip": ip, "status": "ok", **fields}))
        out.append(reports.Report(workload=workload, workload_size=len(nodes), rank=rank, node_name=node,
                                  node_ip=ip, gpu_check=reports.Check.PASS, storage_check=reports.Check.PASS,
                                  node_check_busbw_threshold_gbps=threshold_gbps, batches=batches))
    return out
