"""The chart lints and renders for representative values, and what it renders keeps kcover's invariants.

Invariants checked against kcover's own code, not restated constants: the config mount matches
`settings.DEFAULT_CONFIG_PATH`, the probes hit `server.port`'s default, the logs mount is
`recovery.save_logs.directory`, the rendered config.yaml and XID policy validate with kcover's models.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, KUBE_VERSION, NAMESPACE, SCENARIOS, Render, find, run_helm

from kcover import checking, layering, settings
from kcover.detectors import contract, registry
from kcover.nvml import xid_policy

CONFIG_DIR = os.path.dirname(settings.DEFAULT_CONFIG_PATH)
CONFIG_KEY = os.path.basename(settings.DEFAULT_CONFIG_PATH)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def resolved_env(c: dict[str, Any], *, pod: str, namespace: str, node: str) -> dict[str, str]:
    """The KCOVER_ environment the kubelet would give the container (downward API resolved)."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace, "spec.nodeName": node}
    out = {}
    for e in c.get("env", []):
        if not e["name"].startswith(settings.ENV_PREFIX):
            continue
        out[e["name"]] = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


def rendered_config(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = find(objs, "ConfigMap", "-config")
    return yaml.safe_load(cm["data"][CONFIG_KEY]) or {}, yaml.safe_load(cm["data"]["xid-policy.yaml"]) or {}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_passes(helm_bin: str, scenario: str) -> None:
    proc = run_helm(helm_bin, "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                    "--kube-version", KUBE_VERSION, values=SCENARIOS[scenario])
    assert "0 chart(s) failed" in proc.stdout


def test_values_schema_refuses_bad_values(helm_bin: str) -> None:
    for bad in ({"metrics": {"port": "http"}}, {"controller": {"replica": 2}}, {"dryRun": "yes"},
                {"image": {"controller": {"repository": "x", "digest": "latest"}}},
                {"xidPolicy": {"xids": {"seventy-nine": {}}}}):
        proc = run_helm(helm_bin, "template", "kcover", str(CHART), "--kube-version", KUBE_VERSION, values=bad,
                        check=False)
        assert proc.returncode != 0, f"accepted {bad}"
        assert "values don't meet the specifications of the schema" in proc.stderr


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_config_and_environment_validate_with_kcover_settings(render: Render, scenario: str, tmp_path: Path) -> None:
    objs = render(SCENARIOS[scenario])
    config, policy = rendered_config(objs)
    reg = registry.discover()
    mounted = tmp_path / "xid-policy.yaml"  # the ConfigMap's file, where the pod mounts it
    mounted.write_text(find(objs, "ConfigMap", "-config")["data"]["xid-policy.yaml"])
    for kind, suffix, role in (("Deployment", "-controller", "controller"), ("DaemonSet", "-agent", "agent")):
        c = container(find(objs, kind, suffix))
        env = resolved_env(c, pod=f"kcover-{role}-abc", namespace=NAMESPACE, node="gpu-1")
        if "KCOVER_AGENT__XID_POLICY_FILE" in env:
            assert env["KCOVER_AGENT__XID_POLICY_FILE"] == f"{CONFIG_DIR}/xid-policy.yaml"
            env["KCOVER_AGENT__XID_POLICY_FILE"] = str(mounted)
        layered = layering.layer(file_data=config, file_name=settings.DEFAULT_CONFIG_PATH, environ=env)
        s = layered.settings
        assert s.server.port == int(c["ports"][0]["containerPort"])
        # what the role itself checks before it starts, with the plugins of plugins/ installed (as in the images)
        assert checking.problems(s, reg, role=contract.Role(role)) == []
        if role == "controller":
            assert s.lease.namespace == NAMESPACE
            assert s.recovery.ledger_namespace == NAMESPACE
            assert s.lease.identity == "kcover-controller-abc"
        else:
            assert s.agent.node_name == "gpu-1"
    xid_policy.XidPolicy.from_mapping(policy, base=xid_policy.load())


def test_default_config_is_empty_so_shipped_defaults_apply(render: Render) -> None:
    config, policy = rendered_config(render({}))
    assert config == {}
    assert policy == {}


def test_values_reach_the_config(render: Render) -> None:
    config, _ = rendered_config(render(SCENARIOS["dry-run"]))
    assert config == {"recovery": {"dry_run": True}}
    config, policy = rendered_config(render(SCENARIOS["plugins"]))
    entries = config["detectors"]["entries"]
    assert entries["logscan"] == {"enabled": True, "config": {"tail_lines": 200}}
    assert entries["dcgm"]["config"] == {"exporter_interval_seconds": 30,
                                         "exporter_url": "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"}
    assert entries["nvml"] == {"config": {"health_interval_seconds": 5}}  # from .Values.config, kept
    assert config["recovery"] == {"workload_cooldown_seconds": 120}
    assert policy["xids"]["79"]["action"] == "cordon-node"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_controller_deployment(render: Render, scenario: str) -> None:
    objs = render(SCENARIOS[scenario])
    dep = find(objs, "Deployment", "-controller")
    spec, c = pod_spec(dep), container(dep)
    assert dep["spec"]["replicas"] == SCENARIOS[scenario].get("controller", {}).get("replicas", 2)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["runAsUser"] == 65532
    port = settings.ServerSettings().port
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["args"][0] == f"--config={settings.DEFAULT_CONFIG_PATH}"
    env = env_of(c)
    assert env["KCOVER_LEASE__IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KCOVER_LEASE__NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    config_mount = mounts[CONFIG_DIR]
    assert "subPath" not in config_mount  # a subPath mount never sees ConfigMap updates
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[config_mount["name"]]["configMap"]["name"] == find(objs, "ConfigMap", "-config")["metadata"]["name"]
    logs = volumes[mounts[settings.SaveLogsSettings().directory]["name"]]
    if scenario == "pvc":
        claim = find(objs, "PersistentVolumeClaim")
        assert logs["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    else:
        assert "emptyDir" in logs
        assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert "/tmp" in mounts  # the root file system is read-only
    if scenario == "node-selector":
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_pod_disruption_budget_keeps_one_controller(render: Render) -> None:
    objs = render({})
    pdb = find(objs, "PodDisruptionBudget")
    dep = find(objs, "Deployment", "-controller")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_agent_daemonset(render: Render, scenario: str) -> None:
    objs = render(SCENARIOS[scenario])
    ds = find(objs, "DaemonSet", "-agent")
    spec, c = pod_spec(ds), container(ds)
    # every taint, kcover's own included, so the agent keeps reporting on a node kcover cordoned
    assert {"operator": "Exists"} in spec["tolerations"]
    if scenario == "node-selector":
        assert spec["nodeSelector"] == {"gpu.example.com/class": "h100"}
        assert spec["affinity"]["nodeAffinity"]
        assert "runtimeClassName" not in spec
    elif scenario == "names-and-extras":
        assert spec["nodeSelector"] == {"gpu": "true", "nvidia.com/gpu.present": "true"}
    else:
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["runtimeClassName"] == "nvidia"
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(forbidden)
    sc = c["securityContext"]
    assert not sc.get("privileged")
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    env = env_of(c)
    assert env["KCOVER_AGENT__NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    socket_dir = os.path.dirname(settings.AgentSettings().pod_resources_socket)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    preflight = {"/var/lib/kcover/preflight"} if scenario == "preflight" else set()
    extra = {v["hostPath"]["path"] for v in SCENARIOS[scenario].get("agent", {}).get("extraVolumes", [])
             if "hostPath" in v}
    # nothing else of the host (preflight: its reports, read-only; what extraVolumes asks for)
    assert host_paths == {socket_dir, *preflight, *extra}
    assert all(mounts[path]["readOnly"] is True for path in preflight)
    assert mounts[socket_dir]["readOnly"] is True
    assert "subPath" not in mounts[CONFIG_DIR]
    assert volumes[mounts[CONFIG_DIR]["name"]]["configMap"]
    assert env["KCOVER_AGENT__XID_POLICY_FILE"] == f"{CONFIG_DIR}/xid-policy.yaml"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rbac_grants_no_secrets_and_no_wildcards(render: Render, scenario: str) -> None:
    rules = [r for o in render(SCENARIOS[scenario]) if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]
    assert rules
    for rule in rules:
        assert "secrets" not in rule["resources"]
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, [])
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_separate_service_accounts(render: Render) -> None:
    objs = render({})
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    dep_sa = pod_spec(find(objs, "Deployment", "-controller"))["serviceAccountName"]
    ds_sa = pod_spec(find(objs, "DaemonSet", "-agent"))["serviceAccountName"]
    assert dep_sa != ds_sa
    assert {dep_sa, ds_sa} <= accounts


def test_service_monitor_only_when_enabled(render: Render) -> None:
    assert not [o for o in render({}) if o["kind"] == "ServiceMonitor"]
    objs = render(SCENARIOS["service-monitor"])
    sm = find(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    services = [o for o in objs if o["kind"] == "Service"]
    assert len(services) == 2
    for svc in services:  # the monitor's selector picks both metrics Services
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert svc["spec"]["ports"][0]["name"] == "metrics"


def test_preflight_installs_the_plugins_crd_mounts_the_reports_and_grants_what_it_uses(render: Render) -> None:
    """`preflight.enabled`: the CRD is the plugin's own, the agent reads the reports' hostPath read-only,
    the agent may watch pods and create PreflightReports, the controller read them and write their
    status, and a recovery rule lets a slow node be cordoned."""
    assert not [o for o in render({}) if o["kind"] == "CustomResourceDefinition"
                and o["metadata"]["name"] == "preflightreports.kcover.io"]
    objs = render(SCENARIOS["preflight"])
    crd = find(objs, "CustomResourceDefinition", "preflightreports.kcover.io")
    plugin_crd = Path(__file__).parents[2] / "plugins/kcover-preflight/kcover_preflight/crd.yaml"
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}  # tests/chart/test_images.py
    assert crd == yaml.safe_load(plugin_crd.read_text())
    ds = find(objs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    volume = next(v for v in ds["volumes"] if v["name"] == "preflight-reports")
    assert volume["hostPath"] == {"path": "/var/lib/kcover/preflight", "type": "DirectoryOrCreate"}
    mount = next(m for c in ds["containers"] for m in c["volumeMounts"] if m["name"] == "preflight-reports")
    assert mount == {"name": "preflight-reports", "mountPath": "/var/lib/kcover/preflight", "readOnly": True}

    def rules(name: str) -> list[tuple[str, str, tuple[str, ...]]]:
        role = find(objs, "ClusterRole", name)
        return [(g, r, tuple(rule["verbs"])) for rule in role["rules"] for g in rule["apiGroups"]
                for r in rule["resources"]]
    assert ("", "pods", ("list", "watch")) in rules("-agent")
    assert ("kcover.io", "preflightreports", ("create",)) in rules("-agent")
    assert ("kcover.io", "preflightreports", ("get", "list", "watch")) in rules("-controller")
    assert ("kcover.io", "preflightreports/status", ("get", "patch", "update")) in rules("-controller")
    config, _ = rendered_config(objs)
    entries = config["detectors"]["entries"]
    assert entries["preflight"] == {"isolated": False, "config": {"collection_timeout_seconds": 900,
                                                                  "relative_fraction": 0.6}}
    assert entries["preflight-collector"] == {"isolated": False, "config": {"report_dir": "/var/lib/kcover/preflight"}}
    assert {"detector": "preflight", "target": "Node", "action": "cordon-node-and-restart"} in config["recovery"]["rules"]
    settings.Settings.model_validate(config)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_kubelet_waits_for_a_bounded_shutdown(render: Render, scenario: str) -> None:
    """SIGTERM: kcover stops within server.shutdown_grace_seconds and exits at the latest EXIT_MARGIN_SECONDS
    later; each pod's terminationGracePeriodSeconds must cover both, or the kubelet kills it before the Lease
    is released."""
    from kcover.cli import lifecycle

    objs = render(SCENARIOS[scenario])
    config, _ = rendered_config(objs)
    for kind, suffix, role in (("Deployment", "-controller", "controller"), ("DaemonSet", "-agent", "agent")):
        c = container(find(objs, kind, suffix))
        env = resolved_env(c, pod=f"kcover-{role}-abc", namespace=NAMESPACE, node="gpu-1")
        grace = layering.layer(file_data=config, file_name=settings.DEFAULT_CONFIG_PATH, environ=env).settings
        kubelet_waits = pod_spec(find(objs, kind, suffix)).get("terminationGracePeriodSeconds", 30)  # API default
        assert grace.server.shutdown_grace_seconds + lifecycle.EXIT_MARGIN_SECONDS <= kubelet_waits, (role, kubelet_waits)


def test_the_chart_refuses_a_grace_period_shorter_than_the_shutdown(helm_bin: str) -> None:
    for values in ({"controller": {"terminationGracePeriodSeconds": 20}},
                   {"controller": {"terminationGracePeriodSeconds": 30}, "config": {"server": {"shutdown_grace_seconds": 26}}}):
        proc = run_helm(helm_bin, "template", "k", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                        values=values, check=False)
        assert proc.returncode != 0
        assert "must be at least config.server.shutdown_grace_seconds" in proc.stderr
    proc = run_helm(helm_bin, "template", "k", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                    values={"controller": {"terminationGracePeriodSeconds": 13}, "config": {"server": {"shutdown_grace_seconds": 8}}})
    assert "terminationGracePeriodSeconds: 13" in proc.stdout
