"""The rendered chart against a real kube-apiserver: schema validation and RBAC as enforced.

* Every rendered object is created with `dryRun=All` and `fieldValidation=Strict`: the API server's
  own validation and OpenAPI schemas, unknown fields included, for the Kubernetes version built by
  tests/controlplane/build.sh. The chart is rendered as `helm install` renders it for this server: with
  the API versions and kinds its discovery lists (`--api-versions`). Kinds the server does not serve
  (ServiceMonitor without prometheus-operator's CRDs) are checked only by the Python invariants in
  test_render.py; on a server without ValidatingAdmissionPolicy (before 1.30) the chart refuses
  `preflight.restrictHostPath` with the reason instead of installing preflight unguarded.
* The controller's pod passes Pod Security Admission at `restricted`.
* The rendered RBAC is applied for real, then SubjectAccessReviews (and impersonated requests) show
  that every request kcover makes is allowed and the dangerous ones are denied. RBAC cannot confine a
  DaemonSet's ServiceAccount to its own Node (that takes an admission plugin like NodeRestriction,
  which only knows kubelets): one test states that limit as a fact.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml
from chartkit import CHART, KUBE_VERSION, NAMESPACE, RELEASE, SCENARIOS, Render, find, run_helm

from kcover import model, settings
from kcover.agent import reporting

Api = Any  # tests/controlplane/server.py's ControlPlane


def create_namespace(cp: Api, name: str, labels: dict[str, str] | None = None) -> None:
    status, body = cp.request("POST", "/api/v1/namespaces",
                              {"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": name, "labels": labels or {}}})
    assert status in (201, 409), body


def resource_paths(cp: Api) -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) -> (collection path prefix, namespaced), from discovery."""
    out: dict[tuple[str, str], tuple[str, bool]] = {}
    groups = ["/api/v1"]
    _, apis = cp.request("GET", "/apis")
    groups += [f"/apis/{v['groupVersion']}" for g in apis["groups"] for v in g["versions"]]
    for prefix in groups:
        _, doc = cp.request("GET", prefix)
        gv = prefix.removeprefix("/api/").removeprefix("/apis/")
        for r in doc.get("resources", []):
            if "/" not in r["name"]:
                out[(gv, r["kind"])] = (f"{prefix}/{r['name']}", r["namespaced"])
    return out


VAP = ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")


