"""The simulated cluster's control endpoint and `kcover sim inject`, the command that calls it.

The endpoint: `POST /kcover-sim/v1/faults` on the simulated API server's own address (so the
kubeconfig `kcover sim --serve --kubeconfig-out FILE` writes is all a user needs), body one JSON
`injecting.Fault`; answers 201 `{"injected": "<what happened>"}`, 400 `{"error": ...}` for a fault
that cannot be injected, 415 for a body that is not JSON. It is an aiohttp middleware in front of the
Kubernetes paths (`install`), present in every `SimCluster`; every other path goes to the API
server untouched. Like the simulated API server it listens on loopback and trusts its caller.

The command: `kcover sim inject KIND [flags]` reads the served cluster's address from a kubeconfig
(`--kubeconfig`, else $KUBECONFIG, else ~/.kube/config; its current context), sends one fault and
prints what happened (`-o json`: the endpoint's answer). Exit 0 injected, 1 refused (the reason on
stderr), 3 the served cluster could not be reached or is not a `kcover sim --serve` (a real API
server answers the path 404).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import yaml
from aiohttp import web

from kcover.sim import cluster as cluster_
from kcover.sim import injecting

PATH = "/kcover-sim/v1/faults"
UNREACHABLE = 3

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def install(c: cluster_.SimCluster) -> None:
    """Serve the control endpoint on `c`'s API server (before it starts: aiohttp freezes its middlewares)."""

    @web.middleware
    async def control(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != PATH:
            return await handler(request)
        if request.method != "POST":
            return web.json_response({"error": f"{request.method} is not allowed; POST a fault"}, status=405)
        try:
            doc = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": "the body is not JSON"}, status=415)
        try:
            done = injecting.inject(c, injecting.Fault.from_json(doc))
        except injecting.InjectError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"injected": done}, status=201)

    c.srv.add_http_middleware(control)


# ---------------------------------------------------------------------------------------------- the command

