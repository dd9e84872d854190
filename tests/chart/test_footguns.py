"""What an operator would naturally do with the chart either works or is refused with a message naming
the fix: the saved-logs volume and the retention kept within it, name overrides, common and pod labels
and annotations, extra volumes, the agent's priority class, values given with `--set`, and preflight."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, KUBE_VERSION, NAMESPACE, SCENARIOS, Render, find, run_helm
from test_render import container, pod_spec, rendered_config, resolved_env

from kcover import layering, settings

GIB = 1024**3


def helm_set(helm_bin: str, *sets: str, check: bool = True) -> tuple[int, list[dict[str, Any]], str]:
    """`helm template` with `--set` flags exactly as an operator types them (helm parses their types)."""
    args = [a for s in sets for a in ("--set", s)]
    proc = run_helm(helm_bin, "template", "kcover", str(CHART), "--namespace", NAMESPACE, "--kube-version",
                    KUBE_VERSION, *args, check=check)
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else []
    return proc.returncode, objs, proc.stderr


def effective_retention(objs: list[dict[str, Any]]) -> int:
    """`recovery.save_logs.retention_bytes` as the controller pod would read it (file and environment)."""
    config, _ = rendered_config(objs)
    env = resolved_env(container(find(objs, "Deployment", "-controller")), pod="c-0", namespace=NAMESPACE, node="")
    return layering.layer(file_data=config, file_name=settings.DEFAULT_CONFIG_PATH,
                          environ=env).settings.recovery.save_logs.retention_bytes


def logs_volume_bytes(objs: list[dict[str, Any]]) -> int:
    spec = pod_spec(find(objs, "Deployment", "-controller"))
    logs = next(v for v in spec["volumes"] if v["name"] == "logs")
    if "emptyDir" in logs:
        size = logs["emptyDir"]["sizeLimit"]
    else:
        size = find(objs, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"]
    number, unit = size[:-2], size[-2:]
    return int(float(number) * {"Ki": 1024, "Mi": 1024**2, "Gi": GIB, "Ti": 1024**4}[unit])


# ---------------------------------------------------------------------------------------------- logs volume

@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_retention_fits_the_logs_volume(render: Render, scenario: str) -> None:
    """The controller never keeps more saved logs than its volume holds (the emptyDir's sizeLimit evicts the
    pod past it; a full PVC fails writes mid-recovery)."""
    objs = render(SCENARIOS[scenario])
    assert effective_retention(objs) <= logs_volume_bytes(objs)


def test_the_retention_defaults_to_most_of_the_volume(render: Render) -> None:
    assert effective_retention(render({})) == int(GIB * 0.8)  # the 1 GiB emptyDir, not kcover's own 5 GiB
    assert effective_retention(render(SCENARIOS["pvc"])) == int(20 * GIB * 0.8)
    assert effective_retention(render(SCENARIOS["logs-retention"])) == 1_500_000_000  # given, and it fits
    assert settings.SaveLogsSettings().retention_bytes > GIB  # what the chart used to leave in force


@pytest.mark.parametrize(("sets", "message"), [
    (("config.recovery.save_logs.retention_bytes=5368709120",),
     "config.recovery.save_logs.retention_bytes (5368709120) is larger than the saved-logs volume "
     "(controller.logs.emptyDirSizeLimit: 1Gi, 1073741824 bytes)"),
    (("controller.logs.persistence.enabled=true", "controller.logs.persistence.size=2Gi",
      "config.recovery.save_logs.retention_bytes=3000000000"),
     "larger than the saved-logs volume (controller.logs.persistence.size: 2Gi"),
    (("config.recovery.save_logs.retention_bytes=10Gi",),
     "config.recovery.save_logs.retention_bytes must be a number of bytes, not \"10Gi\""),
    (("controller.logs.emptyDirSizeLimit=2GB",), "controller/logs/emptyDirSizeLimit"),
])
def test_a_retention_the_volume_cannot_hold_is_refused(helm_bin: str, sets: tuple[str, ...], message: str) -> None:
    code, _, stderr = helm_set(helm_bin, *sets, check=False)
    assert code != 0
    assert message in stderr


def test_logs_not_saved_need_no_retention(helm_bin: str) -> None:
    code, objs, _ = helm_set(helm_bin, "config.recovery.save_logs.enabled=false",
                             "config.recovery.save_logs.retention_bytes=99999999999")
    assert code == 0
    env = {e["name"] for e in container(find(objs, "Deployment", "-controller"))["env"]}
    assert "KCOVER_RECOVERY__SAVE_LOGS__RETENTION_BYTES" not in env


# ---------------------------------------------------------------------------------------------- names, labels

def test_name_overrides_name_every_object_and_keep_the_event_watchers_trust(render: Render) -> None:
    objs = render(SCENARIOS["names-and-extras"])
    named = [o for o in objs if o["kind"] != "CustomResourceDefinition"]
    assert named
    for obj in named:
        assert obj["metadata"]["name"].startswith("fleet-kcover"), obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-guard"
    agent_pods = find(objs, "DaemonSet", "-agent")["spec"]["template"]["metadata"]["labels"]
    config, _ = rendered_config(objs)
    trusted = config["detectors"]["entries"]["event-watcher"]["config"]["agent_pod_labels"]
    assert trusted.items() <= agent_pods.items()  # a Node Event beside such a pod is the agent's
    only_name = render({"nameOverride": "gpu-guard"})
    assert find(only_name, "Deployment", "-controller")["metadata"]["name"] == "kcover-gpu-guard-controller"
    assert rendered_config(render({}))[0] == {}  # no override: the event watcher's own default stands


def test_the_agent_alert_follows_the_agent_service_name(render: Render) -> None:
    import re

    objs = render({**SCENARIOS["names-and-extras"], "monitoring": {"prometheusRule": {"enabled": True}}})
    service = find(objs, "Service", "-agent-metrics")["metadata"]["name"]
    rule = next(r for g in find(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]
                if r["alert"] == "KcoverAgentSilent")
    regex = re.search(r'job=~"([^"]+)"', rule["expr"]).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(regex, service)  # prometheus-operator names the job after the Service
    assert not re.fullmatch(regex, find(objs, "Service", "-controller-metrics")["metadata"]["name"])


def test_common_labels_are_on_every_object_and_pod(render: Render) -> None:
    objs = render(SCENARIOS["names-and-extras"])
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition":
            assert obj["metadata"]["labels"]["team"] == "ml-infra", obj["kind"]
    for kind in ("Deployment", "DaemonSet"):
        assert find(objs, kind)["spec"]["template"]["metadata"]["labels"]["team"] == "ml-infra"


def test_pod_labels_and_annotations_reach_the_pods_as_strings(render: Render) -> None:
    objs = render(SCENARIOS["names-and-extras"])
    template = find(objs, "Deployment", "-controller")["spec"]["template"]["metadata"]
    assert template["labels"]["tier"] == "control"
    assert template["annotations"] == {"prometheus.io/scrape": "true"}


@pytest.mark.parametrize("key", ["commonLabels.app\\.kubernetes\\.io/name", "controller.podLabels.app\\.kubernetes\\.io/component",
                                 "agent.podLabels.app\\.kubernetes\\.io/instance"])
def test_labels_the_selectors_use_cannot_be_overridden(helm_bin: str, key: str) -> None:
    code, _, stderr = helm_set(helm_bin, f"{key}=mine", check=False)
    assert code != 0
    assert "the chart sets the app.kubernetes.io/* " in stderr
    assert "use another key" in stderr


# ---------------------------------------------------------------------------------------------- volumes, priority

def test_extra_volumes_and_mounts(render: Render) -> None:
    objs = render(SCENARIOS["names-and-extras"])
    for kind, name, path in (("Deployment", "ca", "/etc/ssl/corp"), ("DaemonSet", "dcgm", "/usr/local/bin/dcgmi")):
        workload = find(objs, kind)
        assert name in {v["name"] for v in pod_spec(workload)["volumes"]}
        assert {"name": name, "mountPath": path, "readOnly": True} in container(workload)["volumeMounts"]


@pytest.mark.parametrize(("role", "name"), [("controller", "logs"), ("controller", "config"), ("agent", "pod-resources")])
def test_an_extra_volume_named_like_the_charts_is_refused(helm_bin: str, role: str, name: str) -> None:
    code, _, stderr = helm_set(helm_bin, f"{role}.extraVolumes[0].name={name}",
                               f"{role}.extraVolumes[0].emptyDir.medium=Memory", check=False)
    assert code != 0
    assert f'{role}.extraVolumes: "{name}" is a volume of the chart' in stderr


def test_the_agent_is_node_critical_unless_told_otherwise(render: Render) -> None:
    assert pod_spec(find(render({}), "DaemonSet"))["priorityClassName"] == "system-node-critical"
    assert pod_spec(find(render(SCENARIOS["names-and-extras"]), "DaemonSet"))["priorityClassName"] == "gpu-agents"
    assert "priorityClassName" not in pod_spec(find(render({"agent": {"priorityClassName": ""}}), "DaemonSet"))
    assert "priorityClassName" not in pod_spec(find(render({}), "Deployment"))


# ---------------------------------------------------------------------------------------------- --set

@pytest.mark.parametrize(("sets", "where", "expected"), [
    (("agent.nodeSelector.gpu=true",), ("DaemonSet", "nodeSelector", "gpu"), "true"),
    (("controller.nodeSelector.pool=1",), ("Deployment", "nodeSelector", "pool"), "1"),
    (("agent.nodeSelector.nvidia\\.com/gpu\\.present=null", "agent.nodeSelector.gpu=yes"),
     ("DaemonSet", "nodeSelector", None), {"gpu": "yes"}),
    (("controller.podAnnotations.prometheus\\.io/scrape=true",), ("Deployment", "annotations", "prometheus.io/scrape"),
     "true"),
    (("agent.podLabels.canary=false",), ("DaemonSet", "labels", "canary"), "false"),
    (("commonLabels.cost-center=42",), ("DaemonSet", "labels", "cost-center"), "42"),
    (("agent.priorityClassName=",), ("DaemonSet", "priorityClassName", None), None),
    (("controller.logs.emptyDirSizeLimit=4Gi",), ("Deployment", "retention", None), int(4 * GIB * 0.8)),
])
def test_values_given_with_set_are_accepted_as_meant(helm_bin: str, sets: tuple[str, ...],
                                                      where: tuple[str, str, str | None], expected: object) -> None:
    """`--set x=true` is a boolean and `--set x=1` a number to helm; where Kubernetes wants a string the chart
    renders one instead of failing the schema or the API server."""
    code, objs, stderr = helm_set(helm_bin, *sets, check=False)
    assert code == 0, stderr
    kind, field, key = where
    workload = find(objs, kind)
    spec, meta = pod_spec(workload), workload["spec"]["template"]["metadata"]
    got: object
    if field == "nodeSelector":
        got = spec["nodeSelector"] if key is None else spec["nodeSelector"][key]
    elif field in ("labels", "annotations"):
        got = meta[field][key]
    elif field == "priorityClassName":
        got = spec.get("priorityClassName")
    else:
        got = effective_retention(objs)
    assert got == expected


# ---------------------------------------------------------------------------------------------- preflight

async def test_with_preflight_enabled_both_roles_start_and_become_ready(render: Render, tmp_path: Path) -> None:
    """`--set preflight.enabled=true`: the controller and an agent built from the rendered config and pod
    environment (the plugins installed, as the images carry them) start against the simulated API server,
    report ready and run both preflight detectors."""
    from kcover import metrics, serving
    from kcover.agent import running as agent_running
    from kcover.controller import running as controller_running
    from kcover.kube import client
    from kcover.nvml import fake
    from kcover.sim import server

    objs = render({"preflight": {"enabled": True}})
    config, _ = rendered_config(objs)
    reports = tmp_path / "preflight"
    reports.mkdir()
    built: dict[str, settings.Settings] = {}
    for kind, role in (("Deployment", "controller"), ("DaemonSet", "agent")):
        env = resolved_env(container(find(objs, kind)), pod=f"kcover-{role}-0", namespace=NAMESPACE, node="gpu-1")
        env.update({"KCOVER_AGENT__XID_POLICY_FILE": "", "KCOVER_RECOVERY__SAVE_LOGS__DIRECTORY": str(tmp_path / "logs"),
                    "KCOVER_AGENT__POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock")})
        data = yaml.safe_load(yaml.safe_dump(config).replace("/var/lib/kcover/preflight", str(reports)))
        built[role] = layering.layer(file_data=data, file_name="config.yaml", environ=env,
                                     cli={"lease.enabled": False}).settings
    async with server.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": "gpu-1"}, "spec": {},
                                   "status": {"capacity": {"nvidia.com/gpu": "8"},
                                              "conditions": [{"type": "Ready", "status": "True"}]}})
        kubes = [client.from_configuration(srv.kube_configuration()) for _ in range(2)]
        health = {role: serving.Health() for role in built}
        controller = controller_running.Controller(built["controller"], client=kubes[0],
                                                   metrics=metrics.Metrics(role="controller"), health=health["controller"])
        agent = agent_running.Agent(built["agent"], client=kubes[1], metrics=metrics.Metrics(role="agent"),
                                    health=health["agent"], node="gpu-1", nvml=fake.FakeNvml(2))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(controller.run(stop)), asyncio.create_task(agent.run(stop))]
        try:
            def states() -> dict[str, Any]:
                return {**controller.supervisor.describe(), **agent.supervisor.describe()}

            async with asyncio.timeout(30):
                while not (all(h.readiness()[0] for h in health.values())  # noqa: ASYNC110 -- polled, as a kubelet probe would
                           and {"preflight", "preflight-collector"} <= set(states())):
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a detector that fails at start would be failed by now
            now = states()
            assert now["preflight"]["state"] == "running", now["preflight"]
            assert now["preflight-collector"]["state"] == "running", now["preflight-collector"]
            assert all(h.readiness()[0] for h in health.values())
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            for kube in kubes:
                await kube.close()
