"""The chart's images and CRDs: no default registry (this project publishes no images), and CRDs kept.

`image.registry` has no default: without it the chart refuses to render and says how to build and push
the images (scripts/build-images); with it, each image is `<registry>/<repository>:<tag>` (the tag
defaults to the chart's appVersion) or `@<digest>`. Nothing in the chart names another project's
images. The Recovery, LedgerEntry and PreflightReport CRDs carry `helm.sh/resource-policy: keep`, so
`helm uninstall` leaves kcover's audit trail and ledger (docs/install.md, "Uninstall").
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chartkit import CHART, KUBE_VERSION, NAMESPACE, REGISTRY, Render, find, run_helm

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def images(objs: list[dict[str, object]]) -> dict[str, str]:
    out = {}
    for kind, suffix, role in (("Deployment", "-controller", "controller"), ("DaemonSet", "-agent", "agent")):
        spec = find(objs, kind, suffix)["spec"]["template"]["spec"]  # type: ignore[index]
        out[role] = spec["containers"][0]["image"]
    return out


def test_without_a_registry_the_chart_refuses_and_says_how_to_build_and_push(helm_bin: str) -> None:
    """(`helm install` against a real API server: tests/integration/node/test_node_install.py.)"""
    proc = run_helm(helm_bin, "template", "kcover", str(CHART), "--namespace", NAMESPACE, "--kube-version",
                    KUBE_VERSION, values={}, check=False, registry=False)
    assert proc.returncode != 0, proc.stdout[:500]
    assert "image.registry is not set" in proc.stderr, proc.stderr
    assert "scripts/build-images --push REGISTRY" in proc.stderr
    assert "--set image.registry=localhost" in proc.stderr


def test_the_image_references(render: Render) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert images(render({})) == {"controller": f"{REGISTRY}/kcover-controller:{version}",
                                  "agent": f"{REGISTRY}/kcover-agent:{version}"}
    assert images(render({"image": {"registry": "localhost"}})) == {
        "controller": f"localhost/kcover-controller:{version}", "agent": f"localhost/kcover-agent:{version}"}
    assert images(render({"image": {"registry": "registry.example.com:5000/ml/", "controller": {"tag": "0.1.0-1"},
                                    "agent": {"digest": DIGEST}}})) == {
        "controller": "registry.example.com:5000/ml/kcover-controller:0.1.0-1",
        "agent": f"registry.example.com:5000/ml/kcover-agent@{DIGEST}"}


def test_the_chart_names_no_other_projects_images() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert values["registry"] == ""
    assert values["controller"]["repository"] == "kcover-controller"
    assert values["agent"]["repository"] == "kcover-agent"
    for path in [CHART / "values.yaml", CHART / "values.schema.json", *CHART.glob("templates/*")]:
        text = path.read_text().lower()
        assert "ghcr.io" not in text, path
        assert "baizeai" not in text, path


@pytest.mark.parametrize("bad", [{"registry": "https://registry.example.com"}, {"registry": "reg istry"},
                                 {"controller": {"repository": "Kcover-Controller"}},
                                 {"agent": {"tag": "v1:2"}}])
def test_the_schema_refuses_a_malformed_image_value(helm_bin: str, bad: dict[str, object]) -> None:
    proc = run_helm(helm_bin, "template", "kcover", str(CHART), "--kube-version", KUBE_VERSION,
                    values={"image": bad}, check=False)
    assert proc.returncode != 0, f"accepted {bad}"
    assert "values don't meet the specifications of the schema" in proc.stderr


def test_the_crds_are_kept_on_uninstall_and_otherwise_the_chart_files(render: Render) -> None:
    objs = render({"preflight": {"enabled": True}})
    for name, source in (("recoveries.kcover.io", "recovery-crd.yaml"), ("ledgerentries.kcover.io", "ledgerentry-crd.yaml"),
                         ("preflightreports.kcover.io", "preflight-crd.yaml")):
        crd = find(objs, "CustomResourceDefinition", name)
        assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert crd == yaml.safe_load((CHART / "files" / source).read_text())
