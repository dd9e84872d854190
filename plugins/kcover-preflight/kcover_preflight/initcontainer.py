#!/usr/bin/env python3
"""Reference `preflight` init container: pairwise nccl-tests over a workload's nodes, then the report.

Standard library only: copy this one file into an image that has nccl-tests (built with MPI=1) and
an MPI launcher, and run it as the init container named `preflight` (see the plugin's README for the
image notes and the pod spec). Every rank runs it with the same node list (`--peers`, node IPs in rank
order). It

1. builds the round-robin schedule (`schedule`): n-1 rounds for n nodes (n rounds, each with one node
   sitting out, when n is odd), every node meeting every other node exactly once;
2. in each round, the pair's higher rank connects to the lower one (`--port`) and says which round it
   is in and who it is; the lower rank runs the nccl-tests command (`--command`, a template) for the two
   nodes only then, and answers with its output on that connection. So a command starts only once both
   of its nodes have finished every earlier round (no node is ever in two measurements at once), and a
   result goes back on the connection of its own round and pair (a peer that came early for a later
   round waits, held, until this rank gets there; one for a round this rank has left is closed);
3. writes the report to `<report-dir>/<namespace>/<workload>-<index>.json` in the Go project's schema
   plus kcover's `nccl_tests` field (the printed output, NCCL INFO lines dropped, the tail kept).

It exits 0 whenever it wrote a report, even one with failed rounds: judging is the controller's job,
and a job should not be held in Init by a flaky pair. It exits 2 on bad arguments and 1 when the
report cannot be written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = "v1"
DEFAULT_COMMAND = ("mpirun --allow-run-as-root --bind-to none -np {np} -H {low_ip}:{gpus},{high_ip}:{gpus} "
                   "-x NCCL_DEBUG=WARN all_reduce_perf -b {bytes} -e {bytes} -f 2 -g 1 -c 1 -n 20")
OUTPUT_TAIL = 48 * 1024
"""Bytes of nccl-tests output kept per round: the table of a full `-b 8 -e 8G` sweep is about 5 KiB."""
_NOISE = re.compile(r"\bNCCL (?:INFO|TRACE)\b")

Round = list[tuple[int, int | None]]


def schedule(n: int) -> list[Round]:
    """Round-robin pairs of ranks 0..n-1 (the circle method): rank 0 stays, the others rotate. With an
    odd n a phantom rank is added; whoever meets it sits the round out (peer None)."""
    if n < 1:
        raise ValueError("a schedule needs at least one node")
    ranks: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    size = len(ranks)
    rounds: list[Round] = []
    for _ in range(size - 1):
        pairs: Round = []
        for i in range(size // 2):
            a, b = ranks[i], ranks[size - 1 - i]
            if a is None:
                a, b = b, a
            assert a is not None
            pairs.append((min(a, b), max(a, b)) if b is not None else (a, None))
        rounds.append(sorted(pairs, key=lambda p: p[0]))
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


def peer_of(rank: int, pairs: Round) -> int | None:
    for a, b in pairs:
        if a == rank:
            return b
        if b == rank:
            return a
    raise ValueError(f"rank {rank} is not in this round")


def keep(output: str, limit: int = OUTPUT_TAIL) -> str:
    """nccl-tests output without NCCL INFO lines, its last `limit` bytes."""
    text = "\n".join(line for line in output.splitlines() if not _NOISE.search(line))
    raw = text.encode()
    return raw[-limit:].decode("utf-8", "ignore") if len(raw) > limit else text


@dataclass
class Options:
    namespace: str
    workload: str
    index: int
    rank: int
    peers: list[str]
    node_name: str
    node_ip: str
    report_dir: Path
    command: str = DEFAULT_COMMAND
    message_bytes: int = 1 << 30
    gpus: int = 8
    port: int = 29_471
    port_stride: int = 0
    """Port of rank r = port + r * port_stride: 0 in a cluster (one IP per node); tests on one host use 1."""
    round_timeout: float = 600.0
    threshold_gbps: str = "0"
    gpu_check: int = 0
    storage_check: int = 0


def _listen(opts: Options) -> socket.socket:
    return socket.create_server(("", opts.port + opts.rank * opts.port_stride), reuse_port=False,
                                backlog=max(len(opts.peers), 16))


HELLO_LIMIT = 256
"""Bytes a round's greeting may take (`{"round": i, "rank": r}` and a newline)."""
RESULT_GRACE = 30.0
"""Seconds the higher rank waits for the result past the round timeout (the command's own limit), once the
lower rank said it started; also the limit on each send."""


def _greeting(conn: socket.socket, deadline: float) -> tuple[tuple[int, int], bytes]:
    """The (round, rank) a peer says it is in (one JSON line, by `deadline`) and whatever came after that
    line; ValueError or OSError for anything else."""
    data = b""
    while b"\n" not in data:
        if len(data) > HELLO_LIMIT:
            raise ValueError("not a greeting: too long")
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("closed before its greeting")
        data += chunk
    line, rest = data.split(b"\n", 1)
    said = json.loads(line)
    if not isinstance(said, dict) or not all(type(said.get(k)) is int for k in ("round", "rank")):
        raise ValueError(f"not a greeting: {line[:HELLO_LIMIT]!r}")
    return (said["round"], said["rank"]), rest