def _common(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--kubeconfig", default="" if default is None else default,
                   help="kubeconfig of the served cluster, as `kcover sim --serve --kubeconfig-out FILE` wrote it "
                        "(default $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text" if default is None else default,
                   help="what happened, as text (default) or JSON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _common(p, None)
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    common = argparse.ArgumentParser(add_help=False)
    _common(common, argparse.SUPPRESS)  # also after KIND, without overriding what came before it

    def pod_args(k: argparse.ArgumentParser, *, container_help: str) -> None:
        k.add_argument("pod", help="the pod (`kubectl get pods -n ml` lists the jobs' pods)")
        k.add_argument("-n", "--namespace", default=cluster_.NAMESPACE, help=f"its namespace (default {cluster_.NAMESPACE})")
        k.add_argument("--container", default="", help=container_help)

    k = kinds.add_parser("pod-error", parents=[common], help="a container of a pod exits with an error",
                         description="The container exits: the kubelet restarts it (lastState.terminated, restartCount "
                                     "+1) or, with restartPolicy Never, the pod fails.")
    pod_args(k, container_help="the container (default: the pod's only one)")
    k.add_argument("--exit-code", type=int, default=1, help="its exit code (default 1)")
    k.add_argument("--reason", default="", help="terminated.reason (default Error, Completed for exit code 0)")
    k.add_argument("--message", default="", help="terminated.message")
    k.add_argument("--log", default="", help="lines the container printed before it exited (kubectl logs --previous)")

    k = kinds.add_parser("xid", parents=[common], help="an XID on one GPU of a node, through the node's simulated NVML",
                         description="The node's NVML reports the XID event; the node's kcover agent sees it as on "
                                     "hardware (XID 79: the GPU fell off the bus; 48: double-bit ECC; 13, 31, 43: "
                                     "application faults).")
    k.add_argument("node", help="the node (`kubectl get nodes`)")
    k.add_argument("--gpu", type=int, default=0, help="the GPU's index on the node (default 0)")
    k.add_argument("--code", type=int, default=79, help="the XID code (default 79)")

    k = kinds.add_parser("dra-health", parents=[common], help="a pod's DRA device turns Unhealthy (KEP-4680 allocatedResourcesStatus)")
    pod_args(k, container_help="the container holding the device (default: the pod's only one)")
    k.add_argument("--device", default="", help="the device's resourceID (default gpu.nvidia.com/<node>/gpu-0)")
    k.add_argument("--resource", default=cluster_.GPU_RESOURCE_STATUS,
                   help=f"the allocatedResourcesStatus name (default {cluster_.GPU_RESOURCE_STATUS})")
    k.add_argument("--health", choices=injecting.HEALTH, default="Unhealthy", help="its health (default Unhealthy)")
    k.add_argument("--message", default="", help="the health message (1.36+)")

    k = kinds.add_parser("node-not-ready", parents=[common], help="a node's Ready condition turns False or Unknown (or True again)")
    k.add_argument("node", help="the node")
    k.add_argument("--status", choices=injecting.READY, default="False",
                   help="False: the kubelet reports not ready; Unknown: it stopped posting; True: ready again "
                        "(default False)")
    k.add_argument("--reason", default="", help="the condition's reason (default KubeletNotReady, NodeStatusUnknown "
                   "or KubeletReady)")
    k.add_argument("--message", default="", help="the condition's message")

    k = kinds.add_parser("nccl-hang", parents=[common], help="a health checker's Event about a pod, annotated kcover.io/need-recovery=true")
    k.add_argument("pod", help="the pod the hang is about")
    k.add_argument("-n", "--namespace", default=cluster_.NAMESPACE, help=f"its namespace (default {cluster_.NAMESPACE})")
    k.add_argument("--reason", default="NCCLAllReduceHang", help="the Event's reason (default NCCLAllReduceHang)")
    k.add_argument("--message", default="all-reduce stalled for 300s", help="the Event's message")
    k.add_argument("--reporter", default="healthcheck.example.com/checker",
                   help="its reportingController (default healthcheck.example.com/checker)")


def fault_of(args: argparse.Namespace) -> injecting.Fault:
    """The fault the command line asks for."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(injecting.Fault)
             if f.name != "kind" and hasattr(args, f.name)}
    return injecting.Fault(kind=args.kind, **given)


def server_of(kubeconfig: str) -> str:
    """The server URL of the kubeconfig's current context; ValueError when it names none."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"kubeconfig {path} is not a kubeconfig")
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or []}
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or []}
    context = contexts.get(doc.get("current-context"), {})
    server = (clusters.get(context.get("cluster")) or {}).get("server")
    if not server:
        raise ValueError(f"kubeconfig {path} names no server for its current context")
    return str(server).rstrip("/")


def send(server: str, fault: injecting.Fault, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """POST `fault` to the served cluster's control endpoint: (HTTP status, answer)."""
    body = json.dumps({k: v for k, v in dataclasses.asdict(fault).items()}).encode()
    request = urllib.request.Request(server + PATH, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        data = err.read()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = {}
        return err.code, answer if isinstance(answer, dict) else {}


def main(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        server = server_of(args.kubeconfig)
    except ValueError as exc:
        print(f"kcover sim inject: {exc}", file=sys.stderr)
        return UNREACHABLE
    fault = fault_of(args)
    try:
        code, answer = send(server, fault)
    except (OSError, ValueError) as exc:
        print(f"kcover sim inject: cannot reach the served cluster at {server}: {exc} (is `kcover sim --serve` "
              "running?)", file=sys.stderr)
        return UNREACHABLE
    if code == 201:
        print(json.dumps(answer) if args.output == "json" else answer.get("injected", ""), file=out)
        return 0
    if code in (400, 405, 415) and "error" in answer:
        print(f"kcover sim inject: {answer['error']}", file=sys.stderr)
        return 1
    print(f"kcover sim inject: {server} answered HTTP {code} to {PATH}: it is not a `kcover sim --serve` cluster",
          file=sys.stderr)
    return UNREACHABLE
