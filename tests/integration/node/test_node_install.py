"""The chart, installed with `helm install` and kcover's own images, running as pods on a real kubelet.

The controller Deployment's two replicas and the agent DaemonSet's pod on the real node run the images
scripts/build-images built (`localhost/kcover-*:<version>`), are Ready through their probes under the
chart's securityContext, and reach the API server with in-cluster config (the `kubernetes` Service,
through kube-proxy). Deleting the leader's pod (graceful, as a rollout or a drain does) moves the Lease
to the other replica, and a real container's exit right after is acted on once, by the new leader.
"""

from __future__ import annotations

import errno
import secrets
import time
from collections.abc import Iterator

import pytest
import workloads as wl
from nodekit import CHART, RELEASE_NS, RealNode, until

import kcover

pytestmark = pytest.mark.parametrize("realnode", ["node"], indirect=True)
RESTARTED = "KcoverRestartedWorkload"
VERIFIED = "KcoverRecoveryVerified"
PROBE = """
import os
try:
    open("/probe", "w")
except OSError as exc:
    print(os.getuid(), exc.errno)
else:
    print(os.getuid(), 0)
"""


@pytest.fixture
def ns(realnode: RealNode) -> Iterator[str]:
    name = realnode.namespace("t-" + secrets.token_hex(4))
    yield name
    realnode.request("DELETE", f"/api/v1/namespaces/{name}")


def test_the_chart_runs_kcovers_images_as_ready_pods_with_in_cluster_config(realnode: RealNode) -> None:
    rn = realnode
    controllers, agent = rn.wait_ready()
    version = kcover.__version__
    for name in [*controllers, agent]:
        pod = rn.ok("GET", f"/api/v1/namespaces/{RELEASE_NS}/pods/{name}")
        role = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        (container,) = pod["status"]["containerStatuses"]
        assert container["image"].endswith(f"localhost/kcover-{role}:{version}"), container["image"]
        assert container["ready"] is True
        assert pod["spec"]["nodeName"] == rn.node  # a real pod, not one of kwok's
        configured = [r for r in rn.json_log(RELEASE_NS, name) if r.get("event") == "kube_client_configured"]
        assert [r["source"] for r in configured] == ["in-cluster"], configured
    # the kubelet ran the controller with the chart's securityContext: uid 65532, a read-only root
    out = rn.exec(RELEASE_NS, controllers[0], "python3", "-c", PROBE)
    assert out.split() == ["65532", str(errno.EROFS)], out


def test_helm_install_without_a_registry_fails_saying_how_to_build_and_push_the_images(realnode: RealNode) -> None:
    proc = realnode.run_helm("install", "other", str(CHART), "--namespace", "kcover-other", "--create-namespace",
                             check=False)
    assert proc.returncode != 0
    assert "image.registry is not set" in proc.stderr, proc.stderr
    assert "scripts/build-images --push REGISTRY" in proc.stderr
    assert realnode.run_helm("status", "other", "--namespace", "kcover-other", check=False).returncode != 0


def test_deleting_the_leader_pod_moves_the_lease_and_a_fault_right_after_is_acted_on_once(
        realnode: RealNode, ns: str) -> None:
    rn = realnode
    controllers, _ = rn.wait_ready()
    job = wl.create(rn, "batch", ns, "train")
    old = until(lambda: wl.running(rn, "batch", ns, "train"), "the Job's two pods Running")
    leader = rn.leader()
    follower = next(c for c in controllers if c != leader)
    started = time.monotonic()
    rn.ok("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/pods/{leader}")
    until(lambda: rn.leader() == follower, f"the Lease to move from {leader} to {follower}", within=60)
    moved = time.monotonic() - started
    fault = wl.trigger(ns, "train")
    until(lambda: rn.events(ns, RESTARTED, job["metadata"]["uid"]), "kcover's restart Event", within=60)
    acted = time.monotonic() - fault
    until(lambda: wl.running(rn, "batch", ns, "train", old=frozenset(wl.uids(old))), "the Job Running again")
    print(f"leader failover: Lease moved {moved:.2f} s after the leader pod's deletion; the fault after it "
          f"acted on in {acted:.2f} s")
    rn.wait_ready()  # the Deployment replaced the deleted pod, and it stands by
    # the recovery is over when kcover verified it: a second restart would have come before
    until(lambda: rn.events(ns, VERIFIED, job["metadata"]["uid"]), "kcover's verification of the recovery")
    events = rn.events(ns, RESTARTED, job["metadata"]["uid"])
    assert len(events) == 1, events
    assert events[0].get("reportingInstance") == follower