class _Inbox:
    """The connections this rank's higher peers open, one per round where it is the lower rank. A peer may
    come before this rank reaches that round: its connection is held until then."""

    def __init__(self, server: socket.socket, rank: int, rounds: list[Round]) -> None:
        self._server, self._rank, self._rounds = server, rank, rounds
        self._early: dict[int, socket.socket] = {}

    def wait(self, index: int, peer: int, deadline: float) -> socket.socket:
        """The connection of round `index` from `peer`; TimeoutError when it does not come by `deadline`."""
        held = self._early.pop(index, None)
        if held is not None:
            return held
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"rank {peer} did not come to round {index}")
            self._server.settimeout(remaining)
            conn, _ = self._server.accept()
            try:
                said, _ = _greeting(conn, min(deadline, time.monotonic() + 10.0))
            except (OSError, ValueError):
                conn.close()
                continue
            if said == (index, peer):
                return conn
            later, who = said
            if later > index and later < len(self._rounds) and later not in self._early and \
                    peer_of(self._rank, self._rounds[later]) == who and self._rank < who:
                self._early[later] = conn  # that peer is a round ahead of this rank: it waits, held
            else:
                conn.close()  # a round this rank has left (its peer gives up on it), or not a peer at all

    def close(self) -> None:
        for conn in self._early.values():
            conn.close()
        self._early.clear()
        self._server.close()


def _ask(host: str, port: int, index: int, rank: int, low: int, deadline: float, wait: float) -> dict[str, object]:
    """As the higher rank: connect to the lower one and say which round this is (both by `deadline`), then
    read its result (at most `wait` seconds after it answered that it started)."""
    greeting = json.dumps({"round": index, "rank": rank}).encode() + b"\n"
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=max(min(5.0, deadline - time.monotonic()), 0.001))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the peer is not listening yet: poll for it
    with conn:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.sendall(greeting)
        said, first = _greeting(conn, deadline)
        if said != (index, low):
            raise ValueError(f"the rank at {host}:{port} is not rank {low} in round {index}")
        conn.settimeout(wait)
        chunks = [first]
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    if not any(chunks):
        raise ValueError(f"rank {low} closed round {index} without a result")
    loaded: dict[str, object] = json.loads(b"".join(chunks))
    return loaded


Runner = Callable[[Sequence[str], float], tuple[int, str]]


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode("utf-8", "replace")
        return 124, out + f"\nTest failure: timed out after {timeout:g}s"
    except OSError as exc:
        return 127, f"Test failure: cannot run {argv[0]}: {exc}"
    return done.returncode, done.stdout


def run_rounds(opts: Options, runner: Runner = run_command) -> list[dict[str, object]]:
    """Play this rank's part of every round; the batches of the report."""
    batches: list[dict[str, object]] = []
    n = len(opts.peers)
    rounds = schedule(n)
    inbox = _Inbox(_listen(opts), opts.rank, rounds) if n > 1 else None
    try:
        for index, pairs in enumerate(rounds):
            peer = peer_of(opts.rank, pairs)
            if peer is None:
                batches.append({"batch_idx": index, "pair": [opts.node_ip], "self_ip": opts.node_ip, "status": "skip"})
                continue
            low, high = min(opts.rank, peer), max(opts.rank, peer)
            batch: dict[str, object] = {"batch_idx": index, "pair": [opts.peers[low], opts.peers[high]],
                                        "self_ip": opts.node_ip, "world_size": 2 * opts.gpus}
            deadline = time.monotonic() + opts.round_timeout
            if opts.rank == low:
                assert inbox is not None
                batch.update(_lead(opts, inbox, index, high, deadline, runner))
            else:
                try:
                    result = _ask(opts.peers[low], opts.port + low * opts.port_stride, index, opts.rank, low,
                                  deadline, opts.round_timeout + RESULT_GRACE)
                except (OSError, ValueError) as exc:
                    result = {"status": "fail", "error": f"no result from rank {low} ({opts.peers[low]}): {exc}"}
                batch.update(result)
            batches.append(batch)
    finally:
        if inbox is not None:
            inbox.close()
    return batches


