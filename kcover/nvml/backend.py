"""The `Nvml` protocol: the few NVML calls kcover makes, and the plain values they return.

Owns the contract between the NVML detector and whatever answers it (the real pynvml adapter in
`real.py`, the fake in `fake.py`). It does no I/O. Every call may raise `errors.NvmlError` whose
`code` is one of the `CODE_*` names below; calls block (NVML is a C library) and are made from a
worker thread by the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

CODE_LIBRARY_MISSING = "library_missing"
"""libnvidia-ml.so could not be loaded: no driver installed on this node."""
CODE_NO_GPU = "no_gpu"
"""The driver is not loaded or there are no devices."""
CODE_GPU_LOST = "gpu_lost"
"""NVML_ERROR_GPU_IS_LOST: the GPU stopped answering (fallen off the bus)."""
CODE_NOT_SUPPORTED = "not_supported"
"""The device does not support this query (no ECC, no row remapper)."""
CODE_TIMEOUT = "timeout"
"""An event wait ended without events; never leaves `wait()`, listed for adapters."""
CODE_UNKNOWN = "unknown"


class EventType(enum.IntFlag):
    """NVML event type bits (`nvmlEventType*`), only those kcover registers."""

    SINGLE_BIT_ECC = 0x2
    DOUBLE_BIT_ECC = 0x4
    XID_CRITICAL = 0x8


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    """`GPU-xxxxxxxx-...`, the id Kubernetes device plugins and DRA drivers use."""
    pci_bus_id: str
    """Normalised lower-case `dddd:bb:dd.f`, as the kernel log prints it."""


@dataclass(frozen=True)
class NvmlEvent:
    gpu_uuid: str
    event_type: EventType
    data: int
    """For XID_CRITICAL: the XID code."""


@dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows: rows remapped for correctable / uncorrectable errors, and flags."""

    correctable: int
    uncorrectable: int
    pending: bool
    """A remap waits for a GPU reset to take effect."""
    failure: bool
    """A remap failed: the GPU has run out of spare rows."""


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU (nvmlDeviceGetMigDeviceHandleByIndex)."""

    uuid: str
    """`MIG-xxxxxxxx-...`, the id the NVIDIA device plugin hands pods under `nvidia.com/mig-*`."""
    gpu_instance_id: int
    compute_instance_id: int


@runtime_checkable
class Nvml(Protocol):
    """Blocking NVML calls. Devices are addressed by index (0..device_count-1)."""

    def init(self) -> None:
        """Load the library and initialise; raises NvmlError(library_missing | no_gpu)."""
        ...

    def shutdown(self) -> None: ...

    def device_count(self) -> int: ...

    def device_info(self, index: int) -> DeviceInfo: ...

    def register_events(self, types: EventType) -> None:
        """Create the event set and register every device for `types` (unsupported types skipped)."""
        ...

    def wait(self, timeout_ms: int) -> list[NvmlEvent]:
        """Block up to `timeout_ms` for events; [] on timeout."""
        ...

    def ecc_double_bit_volatile(self, index: int) -> int:
        """Uncorrected (double-bit) ECC errors since the last driver load; NvmlError(not_supported)."""
        ...

    def pending_page_retirement(self, index: int) -> bool:
        """Pages retired but waiting for a reset (pre-Ampere page retirement)."""
        ...

    def remapped_rows(self, index: int) -> RemappedRows:
        """Row-remapper state (Ampere and newer)."""
        ...

    def probe(self, index: int) -> None:
        """A cheap query that raises NvmlError(gpu_lost) when the GPU is lost."""
        ...

    def mig_mode(self, index: int) -> bool:
        """Whether MIG is enabled now (the current, not the pending, mode); NvmlError(not_supported) on GPUs
        without MIG."""
        ...

    def mig_devices(self, index: int) -> list[MigDevice]:
        """The MIG instances of GPU `index`; [] when MIG is off."""
        ...
