"""The settings the deployed controllers run with, read from the cluster, for `kcover status` and `kcover breaker reset`.

Owns finding them: the chart's config ConfigMap (`<release>-config`, key `config.yaml`) in the release
namespace, layered as the chart hands it to the controllers: the release namespace for the Lease, the ledger
and the controls ConfigMap (the chart sets those by environment), then the command's `--set`. The names the
chart also sets by environment from its values (`controller.leaseName`, `ledgerName`, `controlsName`) are its
defaults, which are the settings' defaults, unless `--set` says otherwise. A ConfigMap that is missing, is not
YAML or does not validate (the controllers then keep an earlier one: `kcover_config_reload_failures_total`)
leaves the command's own settings in use, and `Source.problem` says why. Reads one ConfigMap; writes nothing;
a read that fails raises `errors.KubeError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kcover import errors, layering, settings
from kcover.kube import client as kube_client
from kcover.kube import gateway

RELEASE_NAMESPACE = "kcover-system"
"""`--namespace`'s default: the namespace docs/install.md installs the chart in."""
CONFIG_MAP = "kcover-config"
"""`--config-map`'s default: the chart's config ConfigMap for a release named `kcover` (`<release>-config`)."""
CONFIG_KEY = "config.yaml"


@dataclass
class Source:
    """Where the settings `kcover status` judged with came from."""

    config_map: str
    """`namespace/name` of the cluster's config ConfigMap."""
    found: bool = False
    """Its config.yaml was read and validated: the controllers' settings."""
    problem: str = ""
    """Why it was not used (missing, not YAML, invalid): the command's own settings were."""


async def read(kube: kube_client.KubeClient, *, namespace: str, config_map: str,
               overrides: Mapping[str, Any], fallback: settings.Settings) -> tuple[settings.Settings, Source]:
    """The settings the controllers run with (see the module docstring), or `fallback` in the release namespace
    (where the chart keeps the Lease, the ledger and the controls ConfigMap whatever the file says) and why."""
    source = Source(f"{namespace}/{config_map}")
    chart = {key: namespace for key in NAMESPACED if key not in overrides}
    problem, data = _config(await gateway.Http(kube).get_config_map(namespace, config_map), source.config_map)
    if not problem:
        try:
            return layering.layer(file_data=data, file_name=f"ConfigMap {source.config_map}",
                                  cli={**chart, **overrides}).settings, Source(source.config_map, found=True)
        except errors.ConfigError as exc:
            problem = f"ConfigMap {source.config_map} {CONFIG_KEY} does not validate: " + "; ".join(exc.errors[:3])
    source.problem = problem
    return fallback.model_copy(update={
        "lease": fallback.lease.model_copy(update={"namespace": chart.get("lease.namespace",
                                                                          fallback.lease.namespace)}),
        "recovery": fallback.recovery.model_copy(update={"ledger_namespace": chart.get(
            "recovery.ledger_namespace", fallback.recovery.ledger_namespace)})}), source


NAMESPACED = ("lease.namespace", "recovery.ledger_namespace")
"""Settings the chart sets to the release namespace (from the pod's namespace, by environment)."""


def _config(raw: gateway.DataBody | None, where: str) -> tuple[str, dict[str, Any]]:
    """(why it cannot be used or "", its config.yaml as a mapping) of the config ConfigMap."""
    if raw is None:
        return f"ConfigMap {where} not found", {}
    text = (raw.get("data") or {}).get(CONFIG_KEY)
    try:
        data = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError as exc:
        return f"ConfigMap {where} {CONFIG_KEY} is not YAML: {str(exc).splitlines()[0]}", {}
    if data is not None and not isinstance(data, dict):
        return f"ConfigMap {where} {CONFIG_KEY}: the top level is not a mapping", {}
    return "", data or {}
