"""`kcover status` and `kcover breaker reset`: the commands that read or write a deployed kcover once.

Owns connecting to the cluster once (`one_shot`: the API server must answer within `--timeout`), reading
the controllers' own settings (the chart's config ConfigMap), and the two commands. Does not own what the
status says (`kcover.status`) nor the breaker itself (the leader resets it, `kcover.recovery.controls`).

How it fails: an API server that does not answer, refuses or cannot be reached is reported in one line
naming it; `status` exits 3 then, `breaker reset` 1 (and 1 when the leader did not act within `--wait`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kcover import errors, settings
from kcover.aio import clock as clock_
from kcover.cli import configuring

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
                               overrides=configuring.set_values(args), fallback=local)


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    """`kcover breaker reset`: ask the leader to close the latched breaker; on a closed one, change nothing.
    It reads the breaker where the controllers keep it, with their settings (the chart's config ConfigMap)."""
    from kcover.kube import gateway  # imported by the command that runs it (roles stay lean)
    from kcover.recovery import controls, ledger

    local = configuring.load_settings(args.config, configuring.cli_overrides(args),
                                      required=args.config_given).settings
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

    local = configuring.load_settings(args.config, configuring.cli_overrides(args),
                                      required=args.config_given).settings

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