def render_for(cp: Api, helm_bin: str, values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`helm template` with the API versions and kinds the server's discovery lists, as `helm install`
    sees them (helm's offline default lists versions only, no kinds)."""
    served = resource_paths(cp)
    versions = sorted({gv for gv, _ in served} | {f"{gv}/{kind}" for gv, kind in served})
    return run_helm(helm_bin, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version",
                    KUBE_VERSION, *(a for v in versions for a in ("--api-versions", v)), values=values, check=False)


def collection(paths: dict[tuple[str, str], tuple[str, bool]], obj: dict[str, Any]) -> str | None:
    found = paths.get((obj["apiVersion"], obj["kind"]))
    if found is None:
        return None
    base, namespaced = found
    if not namespaced:
        return base
    ns = obj["metadata"].get("namespace", NAMESPACE)
    head, _, plural = base.rpartition("/")
    return f"{head}/namespaces/{ns}/{plural}"


@pytest.fixture(scope="module")
def cluster(controlplane: Api) -> Api:
    create_namespace(controlplane, NAMESPACE)
    create_namespace(controlplane, "restricted-ns", {"pod-security.kubernetes.io/enforce": "restricted"})
    create_namespace(controlplane, "team-a")
    # the GPU operator creates this RuntimeClass; the RuntimeClass admission plugin refuses pods without it
    status, body = controlplane.request("POST", "/apis/node.k8s.io/v1/runtimeclasses",
                                        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                         "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    assert status in (201, 409), body
    return controlplane


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_passes_server_side_dry_run(cluster: Api, helm_bin: str, scenario: str) -> None:
    paths = resource_paths(cluster)
    proc = render_for(cluster, helm_bin, SCENARIOS[scenario])
    guarded = (SCENARIOS[scenario].get("preflight") or {}).get("enabled")
    if guarded and VAP not in paths:
        assert proc.returncode != 0, "the chart rendered preflight for a server without ValidatingAdmissionPolicy"
        assert "preflight.restrictHostPath needs ValidatingAdmissionPolicy" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    checked, unserved = [], []
    for obj in [doc for doc in yaml.safe_load_all(proc.stdout) if doc]:
        path = collection(paths, obj)
        if path is None:
            unserved.append(obj["kind"])
            continue
        status, body = cluster.request("POST", f"{path}?dryRun=All&fieldValidation=Strict", obj)
        if status == 409 and obj["kind"] == "CustomResourceDefinition":  # the test control plane installed it
            _, current = cluster.request("GET", f"{path}/{obj['metadata']['name']}")
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            status, body = cluster.request("PUT", f"{path}/{obj['metadata']['name']}?dryRun=All&fieldValidation=Strict",
                                           obj)
            status = 201 if status == 200 else status
        assert status == 201, f"{obj['kind']}/{obj['metadata']['name']}: HTTP {status}: {body}"
        checked.append(obj["kind"])
    assert {"Deployment", "DaemonSet", "ConfigMap", "ClusterRole", "Role"} <= set(checked)
    assert set(unserved) <= {"ServiceMonitor"}


def test_controller_pod_meets_restricted_pod_security(cluster: Api, render: Render) -> None:
    template = find(render({}), "Deployment", "-controller")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "controller-psa", **template["metadata"]},
           "spec": template["spec"]}
    status, body = cluster.request("POST", "/api/v1/namespaces/restricted-ns/pods?dryRun=All", pod)
    assert status == 201, body


def test_agent_pod_needs_a_namespace_that_allows_host_path(cluster: Api, render: Render) -> None:
    """Documented in install.md: the agent mounts the kubelet's PodResources socket (hostPath)."""
    template = find(render({}), "DaemonSet", "-agent")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-psa"}, "spec": template["spec"]}
    status, body = cluster.request("POST", "/api/v1/namespaces/restricted-ns/pods?dryRun=All", pod)
    assert status == 403
    assert "hostPath" in json.dumps(body)
    status, body = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All", pod)
    assert status == 201, body


def test_the_preflight_hostpath_policy_keeps_each_namespace_to_its_own_folder(cluster: Api, render: Render) -> None:
    """With preflight on, the chart's ValidatingAdmissionPolicy lets a pod mount the preflight folder writable
    only at its own namespace's folder (so no namespace can place report files in another's), read-only
    anywhere (the agent), and refuses writable hostPaths not written plainly."""
    if VAP not in resource_paths(cluster):
        pytest.skip("this server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy: the chart "
                    "refuses preflight.restrictHostPath there (test_every_rendered_object_passes_server_side_dry_run)")
    objs = [o for o in render(SCENARIOS["preflight"])
            if o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    assert [o["kind"] for o in objs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    base = "/apis/admissionregistration.k8s.io/v1"
    paths = {"ValidatingAdmissionPolicy": f"{base}/validatingadmissionpolicies",
             "ValidatingAdmissionPolicyBinding": f"{base}/validatingadmissionpolicybindings"}
    root = "/var/lib/kcover/preflight"

    def pod(path: str, *, read_only: bool = False, init: bool = False) -> int:
        mount = {"name": "reports", "mountPath": "/reports", "readOnly": read_only}
        container = {"name": "c", "image": "busybox", "volumeMounts": [mount]}
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}] if init else [container],
                                "volumes": [{"name": "reports", "hostPath": {"path": path}}]}
        if init:
            spec["initContainers"] = [container]
        status, body = cluster.request("POST", "/api/v1/namespaces/team-a/pods?dryRun=All", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "pf-"}, "spec": spec})
        assert status in (201, 403), body
        assert status == 201 or "only at its own namespace's folder" in json.dumps(body), body
        return int(status)

    try:
        for obj in objs:
            status, body = cluster.request("POST", paths[obj["kind"]], obj)
            assert status == 201, body
        deadline = time.monotonic() + 30
        while pod(root) != 403:  # the policy takes effect once the admission plugin has seen it
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(0.2)
        cases = {
            (f"{root}/team-a", False, False): 201, (f"{root}/team-a/", False, False): 201,
            (f"{root}/team-a/ranks", False, False): 201, (root, True, False): 201, ("/var/log", False, False): 201,
            (root, False, False): 403, (f"{root}/", False, False): 403, (f"{root}/team-b", False, False): 403,
            (f"{root}/team-ab", False, False): 403, ("/var/lib/kcover//preflight/team-b", False, False): 403,
            (f"{root}/./team-b", False, False): 403, (f"{root}/team-b", False, True): 403,
            (f"{root}/team-a", False, True): 201,
        }
        got = {case: pod(case[0], read_only=case[1], init=case[2]) for case in cases}
        assert got == cases
    finally:
        for obj in reversed(objs):
            cluster.request("DELETE", f"{paths[obj['kind']]}/{obj['metadata']['name']}")


