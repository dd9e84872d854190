"""kcover's PodResources decoder on what a real kubelet answered (tests/fixtures/podresources).

`kubelet-v1.36.3-list.pb` is the bytes of a real kubelet 1.36.3's `v1.PodResourcesLister/List` answer,
recorded by tests/integration/node/test_node_gpus.py (KCOVER_RECORD_FIXTURES=1) on the `node` backend:
the test device plugin's fake `nvidia.com/gpu` devices allocated by the kubelet to three Jobs' pods (one,
two and no GPUs) beside kcover's own pods. The `.json` beside it is what each container was given, read
from the containers themselves (NVIDIA_VISIBLE_DEVICES, set by the device plugin's Allocate answer), not
from this decoder. The real kubelet lists a container's two GPUs as two `ContainerDevices` entries of
one id each (the hand-encoded test server, tests/harness/podresources_server.py, sends one entry with two),
and lists every pod on the node, devices or not.
"""

from __future__ import annotations

import json
from pathlib import Path

from kcover.agent import podresources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "podresources"
RAW = (FIXTURES / "kubelet-v1.36.3-list.pb").read_bytes()
TRUTH = json.loads((FIXTURES / "kubelet-v1.36.3-list.json").read_text())


def test_the_decoder_reads_the_real_kubelets_answer_to_what_the_containers_were_given() -> None:
    decoded = podresources.decode_list_response(RAW)
    got: dict[str, dict[str, list[str]]] = {}
    for a in decoded:
        assert a.resource == TRUTH["resource"]
        got.setdefault(a.pod, {}).setdefault(a.container, []).append(a.device)
    wanted = {pod: {c: sorted(ids) for c, ids in containers.items() if ids}
              for pod, containers in TRUTH["pods"].items()}
    assert {pod: {c: sorted(ids) for c, ids in cs.items()} for pod, cs in got.items()} == \
        {pod: cs for pod, cs in wanted.items() if cs}
    assert sum(len(ids) for cs in wanted.values() for ids in cs.values()) == 3  # one pod with 1 GPU, one with 2


def test_every_pod_on_the_node_is_in_the_answer_with_its_containers() -> None:
    pods = {}
    for message in podresources._messages(RAW, 1):
        name = "".join(podresources._strings(message, 1))
        namespace = "".join(podresources._strings(message, 2))
        containers = ["".join(podresources._strings(c, 1)) for c in podresources._messages(message, 3)]
        pods[f"{namespace}/{name}"] = sorted(containers)
    assert pods == {pod: sorted(cs) for pod, cs in TRUTH["pods"].items()}


def test_pods_holding_a_gpu_are_exactly_the_ones_given_it() -> None:
    decoded = podresources.decode_list_response(RAW)
    for pod, containers in TRUTH["pods"].items():
        for ids in containers.values():
            for gpu in ids:
                assert podresources.pods_holding(decoded, [gpu]) == [pod]
    assert podresources.pods_holding(decoded, ["GPU-fake-0007"]) == []  # allocated to nobody
