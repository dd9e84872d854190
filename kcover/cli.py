"""The `kcover` command line: the composition root.

Owns reading files and the environment, building settings with their provenance and checking all of
the configuration (`kcover.checking`: rules, detector configs, XID policy) before a role starts or a
reload applies, handing the roles in `wiring` what they need, and the process lifecycle (signals,
one TaskGroup, the health server, hot reload). Exit codes: 0 success, 1 invalid configuration or a
failed check, 2 usage errors (argparse).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog
import yaml
from pydantic import ValidationError

import kcover
from kcover import checking, errors, logs, metrics, reloading, serving, settings, wiring
from kcover.aio import clock as clock_
from kcover.detectors import contract, registry

log = structlog.get_logger()


# ---------------------------------------------------------------------------------------------- settings I/O

def read_config_file(path: str, *, required: bool) -> dict[str, Any]:
    """Parse a YAML config file; a missing optional file is empty. Raises ConfigError with the position."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if required:
            raise errors.ConfigError(f"{path}: no such file") from exc
        return {}
    except OSError as exc:
        raise errors.ConfigError(f"{path}: cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ConfigError(f"{path}: not valid YAML", [f"{path}: {exc}".replace("\n", " ")]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise errors.ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data


def load_settings(config_path: str, cli_values: Mapping[str, Any], *, environ: Mapping[str, str] | None = None,
                  required: bool = False) -> settings.Layered:
    env = os.environ if environ is None else environ
    data = read_config_file(config_path, required=required)
    return settings.layer(file_data=data, file_name=config_path, environ=env, cli=cli_values)


def checked_loader(config_path: str, cli_values: Mapping[str, Any], *, role: contract.Role,
                   detectors: registry.Registry, environ: Mapping[str, str] | None = None) -> reloading.Loader:
    """The reloader's `load`: read the layers and check all of the configuration as `role` uses it."""
    def load() -> settings.Layered:
        layered = load_settings(config_path, cli_values, environ=environ)
        checking.validate(layered.settings, detectors, role=role)
        return layered
    return load


def _cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "kube.kubeconfig": getattr(args, "kubeconfig", None),
        "logging.level": getattr(args, "log_level", None),
        "logging.format": getattr(args, "log_format", None),
        "server.port": getattr(args, "port", None),
        "recovery.dry_run": True if getattr(args, "dry_run", False) else None,
        "agent.node_name": getattr(args, "node_name", None),
        "lease.identity": getattr(args, "identity", None),
    }
    pairs.update(_set_values(args))
    return {k: v for k, v in pairs.items() if v is not None}