# ------------------------------------------------------------------------------------------------ RBAC

@pytest.fixture(scope="module")
def rbac(cluster: Api, render: Render) -> dict[str, str]:
    """Apply the default render's ServiceAccounts and RBAC for real; -> role -> ServiceAccount user."""
    objs = [o for o in render({}) if o["kind"] in
            ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    paths = resource_paths(cluster)
    for obj in objs:
        path = collection(paths, obj)
        assert path is not None
        status, body = cluster.request("POST", path, obj)
        assert status in (201, 409), body
    users = {}
    for obj in objs:
        if obj["kind"] == "ServiceAccount":
            role = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            users[role] = f"system:serviceaccount:{NAMESPACE}:{obj['metadata']['name']}"
    return users


def allowed(cp: Api, user: str, verb: str, resource: str, *, group: str = "", namespace: str = "",
            name: str = "", subresource: str = "") -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user,
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                  "system:authenticated"],
                       "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                              "subresource": subresource, "namespace": namespace,
                                              "name": name}}}
    status, body = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert status == 201, body
    return bool(body["status"].get("allowed"))


LEDGER = settings.RecoverySettings().ledger_name
CONTROLS = settings.RecoverySettings().controls_name
LEASE = settings.LeaseSettings().name

# (verb, resource, group, namespace, name, subresource): every request the controller makes
CONTROLLER_REQUESTS = [
    ("list", "pods", "", "", "", ""), ("watch", "pods", "", "", "", ""),         # cache
    ("get", "pods", "", "team-a", "p", ""),                                       # log saving
    ("get", "pods", "", "team-a", "p", "log"),
    ("delete", "pods", "", "team-a", "p", ""),                                    # uid-preconditioned restart
    ("create", "pods", "", "team-a", "p", "eviction"),                            # eviction restart, drain
    ("list", "namespaces", "", "", "", ""), ("watch", "namespaces", "", "", "", ""),  # pauses (cache)
    ("list", "nodes", "", "", "", ""), ("watch", "nodes", "", "", "", ""),
    ("get", "nodes", "", "", "gpu-1", ""), ("update", "nodes", "", "", "gpu-1", ""),  # cordon
    ("patch", "nodes", "", "", "gpu-1", "status"),  # the remediation request's condition
    ("list", "events", "", "", "", ""), ("watch", "events", "", "", "", ""),
    ("create", "events", "", "team-a", "", ""), ("create", "events", "", "default", "", ""),
    ("list", "resourceslices", "resource.k8s.io", "", "", ""),                    # GPU nodes (DRA)
    ("watch", "resourceslices", "resource.k8s.io", "", "", ""),
    ("create", "devicetaintrules", "resource.k8s.io", "", "", ""),                # device isolation (DRA)
    ("get", "devicetaintrules", "resource.k8s.io", "", "kcover-device-0", ""),
    ("delete", "devicetaintrules", "resource.k8s.io", "", "kcover-device-0", ""),
    ("get", "configmaps", "", NAMESPACE, CONTROLS, ""), ("list", "configmaps", "", NAMESPACE, CONTROLS, ""),
    ("watch", "configmaps", "", NAMESPACE, CONTROLS, ""),  # fieldSelector metadata.name
    ("get", "leases", "coordination.k8s.io", NAMESPACE, LEASE, ""),
    ("update", "leases", "coordination.k8s.io", NAMESPACE, LEASE, ""),
    ("create", "leases", "coordination.k8s.io", NAMESPACE, "", ""),
    ("watch", "leases", "coordination.k8s.io", NAMESPACE, LEASE, ""),  # fieldSelector metadata.name
    ("list", "ledgerentries", "kcover.io", NAMESPACE, "", ""),  # the per-unit ledger
    ("create", "ledgerentries", "kcover.io", NAMESPACE, "", ""),
    ("update", "ledgerentries", "kcover.io", NAMESPACE, f"{LEDGER}.w.u1", ""),
    ("delete", "ledgerentries", "kcover.io", NAMESPACE, f"{LEDGER}.w.u1", ""),
    ("create", "recoveries", "kcover.io", "team-a", "", ""),  # Recovery resources and their retention
    ("patch", "recoveries", "kcover.io", "team-a", "r", "status"),
    ("patch", "recoveries", "kcover.io", "team-a", "r", ""),
    ("list", "recoveries", "kcover.io", "", "", ""), ("delete", "recoveries", "kcover.io", "team-a", "r", ""),
] + [(verb, plural, group, "", "", "")
     for kind in settings.KubeSettings().workload_kinds
     for plural, group in [kind.split(".", 1)]
     for verb in ("list", "watch")]

