"""Addresses in the simulated cluster: node pod CIDRs, pod IPs and host IPs, as pure functions.

Owns what kube-controller-manager's node IPAM controller and a node's CNI (host-local IPAM) decide:
every node gets the next free /24 of the cluster CIDR 10.244.0.0/16 as `spec.podCIDR` (and
`podCIDRs`) unless it has one; a pod started on a node gets the lowest address of the node's pod CIDR
that no other live pod on that node holds, the network and the first address (the node's bridge)
excepted; its host IP is the node's `InternalIP` address. A node without a pod CIDR (one the IPAM
controller has not reached) or without an InternalIP yields no address rather than a made-up one;
an exhausted range likewise. It does no I/O (`actors.Kubelets` writes what it decides).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

CLUSTER_CIDR = ipaddress.ip_network("10.244.0.0/16")
NODE_PREFIX = 24


def next_pod_cidr(nodes: Iterable[Mapping[str, Any]]) -> str | None:
    """The first /24 of the cluster CIDR no node has, or None when all are taken."""
    taken = {str((n.get("spec") or {}).get("podCIDR") or "") for n in nodes}
    for subnet in CLUSTER_CIDR.subnets(new_prefix=NODE_PREFIX):
        if str(subnet) not in taken:
            return str(subnet)
    return None


def host_ip(node: Mapping[str, Any]) -> str:
    """The node's InternalIP address, or ""."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    return ""


def pod_ip(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str:
    """The lowest free pod address on `node` among `pods` (those bound there hold theirs), or ""."""
    cidr = (node.get("spec") or {}).get("podCIDR")
    if not cidr:
        return ""
    try:
        network = ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return ""
    name = (node.get("metadata") or {}).get("name")
    held = {str((p.get("status") or {}).get("podIP")) for p in pods
            if (p.get("spec") or {}).get("nodeName") == name and not (p.get("spec") or {}).get("hostNetwork")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
    hosts = network.hosts()
    next(hosts, None)  # the bridge's
    for address in hosts:
        if str(address) not in held:
            return str(address)
    return ""