def _set_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `--set KEY=VALUE` options, as dotted paths to values."""
    pairs: dict[str, Any] = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise errors.ConfigError("invalid --set", [f"--set {item}: expected KEY=VALUE"])
        pairs[key.strip()] = yaml.safe_load(value)
    return {k: v for k, v in pairs.items() if v is not None}


# ---------------------------------------------------------------------------------------------- commands

def cmd_version(_: argparse.Namespace) -> int:
    print(f"kcover {kcover.__version__} (python {sys.version.split()[0]})")
    return 0


def cmd_detectors(args: argparse.Namespace) -> int:
    if args.url:
        return _running_detectors(args.url, args.output)
    reg = registry.discover()
    rows = [{"name": i.name, "roles": ",".join(sorted(r.value for r in i.roles)) or "-",
             "distribution": i.distribution, "version": i.version, "entry_point": i.value,
             "status": "ok" if i.cls is not None else f"error: {i.error}"} for i in reg.infos]
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        widths = {k: max(len(k), *(len(r[k]) for r in rows)) if rows else len(k)
                  for k in ("name", "roles", "distribution", "version")}
        print("  ".join(k.upper().ljust(widths[k]) for k in widths) + "  STATUS")
        for r in rows:
            print("  ".join(r[k].ljust(widths[k]) for k in widths) + "  " + r["status"])
    return 1 if any(i.cls is None for i in reg.infos) and args.strict else 0


def _running_detectors(url: str, output: str) -> int:
    """`kcover detectors --url`: a running process's detectors (its /detectors); 1 when one failed or the process
    says it is degraded (an agent that cannot see its GPUs), 3 unreachable."""
    import urllib.request  # imported by the command that runs it (roles stay lean)

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/detectors", timeout=10) as answer:
            doc = json.loads(answer.read())
            states: dict[str, dict[str, Any]] = doc["detectors"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read {url}/detectors: {exc}", file=sys.stderr)
        return 3
    degraded = {str(k): str(v) for k, v in (doc.get("degraded") or {}).items()}
    if output == "json":
        print(json.dumps(states, indent=2))
    else:
        rows = [(name, str(s.get("state", "")), "yes" if s.get("required") else "no",
                 "yes" if s.get("isolated") else "no", str(s.get("restarts", 0)), str(s.get("detail", "")))
                for name, s in sorted(states.items())]
        heads = ("NAME", "STATE", "REQUIRED", "ISOLATED", "RESTARTS", "DETAIL")
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
        for row in (heads, *rows):
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for name, text in sorted(degraded.items()):
            print(f"DEGRADED ({name}): {text}")
    return 1 if degraded or any(s.get("state") == "failed" for s in states.values()) else 0


ONE_SHOT_TIMEOUT_SECONDS = 3.0
"""Default `--timeout` of the commands that read or write the cluster once (`status`, `breaker reset`): how long
they wait for the API server to answer at all (connecting and retrying included), so a dead or unreachable
server is reported within seconds: a live API server answers `GET /version` in milliseconds, and one that is
restarting is not back within a few seconds of retries anyway (run the command again). Their reads after
that have `kube.request_timeout_seconds` each, as the roles' do: listing the Nodes of a large cluster may take
longer than a server takes to answer."""

T = TypeVar("T")


def one_shot(cfg: settings.Settings, timeout: float, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(kube)` against the cluster `cfg.kube` names, once the API server answered `GET /version`
    within `timeout` seconds. Raises `errors.KubeError` naming the server that did not answer."""
    from kcover.kube import client as client_  # imported by the command that runs it (roles stay lean)
    from kcover.kube import retrying

    async def run() -> T:
        kube = await client_.connect(cfg.kube.kubeconfig, request_timeout=cfg.kube.request_timeout_seconds,
                                     retry=retrying.policy_from(cfg.kube))
        try:
            try:
                async with asyncio.timeout(timeout):
                    await kube.request("GET", "/version", timeout=timeout, deadline=timeout)
            except TimeoutError as exc:
                raise errors.KubeError(f"the API server {kube.host} did not answer within {timeout:g}s "
                                       f"(--timeout)") from exc
            except errors.KubeError as exc:
                if isinstance(exc.__cause__, TimeoutError):  # connected, and no answer came in time
                    raise errors.KubeError(f"the API server {kube.host} did not answer within {timeout:g}s "
                                           f"(--timeout)") from exc
                if exc.status:
                    raise errors.KubeError(f"the API server {kube.host} refused: {exc}", status=exc.status,
                                           reason=exc.reason) from exc
                raise errors.KubeError(f"cannot reach the API server {kube.host} within {timeout:g}s "
                                       f"(--timeout): {exc}") from exc
            return await work(kube)
        finally:
            await kube.close()

    return asyncio.run(run())