CONTROLLER_DENIED = [
    ("get", "secrets", "", NAMESPACE, "", ""), ("list", "secrets", "", "", "", ""),
    ("get", "configmaps", "", "team-a", "", ""), ("get", "configmaps", "", NAMESPACE, "other", ""),
    ("update", "configmaps", "", NAMESPACE, CONTROLS, ""), ("create", "configmaps", "", NAMESPACE, "", ""),
    ("get", "configmaps", "", NAMESPACE, LEDGER, ""), ("deletecollection", "pods", "", "team-a", "", ""),
    ("update", "leases", "coordination.k8s.io", NAMESPACE, "other", ""),
    ("create", "pods", "", "team-a", "", ""), ("create", "pods", "", "team-a", "p", "exec"),
    ("delete", "nodes", "", "", "gpu-1", ""), ("update", "nodes", "", "", "gpu-1", "status"),
    ("create", "resourceslices", "resource.k8s.io", "", "", ""),
    ("update", "devicetaintrules", "resource.k8s.io", "", "kcover-device-0", ""),
    ("update", "pytorchjobs", "kubeflow.org", "team-a", "j", ""), ("delete", "jobs", "batch", "team-a", "j", ""),
    ("delete", "events", "", "team-a", "e", ""), ("escalate", "clusterroles", "rbac.authorization.k8s.io", "", "", ""),
    ("impersonate", "serviceaccounts", "", NAMESPACE, "", ""),
    ("create", "ledgerentries", "kcover.io", "team-a", "", ""),  # the ledger lives in the release namespace only
]

AGENT_REQUESTS = [
    ("get", "nodes", "", "", "gpu-1", ""),
    ("patch", "nodes", "", "", "gpu-1", "status"),
    ("create", "events", "", NAMESPACE, "", ""),  # Node Events, in the release namespace only
    ("list", "resourceslices", "resource.k8s.io", "", "", ""),  # its node's DRA devices (spec.nodeName)
    ("watch", "resourceslices", "resource.k8s.io", "", "", ""),
]

