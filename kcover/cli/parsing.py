"""The `kcover` argument parser: every command, its subcommands and options.

Owns the parser (`build_parser`), the separate parser of `kcover sim inject`, and which commands' modules
are imported only when that command runs (`TOOLS`: the simulated cluster and the bench). Does not own what
a command does (the other modules of `kcover.cli`) nor a role's own options (`kcover.wiring`).

How it fails: argparse exits 2 with usage on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from typing import Any

from kcover import settings, wiring
from kcover.cli import operating


def _add_common(p: argparse.ArgumentParser, *, long_running: bool = False) -> None:
    """The settings options; `long_running` (a role) re-reads its file when it changes, a one-shot command once."""
    p.add_argument("--config", default=settings.DEFAULT_CONFIG_PATH,
                   help=f"YAML settings file{', re-read when it changes' if long_running else ''} "
                        f"(default {settings.DEFAULT_CONFIG_PATH})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one setting, e.g. --set recovery.workload_cooldown_seconds=120 (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["auto", "json", "console"])


def _add_release(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", help="the chart's release namespace: where the controllers' config ConfigMap, "
                                       "Lease, ledger and controls ConfigMap are (default kcover-system)")
    p.add_argument("--config-map", help="the chart's config ConfigMap, whose config.yaml the controllers run with "
                                        "(default kcover-config: `<release>-config` for a release named kcover); "
                                        "--set overrides it; --config is used only where it cannot be read")


def _add_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=operating.ONE_SHOT_TIMEOUT_SECONDS, metavar="SECONDS",
                   help="give up when the API server has not answered within this many seconds, connecting and "
                        f"retrying included (default {operating.ONE_SHOT_TIMEOUT_SECONDS:g})")


TOOLS = {"sim": "kcover.sim.running", "bench": "kcover.bench.running"}
"""Commands whose module (and its arguments) is imported only when that command runs: the simulated
cluster and the bench are never loaded by `kcover controller` or `kcover agent`."""


def tool(command: str) -> Any:
    return importlib.import_module(TOOLS[command])


def build_parser(roles: Mapping[str, tuple[str, wiring.RoleMain, wiring.AddArgs]], *,
                 command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the arguments of `sim` and `bench` are added only when `command` is that one (or None)."""
    parser = argparse.ArgumentParser(prog="kcover", description="Fault awareness and recovery for GPU training jobs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, (help_text, _, add_args) in roles.items():
        p = sub.add_parser(name, help=help_text)
        _add_common(p, long_running=True)
        p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
        p.add_argument("--port", type=int, help="health and metrics port")
        add_args(p)

    p = sub.add_parser("detectors", help="list the installed detectors with their distribution and version")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--strict", action="store_true", help="exit 1 if a detector plugin fails to load")
    p.add_argument("--url", default="", help="a running controller's or agent's health server "
                   "(http://pod:8080): show its detectors' runtime state from /detectors; exit 1 if one failed")

    p = sub.add_parser("config", help="check or show configuration")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    c = csub.add_parser("check", help="validate a settings file; exit 1 with field-level errors")
    c.add_argument("file")
    c = csub.add_parser("show", help="the effective settings and where each value came from")
    _add_common(c)
    c.add_argument("-o", "--output", choices=["table", "json"], default="table")

    p = sub.add_parser("sim", help="run kcover on a simulated GPU cluster and play a fault scenario",
                       description="Start a simulated cluster (API server, kubelets, Kubeflow operator, GPU nodes, "
                                   "PyTorchJobs) with two real controller replicas and one real agent per node, "
                                   "play a fault scenario and report what kcover did; with --serve, keep it running "
                                   "for kubectl and `kcover sim inject KIND ...` (faults on demand). Exit 0 when it passed, 1 when it "
                                   "failed, 2 on bad usage, 3 when it could not run (a detector plugin it needs is "
                                   "missing).")
    if command in (None, "sim"):
        tool("sim").add_arguments(p)
    p = sub.add_parser("bench", help="measure latency, scale, throughput and API cost against the targets")
    if command in (None, "bench"):
        tool("bench").add_arguments(p)

    p = sub.add_parser("breaker", help="the latched circuit breaker (recovery.breaker_latch)")
    bsub = p.add_subparsers(dest="breaker_command", required=True, metavar="SUBCOMMAND")
    b = bsub.add_parser("reset", help="ask the leader to close a latched breaker (kcover acts again after "
                                      "recovery.breaker_cooldown_seconds); on a breaker that is not latched, change "
                                      "nothing and say so")
    _add_common(b)
    b.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    _add_release(b)
    b.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the leader to close it (default 15; "
                                                           "exit 1 when it did not)")
    _add_timeout(b)

    p = sub.add_parser("status", help="what kcover is doing, judged with the controllers' settings: leader, breaker, "
                                      "limits and their use, pauses, held restarts, suspect nodes, cordons, recoveries "
                                      "of the last 24 h, budgets; exit 1 when something needs a person, 3 when the "
                                      "cluster cannot be read")
    _add_common(p)
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    _add_release(p)
    _add_timeout(p)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")

    sub.add_parser("version", help="print the version")
    return parser


def sim_inject_parser() -> argparse.ArgumentParser:
    """The parser of `kcover sim inject KIND ...` (parsed apart from `kcover sim`, whose optional positional
    scenario leaves no room for a subcommand)."""
    control = importlib.import_module("kcover.sim.control")
    p = argparse.ArgumentParser(prog="kcover sim inject",
                                description="Inject a fault into a simulated cluster served by `kcover sim --serve "
                                            "--kubeconfig-out FILE`, reached through that kubeconfig: a container "
                                            "error, an XID on a GPU (through the node's simulated NVML), a DRA device's "
                                            "health, a NotReady node, or an NCCL-hang Event. Exit 0 injected, 1 "
                                            "refused (the reason on stderr), 3 no served cluster there.")
    control.add_arguments(p)
    return p