def _lead(opts: Options, inbox: _Inbox, index: int, high: int, deadline: float,
          runner: Runner) -> dict[str, object]:
    """As the lower rank: wait for the peer to come to this round, run the command, answer with its result."""
    try:
        conn = inbox.wait(index, high, deadline)
    except OSError as exc:
        return {"status": "fail", "error": f"rank {high} ({opts.peers[high]}) did not come to the round: {exc}"}
    with conn:
        try:  # the peer starts its wait for the result now
            conn.settimeout(RESULT_GRACE)
            conn.sendall(json.dumps({"round": index, "rank": opts.rank}).encode() + b"\n")
        except OSError as exc:
            return {"status": "fail", "error": f"rank {high} ({opts.peers[high]}) left the round: {exc}"}
        argv = shlex.split(opts.command.format(np=2 * opts.gpus, gpus=opts.gpus, low_ip=opts.peers[opts.rank],
                                               high_ip=opts.peers[high], bytes=opts.message_bytes))
        code, output = runner(argv, opts.round_timeout)
        result: dict[str, object] = {"status": "ok" if code == 0 else "fail", "nccl_tests": keep(output)}
        if code != 0:
            result["error"] = f"{argv[0]} exited with {code}"
        try:
            conn.sendall(json.dumps(result).encode())
        except OSError as exc:
            result.setdefault("error", f"the peer did not take the result: {exc}")
    return result


def report(opts: Options, batches: list[dict[str, object]]) -> dict[str, object]:
    return {"version": SCHEMA_VERSION, "workload": opts.workload, "workload_size": len(opts.peers),
            "rank": opts.rank, "node_name": opts.node_name, "node_ip": opts.node_ip,
            "gpu_check": opts.gpu_check, "storage_check": opts.storage_check,
            "node_check_busbw_threshold_gbps": opts.threshold_gbps, "batches": batches}


def write_report(opts: Options, doc: dict[str, object]) -> Path:
    """Write atomically (a temporary file renamed), so the agent never reads half a report."""
    folder = opts.report_dir / opts.namespace
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{opts.workload}-{opts.index}.json"
    tmp = folder / f".{path.name}.tmp"
    tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return path


def parse_args(argv: Sequence[str], environ: dict[str, str]) -> Options:
    e = environ.get
    p = argparse.ArgumentParser(prog="preflight", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", default=e("POD_NAMESPACE", ""))
    p.add_argument("--workload", default=e("PREFLIGHT_WORKLOAD", ""))
    p.add_argument("--index", type=int, default=int(e("JOB_COMPLETION_INDEX") or e("LWS_WORKER_INDEX") or -1),
                   help="the LeaderWorkerSet worker index or Job completion index (names the report file)")
    p.add_argument("--rank", type=int, default=None, help="this node's position in --peers (default: --index)")
    p.add_argument("--peers", default=e("PREFLIGHT_PEERS", ""), help="node IPs in rank order, comma-separated")
    p.add_argument("--node-name", default=e("NODE_NAME", ""))
    p.add_argument("--node-ip", default=e("NODE_IP", ""))
    p.add_argument("--report-dir", default=e("PREFLIGHT_REPORT_DIR", "/var/lib/kcover/preflight"))
    p.add_argument("--command", default=e("PREFLIGHT_COMMAND", DEFAULT_COMMAND))
    p.add_argument("--message-bytes", type=int, default=int(e("PREFLIGHT_MESSAGE_BYTES", str(1 << 30))))
    p.add_argument("--gpus", type=int, default=int(e("PREFLIGHT_GPUS", "8")))
    p.add_argument("--port", type=int, default=int(e("PREFLIGHT_PORT", "29471")))
    p.add_argument("--port-stride", type=int, default=0)
    p.add_argument("--round-timeout", type=float, default=float(e("PREFLIGHT_ROUND_TIMEOUT", "600")))
    p.add_argument("--threshold-gbps", default=e("PREFLIGHT_THRESHOLD_GBPS", "0"))
    a = p.parse_args(list(argv))
    peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    rank = a.index if a.rank is None else a.rank
    problems = [m for ok, m in ((a.namespace, "--namespace (or $POD_NAMESPACE)"),
                                (a.workload, "--workload (or $PREFLIGHT_WORKLOAD)"),
                                (a.index >= 0, "--index (or $JOB_COMPLETION_INDEX / $LWS_WORKER_INDEX)"),
                                (peers, "--peers (or $PREFLIGHT_PEERS)"),
                                (0 <= rank < len(peers), "--rank within --peers")) if not ok]
    if problems:
        p.error("missing or invalid: " + ", ".join(problems))
    return Options(namespace=a.namespace, workload=a.workload, index=a.index, rank=rank, peers=peers,
                   node_name=a.node_name, node_ip=a.node_ip or peers[rank], report_dir=Path(a.report_dir),
                   command=a.command, message_bytes=a.message_bytes, gpus=a.gpus, port=a.port,
                   port_stride=a.port_stride, round_timeout=a.round_timeout, threshold_gbps=str(a.threshold_gbps))


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv, dict(os.environ if environ is None else environ))
    batches = run_rounds(opts)
    try:
        path = write_report(opts, report(opts, batches))
    except OSError as exc:
        print(f"preflight: cannot write the report: {exc}", file=sys.stderr)
        return 1
    failed = sum(1 for b in batches if b.get("status") == "fail")
    print(f"preflight: wrote {path} ({len(batches)} rounds, {failed} failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