AGENT_DENIED = [
    ("update", "nodes", "", "", "gpu-1", ""), ("patch", "nodes", "", "", "gpu-1", ""),  # spec: no cordoning
    ("update", "nodes", "", "", "gpu-1", "status"), ("delete", "nodes", "", "", "gpu-1", ""),
    ("delete", "pods", "", "team-a", "p", ""), ("deletecollection", "pods", "", "team-a", "", ""),
    ("list", "pods", "", "", "", ""), ("get", "pods", "", "team-a", "p", "log"),
    ("create", "events", "", "team-a", "", ""), ("create", "events", "", "default", "", ""),
    ("get", "secrets", "", NAMESPACE, "", ""), ("list", "secrets", "", "", "", ""),
    ("get", "configmaps", "", NAMESPACE, LEDGER, ""),
    ("update", "leases", "coordination.k8s.io", NAMESPACE, LEASE, ""),
    ("create", "recoveries", "kcover.io", "team-a", "", ""), ("patch", "recoveries", "kcover.io", "team-a", "r", "status"),
    ("patch", "recoveries", "kcover.io", "team-a", "r", ""),
    ("update", "ledgerentries", "kcover.io", NAMESPACE, f"{LEDGER}.w.u1", ""),
    ("create", "resourceslices", "resource.k8s.io", "", "", ""),  # reads its devices, never publishes any
    ("update", "resourceslices", "resource.k8s.io", "", "s", ""),
    ("create", "devicetaintrules", "resource.k8s.io", "", "", ""),  # the controller taints, after checking
]


def _ids(cases: list[tuple[str, ...]]) -> list[str]:
    return [f"{v}-{r}{'/' + s if s else ''}-{ns or 'cluster'}{'-' + n if n else ''}" for v, r, _, ns, n, s in cases]


@pytest.mark.parametrize("case", CONTROLLER_REQUESTS, ids=_ids(CONTROLLER_REQUESTS))
def test_controller_may_make_every_request_kcover_makes(cluster: Api, rbac: dict[str, str],
                                                        case: tuple[str, ...]) -> None:
    verb, resource, group, ns, name, sub = case
    assert allowed(cluster, rbac["controller"], verb, resource, group=group, namespace=ns, name=name, subresource=sub)


@pytest.mark.parametrize("case", CONTROLLER_DENIED, ids=_ids(CONTROLLER_DENIED))
def test_controller_is_denied_what_it_does_not_need(cluster: Api, rbac: dict[str, str], case: tuple[str, ...]) -> None:
    verb, resource, group, ns, name, sub = case
    assert not allowed(cluster, rbac["controller"], verb, resource, group=group, namespace=ns, name=name,
                       subresource=sub)


@pytest.mark.parametrize("case", AGENT_REQUESTS, ids=_ids(AGENT_REQUESTS))
def test_agent_may_make_every_request_kcover_makes(cluster: Api, rbac: dict[str, str], case: tuple[str, ...]) -> None:
    verb, resource, group, ns, name, sub = case
    assert allowed(cluster, rbac["agent"], verb, resource, group=group, namespace=ns, name=name, subresource=sub)


@pytest.mark.parametrize("case", AGENT_DENIED, ids=_ids(AGENT_DENIED))
def test_agent_is_denied_what_it_does_not_need(cluster: Api, rbac: dict[str, str], case: tuple[str, ...]) -> None:
    verb, resource, group, ns, name, sub = case
    assert not allowed(cluster, rbac["agent"], verb, resource, group=group, namespace=ns, name=name, subresource=sub)


def test_rbac_cannot_confine_the_agent_to_its_own_node(cluster: Api, rbac: dict[str, str]) -> None:
    """A known limit (docs/security.md): RBAC has no "own Node" rule for a DaemonSet's ServiceAccount,
    so an agent may patch any Node's status. It still cannot touch any Node's spec (no cordon)."""
    assert allowed(cluster, rbac["agent"], "patch", "nodes", name="another-node", subresource="status")
    assert not allowed(cluster, rbac["agent"], "patch", "nodes", name="another-node")