async def _deployed(kube: Any, args: argparse.Namespace, local: settings.Settings) -> tuple[settings.Settings, Any]:
    """The controllers' settings (`status.deployed`), from the ConfigMap `--namespace`/`--config-map` name."""
    from kcover.status import deployed  # imported by the command that runs it (roles stay lean)

    return await deployed.read(kube, namespace=args.namespace or deployed.RELEASE_NAMESPACE,
                               config_map=args.config_map or deployed.CONFIG_MAP,
                               overrides=_set_values(args), fallback=local)


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    """`kcover breaker reset`: ask the leader to close the latched breaker; on a closed one, change nothing.
    It reads the breaker where the controllers keep it, with their settings (the chart's config ConfigMap)."""
    from kcover.kube import gateway  # imported by the command that runs it (roles stay lean)
    from kcover.recovery import controls, ledger

    local = load_settings(args.config, _cli_overrides(args), required=args.config_given).settings
    used: dict[str, settings.RecoverySettings] = {}

    async def reset(kube: Any) -> str:
        cfg, source = await _deployed(kube, args, local)
        if not source.found:  # the names that matter are the release namespace's, whatever the file says
            print(f"kcover breaker reset: the controllers' settings were not read ({source.problem}): using this "
                  "command's", file=sys.stderr)
        rs = used["rs"] = cfg.recovery
        gw = gateway.Http(kube)
        book = ledger.Ledger(gw, namespace=rs.ledger_namespace, name=rs.ledger_name,
                             retention_seconds=lambda: rs.restart_window_seconds)
        await book.load()
        breaker = book.breaker()
        if not breaker.latched:
            return "closed"
        await controls.request_reset(gw, namespace=rs.ledger_namespace, name=rs.controls_name,
                                     now=clock_.utcnow())
        for _ in range(int(max(1.0, args.wait) / 0.5)):
            await asyncio.sleep(0.5)
            await book.load()
            if not book.breaker().latched:
                return "reset"
        return "requested"

    try:
        outcome = one_shot(local, args.timeout, reset)
    except errors.KcoverError as exc:
        print(f"kcover breaker reset: {exc}", file=sys.stderr)
        return 1
    rs = used["rs"]
    where = f"ConfigMap {rs.ledger_namespace}/{rs.controls_name}"
    if outcome == "closed":
        print("the breaker is not latched: nothing to reset, nothing was changed")
    elif outcome == "reset":
        print(f"breaker reset by the leader; kcover acts again after {rs.breaker_cooldown_seconds:g}s "
              "(recovery.breaker_cooldown_seconds), and plans the restarts it held meanwhile")
    else:
        print(f"reset requested on {where} ({controls.BREAKER_RESET}); the leader had not acted on it within "
              f"{args.wait:g}s: is a controller leading? `kcover status` shows the breaker")
        return 1
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """`kcover status`: leader, breaker, limits, pauses, held restarts, suspects, cordons, recent recoveries,
    budgets, judged with the controllers' settings; exit 1 when a person is needed."""
    from kcover.status import gathering, report  # imported by the command that runs it (roles stay lean)

    local = load_settings(args.config, _cli_overrides(args), required=args.config_given).settings

    async def read(kube: Any) -> report.Report:
        cfg, source = await _deployed(kube, args, local)
        return await gathering.gather(kube, cfg, now=clock_.utcnow(), source=source)

    try:
        found = one_shot(local, args.timeout, read)
    except errors.KcoverError as exc:
        print(f"kcover status: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(found.to_json(), indent=2) if args.output == "json" else report.render(found))
    return 1 if found.problems() else 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate a file as the roles would: settings, rules, detector configs, XID policy; list every problem."""
    problems: list[str] = []
    try:
        data = read_config_file(args.file, required=True)
    except errors.ConfigError as exc:
        data = None
        problems = [str(exc).splitlines()[0], *exc.errors]
    warned: list[str] = []
    if data is not None:
        problems = check_file_data(data, args.file, registry.discover())
        rules = (data.get("recovery") or {}).get("rules") if isinstance(data.get("recovery"), Mapping) else None
        warned = checking.rule_warnings(rules) if isinstance(rules, list) else []
    for line in warned:
        print(f"{args.file}: warning: {line}", file=sys.stderr)
    if problems:
        print(f"{args.file}: invalid", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid" + (f" ({len(warned)} warning{'s' if len(warned) > 1 else ''})" if warned else ""))
    return 0


def check_file_data(data: Mapping[str, Any], file_name: str, detectors: registry.Registry) -> list[str]:
    """Every problem of a settings file's content. When the schema refuses it, the rules, detector configs
    and XID policy are still checked from what the file holds, so one run lists everything."""
    try:
        cfg = settings.layer(file_data=data, file_name=file_name).settings
    except errors.ConfigError as exc:
        found = list(exc.errors) or [str(exc)]
    else:
        return checking.problems(cfg, detectors)
    recovery = data.get("recovery") if isinstance(data.get("recovery"), Mapping) else {}
    rules = recovery.get("rules") if isinstance(recovery, Mapping) else None
    if isinstance(rules, list):
        found += checking.rule_problems(rules, detectors)
    entries: dict[str, settings.DetectorEntry] | None = None
    try:
        entries = settings.DetectorsSettings.model_validate(data.get("detectors") or {}).entries
    except ValidationError:
        pass  # already reported above, field by field
    else:
        found += detectors.check_entries(entries)
    try:
        agent_settings = settings.AgentSettings.model_validate(data.get("agent") or {})
    except ValidationError:
        agent_settings = None
    if entries is not None and agent_settings is not None:
        found += checking.event_retry_problems(agent_settings.event_retry_seconds, entries, detectors)
    agent = data.get("agent")
    if isinstance(agent, Mapping) and isinstance(agent.get("xid_policy_file"), str):
        found += checking.xid_policy_problems(agent["xid_policy_file"])
    return found


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and not path.endswith(".config") and path != "detectors.entries":
            out.update(_flatten(value, path + "."))
        elif path == "detectors.entries" and isinstance(value, Mapping):
            for name, entry in value.items():
                for k, v in entry.items():
                    out[f"{path}.{name}.{k}"] = v
        else:
            out[path] = value
    return out


def cmd_config_show(args: argparse.Namespace) -> int:
    try:
        layered = load_settings(args.config, _cli_overrides(args), required=args.config_given)
    except errors.ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    flat = _flatten(layered.settings.model_dump(mode="json"))
    restart = settings.restart_required_paths()
    rows = []
    for path, value in flat.items():
        source = next((s for p, s in layered.provenance.items() if path == p or path.startswith(p + ".")),
                      "default")
        rows.append({"setting": path, "value": value, "source": source, "restart_required": path in restart})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["setting"]) for r in rows)
        for r in rows:
            mark = "  [restart required]" if r["restart_required"] else ""
            print(f"{r['setting'].ljust(width)}  {json.dumps(r['value'])}  ({r['source']}){mark}")
        print("\n[restart required]: a change applies when the process restarts; every other setting applies "
              "live when the file changes")
    return 0


# ---------------------------------------------------------------------------------------------- long-running roles

EXIT_MARGIN_SECONDS = 5.0
"""Seconds past `server.shutdown_grace_seconds` after which the process exits whatever is left running."""
FORCED_RELEASE_SECONDS = 2.0
"""Seconds a forced exit gives the controller to release its Lease (inside `EXIT_MARGIN_SECONDS`), so a
successor takes over at once instead of after the Lease's duration."""


def _force_exit(hooks: wiring.RoleHooks, why: str, **fields: Any) -> None:
    """End the process now, whatever is still running: first, bounded, what the role asked a forced exit to
    do (the controller's Lease released over connections of its own, its loop may be blocked). Call it from a
    thread other than the loop's."""
    log.error("shutdown_forced", why=why, **fields)
    if hooks.abandon is not None:
        hooks.abandon(FORCED_RELEASE_SECONDS)
    logging.shutdown()
    os._exit(0)


def _exit_guard(seconds: float, hooks: wiring.RoleHooks) -> None:
    """A daemon thread that ends the process after `seconds` (and `FORCED_RELEASE_SECONDS` to release the
    Lease): shutdown stays bounded even when something never returns (a detector that ignores its
    cancellation, a thread stuck in a blocking call that asyncio.run would wait for at exit)."""
    def guard() -> None:
        time.sleep(seconds)
        _force_exit(hooks, "shutdown_deadline", after_seconds=seconds)

    threading.Thread(target=guard, name="kcover-exit-guard", daemon=True).start()


async def _bound_shutdown(stop: asyncio.Event, role_task: asyncio.Task[None], grace: Callable[[], float],
                          hooks: wiring.RoleHooks) -> None:
    """After `stop`, give the role `grace()` seconds to finish (releasing the Lease), then cancel it."""
    await stop.wait()
    seconds = grace()
    _exit_guard(seconds + EXIT_MARGIN_SECONDS - FORCED_RELEASE_SECONDS, hooks)
    done, _ = await asyncio.wait({role_task}, timeout=seconds)
    if not done:
        log.warning("shutdown_grace_exceeded", grace_seconds=seconds)
        role_task.cancel()


async def serve(layered: settings.Layered, args: argparse.Namespace, role: wiring.RoleMain, *,
                detectors: registry.Registry | None = None) -> int:
    """Run a role with the health server, hot reload and signal handling until SIGTERM/SIGINT.

    Shutdown is bounded: the role gets `server.shutdown_grace_seconds` to stop (detectors, bus, Lease
    release), is cancelled after that, and the process exits `EXIT_MARGIN_SECONDS` later at the latest.
    `detectors` is the registry the settings were checked against (discovered here when None): the role and
    every reload use that one."""
    config = layered.settings
    detectors = registry.discover() if detectors is None else detectors
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    hooks = wiring.RoleHooks(environ=dict(os.environ), detectors=detectors,
                             fake_nvml_file=getattr(args, "fake_nvml", None) or "")

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():  # a second signal: a person (or a supervisor) will not wait
            threading.Thread(target=_force_exit, args=(hooks, "second_signal"), kwargs={"signal": sig.name},
                             name="kcover-forced-exit", daemon=True).start()
            return
        log.info("shutdown_requested", signal=sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    metrics_ = metrics.Metrics(role=args.command)  # each role exports only its own series
    health = serving.Health(stall_seconds=config.server.loop_stall_seconds)
    server = serving.Server(health, metrics_, host=config.server.host, port=config.server.port)
    await server.start()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(health.heartbeat(stop), name="heartbeat")

            async def apply(new: settings.Settings, changed: set[str]) -> None:
                if any(p.startswith("logging.") for p in changed):
                    logs.configure(new.logging)
                health.stall_seconds = new.server.loop_stall_seconds
                if hooks.reconfigure is not None:
                    await hooks.reconfigure(new, changed)

            role_ = contract.Role(args.command)
            reloader = reloading.Reloader(
                args.config, checked_loader(args.config, _cli_overrides(args), role=role_, detectors=detectors),
                apply, config, metrics_, interval_seconds=config.server.config_poll_seconds,
                watch=lambda cfg: checking.watched_files(cfg, role=role_))
            group.create_task(reloader.run(stop), name="config-reloader")

            role_task = group.create_task(role(config, metrics_, health, stop, hooks), name=f"{args.command}-main")
            group.create_task(_bound_shutdown(stop, role_task, lambda: reloader.current.server.shutdown_grace_seconds,
                                              hooks), name="shutdown-bound")
    finally:
        await server.stop()
    return 0


def _run_role(args: argparse.Namespace, role: wiring.RoleMain) -> int:
    detectors = registry.discover()  # once: the check, the role and every reload use this one
    try:
        layered = load_settings(args.config, _cli_overrides(args), required=args.config_given)
        checking.validate(layered.settings, detectors, role=contract.Role(args.command))
    except errors.ConfigError as exc:
        print(f"kcover: {exc}", file=sys.stderr)
        return 1
    logs.configure(layered.settings.logging)
    log.info("kcover_starting", command=args.command, version=kcover.__version__, config=args.config)
    for line in checking.warnings(layered.settings):
        log.warning("config_warning", warning=line)
    return asyncio.run(serve(layered, args, role, detectors=detectors))


# ---------------------------------------------------------------------------------------------- parser

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
    p.add_argument("--timeout", type=float, default=ONE_SHOT_TIMEOUT_SECONDS, metavar="SECONDS",
                   help="give up when the API server has not answered within this many seconds, connecting and "
                        f"retrying included (default {ONE_SHOT_TIMEOUT_SECONDS:g})")


TOOLS = {"sim": "kcover.sim.running", "bench": "kcover.bench.running"}
"""Commands whose module (and its arguments) is imported only when that command runs: the simulated
cluster and the bench are never loaded by `kcover controller` or `kcover agent`."""


def _tool(command: str) -> Any:
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
        _tool("sim").add_arguments(p)
    p = sub.add_parser("bench", help="measure latency, scale, throughput and API cost against the targets")
    if command in (None, "bench"):
        _tool("bench").add_arguments(p)

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


PIPE_CLOSED_EXIT = 128 + signal.SIGPIPE
"""Exit code when the reader of stdout went away (`kcover status | head`): the code of a process that SIGPIPE
ended, as `git log | head` reports, without a traceback."""


def _pipe_closed(exc: BaseException) -> bool:
    """The reader of stdout went away: a BrokenPipeError, alone or as everything a task group raised."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_pipe_closed(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


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


def _sim_inject(rest: list[str]) -> int:
    """`kcover sim inject KIND ...`: a fault into a cluster `kcover sim --serve` is serving."""
    code: int = importlib.import_module("kcover.sim.control").main(sim_inject_parser().parse_args(rest))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; quiet when stdout is a pipe its reader closed (see `PIPE_CLOSED_EXIT`)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the guard: what is still buffered meets a closed pipe here, not at exit
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if not _pipe_closed(exc):
            raise
        # stdout cannot be flushed any more: point it at /dev/null so the interpreter's exit flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED_EXIT
    return code


def _main(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] == ["sim", "inject"]:
        logs.configure(settings.LoggingSettings(level="warning"))
        return _sim_inject(given[2:])
    parser = build_parser(wiring.ROLES, command=given[0] if given and given[0] in TOOLS else "")
    args = parser.parse_args(given)
    # Until a role has read its settings, log warnings and errors to stderr only.
    logs.configure(settings.LoggingSettings(level="warning"))
    args.config_given = "--config" in (argv if argv is not None else sys.argv)
    if args.command in TOOLS:
        code: int = _tool(args.command).main(args)
        return code
    if args.command == "version":
        return cmd_version(args)
    if args.command == "detectors":
        return cmd_detectors(args)
    if args.command == "config":
        return cmd_config_check(args) if args.config_command == "check" else cmd_config_show(args)
    if args.command in ("breaker", "status"):
        # one-shot: what went wrong is the command's own message; the client's retry log lines only repeat it
        logs.configure(settings.LoggingSettings(level=args.log_level or "error"))
        return cmd_breaker_reset(args) if args.command == "breaker" else cmd_status(args)
    _, role, _ = wiring.ROLES[args.command]
    return _run_role(args, role)


if __name__ == "__main__":
    sys.exit(main())
