"""Which nodes are GPU nodes: the one rule the breaker, the detectors and the executors share.

Owns the rule and its defaults. A node is a GPU node when its `status.capacity` lists a non-zero
extended resource matching one of the configured names or globs (`kube.gpu_resources`, defaults
below: NVIDIA whole GPUs and MIG slices, AMD, MetaX), or when a DRA `ResourceSlice` of a configured
GPU driver (`kube.gpu_dra_drivers`) names the node in `spec.nodeName`. Nothing else counts: node
labels (`nvidia.com/gpu.present`) are set by tools that may not run and are not a capacity.

Pure: it reads projections (`projections.Node`, the drivers of the node's ResourceSlices) and does
no I/O. It never raises on odd input; an empty rule counts no node.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kcover.kube import projections as proj

DEFAULT_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu", "metax-tech.com/gpu")
"""Device-plugin resources of GPUs: NVIDIA whole GPUs, NVIDIA MIG slices under the mixed strategy
(`nvidia.com/mig-1g.10gb`, ...), AMD, MetaX."""
DEFAULT_DRA_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com")
"""DRA drivers publishing GPUs: NVIDIA's k8s-dra-driver-gpu, AMD's and Intel's GPU DRA drivers."""


@dataclass(frozen=True)
class GpuRule:
    """The configured answer to "is this a GPU node"."""

    resources: tuple[str, ...] = DEFAULT_RESOURCES
    """Extended resource names; `*`, `?` and `[...]` are globs (`fnmatch`, case-sensitive)."""
    dra_drivers: frozenset[str] = frozenset(DEFAULT_DRA_DRIVERS)

    @classmethod
    def of(cls, resources: Sequence[str], dra_drivers: Iterable[str]) -> GpuRule:
        return cls(tuple(resources), frozenset(dra_drivers))

    @functools.cached_property
    def _pattern(self) -> re.Pattern[str]:
        """All globs as one compiled regex: the breaker checks every node's resources per cordon."""
        return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.resources) or r"(?!)")

    def is_gpu_resource(self, name: str) -> bool:
        return self._pattern.match(name) is not None

    def gpu_capacity(self, node: proj.Node) -> int:
        """GPU devices the node's capacity lists (MIG slices count one each)."""
        return sum(count for name, count in node.extended_resources if self.is_gpu_resource(name))

    def holds_gpus(self, pod: proj.Pod) -> bool:
        """The pod asks for a GPU resource, or holds DRA claims while GPU DRA drivers are configured (a
        claim's devices are not in the pod: any claim may be a GPU's)."""
        return any(self.is_gpu_resource(name) or (name == proj.DRA_CLAIMS and bool(self.dra_drivers))
                   for name in pod.devices)

    def is_gpu_node(self, node: proj.Node, slice_drivers: Iterable[str] = ()) -> bool:
        """`slice_drivers`: the `spec.driver` of every ResourceSlice naming this node."""
        if self.gpu_capacity(node) > 0:
            return True
        return any(driver in self.dra_drivers for driver in slice_drivers)


DEFAULT = GpuRule()