# ----------------------------------------------------------------------------- impersonated requests

def as_user(cp: Api, user: str, method: str, path: str, body: Any = None,
            content_type: str = "application/json") -> tuple[int, Any]:
    """One request made as `user` through impersonation (admin's token, Impersonate-User header)."""
    headers = {"Authorization": f"Bearer {cp.token}", "Accept": "application/json", "Impersonate-User": user}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = content_type
    req = urllib.request.Request(cp.url + path, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=cp.ca_path)
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_impersonated_agent_and_controller_requests(cluster: Api, rbac: dict[str, str]) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-imp"}}
    status, body = cluster.request("POST", "/api/v1/nodes", node)
    assert status in (201, 409), body
    status, body = cluster.request("POST", "/api/v1/namespaces/team-a/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer-0", "labels": {"job": "j1"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert status in (201, 409), body
    agent, controller = rbac["agent"], rbac["controller"]

    assert as_user(cluster, agent, "GET", "/api/v1/nodes/gpu-imp")[0] == 200
    condition = {"status": {"conditions": [{"type": "KcoverGPUHealthy", "status": "True", "reason": "GPUsHealthy",
                                            "message": "ok"}]}}
    status, body = as_user(cluster, agent, "PATCH", "/api/v1/nodes/gpu-imp/status", condition,
                           "application/strategic-merge-patch+json")
    assert status == 200, body
    assert as_user(cluster, agent, "PATCH", "/api/v1/nodes/gpu-imp", {"spec": {"unschedulable": True}},
                   "application/merge-patch+json")[0] == 403
    assert as_user(cluster, agent, "DELETE", "/api/v1/namespaces/team-a/pods/trainer-0")[0] == 403
    assert as_user(cluster, agent, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets")[0] == 403
    # the Node Event the agent builds is accepted in the release namespace, and refused in `default`
    fault = model.CollectorEvent(detector="nvml", severity=model.Severity.ERROR, reason="XID79", message="lost",
                                 target=model.Target(kind=model.TargetKind.NODE, name="gpu-imp", node="gpu-imp"),
                                 recommended=model.Action.CORDON_NODE)
    event = reporting.event_body(fault, node="gpu-imp", reporter="kcover.io/agent", namespace=NAMESPACE,
                                 when=dt.datetime.now(dt.UTC))
    status, body = as_user(cluster, agent, "POST", f"/api/v1/namespaces/{NAMESPACE}/events", event)
    assert status == 201, body
    assert as_user(cluster, agent, "POST", "/api/v1/namespaces/default/events",
                   reporting.event_body(fault, node="gpu-imp", reporter="kcover.io/agent", namespace="default",
                                        when=dt.datetime.now(dt.UTC)))[0] == 403

    assert as_user(cluster, controller, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets")[0] == 403
    status, body = as_user(cluster, controller, "GET",
                           f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
                           f"?fieldSelector=metadata.name%3D{LEASE}")
    assert status == 200, body
    assert as_user(cluster, controller, "GET",
                   f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")[0] == 403
    status, body = as_user(cluster, controller, "GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps"
                           f"?fieldSelector=metadata.name%3D{CONTROLS}")
    assert status == 200, body
    assert as_user(cluster, controller, "GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps")[0] == 403
    assert as_user(cluster, controller, "DELETE", "/api/v1/namespaces/team-a/pods?labelSelector=job%3Dj1")[0] == 403
    uid = cluster.request("GET", "/api/v1/namespaces/team-a/pods/trainer-0")[1]["metadata"]["uid"]
    status, body = as_user(cluster, controller, "DELETE", "/api/v1/namespaces/team-a/pods/trainer-0",
                           {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}})
    assert status == 200, body
    assert cluster.request("GET", "/api/v1/namespaces/team-a/pods/trainer-0")[0] == 404
