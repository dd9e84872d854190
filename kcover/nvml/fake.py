"""A fake `Nvml` backend with injectable faults, for tests and the simulated cluster.

Owns an in-memory set of GPUs and their fault state; `wait()` blocks on a condition variable, so an
injected XID wakes a waiting detector thread at once. Thread-safe: faults are injected from the
event loop while a worker thread waits. It never touches a real driver and does not import kcover.sim.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

from kcover import errors
from kcover.nvml import backend


@dataclass
class _Gpu:
    info: backend.DeviceInfo
    dbe_volatile: int = 0
    lost: bool = False
    remap: backend.RemappedRows = field(default_factory=lambda: backend.RemappedRows(0, 0, False, False))
    pages_pending: bool = False
    remap_supported: bool = True
    mig: tuple[backend.MigDevice, ...] | None = None
    """None: no MIG support; () MIG-capable with MIG off; otherwise the MIG instances (MIG on)."""


class FakeNvml:
    """`backend.Nvml` with `gpus` healthy devices. `init_error` makes `init()` fail with that code."""

    def __init__(self, gpus: int = 8, *, init_error: str = "", uuid_prefix: str = "GPU-fake",
                 mig: dict[int, int] | None = None) -> None:
        """`mig`: GPU index -> MIG instances on it (MIG on; UUIDs `MIG-fake-<gpu>-<n>`); other GPUs MIG-capable, off."""
        self._lock = threading.Condition()
        self._gpus = [_Gpu(backend.DeviceInfo(index=i, uuid=f"{uuid_prefix}-{i:04d}",
                                              pci_bus_id=f"0000:{0x18 + i:02x}:00.0"),
                           mig=tuple(backend.MigDevice(f"MIG-fake-{i:04d}-{n}", gpu_instance_id=n + 1,
                                                       compute_instance_id=0)
                                     for n in range((mig or {}).get(i, 0))))
                      for i in range(gpus)]
        self.init_error = init_error
        """The code `init()` fails with ("" succeeds): clear it to play a driver that loaded after a fix."""
        self._initialised = False
        self._registered = backend.EventType(0)
        self._events: collections.deque[backend.NvmlEvent] = collections.deque()
        self.init_calls = 0
        self.shutdown_calls = 0

    # -------------------------------------------------------------- protocol

    def init(self) -> None:
        self.init_calls += 1
        if self.init_error:
            raise errors.NvmlError(f"fake NVML init failed: {self.init_error}", code=self.init_error)
        self._initialised = True

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        with self._lock:
            self._initialised = False
            self._lock.notify_all()

    def device_count(self) -> int:
        self._check()
        return len(self._gpus)

    def device_info(self, index: int) -> backend.DeviceInfo:
        self._check()
        return self._gpus[index].info

    def register_events(self, types: backend.EventType) -> None:
        self._check()
        self._registered = types

    def wait(self, timeout_ms: int) -> list[backend.NvmlEvent]:
        with self._lock:
            if not self._events and self._initialised:
                self._lock.wait(timeout_ms / 1000.0)
            out = list(self._events)
            self._events.clear()
            return out

    def ecc_double_bit_volatile(self, index: int) -> int:
        return self._gpu(index).dbe_volatile

    def pending_page_retirement(self, index: int) -> bool:
        return self._gpu(index).pages_pending

    def remapped_rows(self, index: int) -> backend.RemappedRows:
        gpu = self._gpu(index)
        if not gpu.remap_supported:
            raise errors.NvmlError("row remapper not supported", code=backend.CODE_NOT_SUPPORTED)
        return gpu.remap

    def probe(self, index: int) -> None:
        self._gpu(index)

    def mig_mode(self, index: int) -> bool:
        gpu = self._gpu(index)
        if gpu.mig is None:
            raise errors.NvmlError("MIG not supported", code=backend.CODE_NOT_SUPPORTED)
        return bool(gpu.mig)

    def mig_devices(self, index: int) -> list[backend.MigDevice]:
        return list(self._gpu(index).mig or ())

    @property
    def registered(self) -> backend.EventType:
        """The event types a caller registered for (0 until `register_events`)."""
        return self._registered

    # -------------------------------------------------------------- faults

    def xid(self, code: int, gpu_index: int = 0) -> None:
        """Emit an XID critical-error event for one GPU."""
        self._emit(backend.NvmlEvent(self._gpus[gpu_index].info.uuid, backend.EventType.XID_CRITICAL, code))

    def double_bit_ecc(self, gpu_index: int = 0, count: int = 1) -> None:
        """Raise the volatile DBE counter (and emit the DBE event, as the driver does)."""
        with self._lock:
            self._gpus[gpu_index].dbe_volatile += count
        self._emit(backend.NvmlEvent(self._gpus[gpu_index].info.uuid, backend.EventType.DOUBLE_BIT_ECC, 0))

    def gpu_lost(self, gpu_index: int = 0) -> None:
        """Every later query for this GPU raises NvmlError(gpu_lost)."""
        with self._lock:
            self._gpus[gpu_index].lost = True

    def row_remap_failure(self, gpu_index: int = 0) -> None:
        with self._lock:
            gpu = self._gpus[gpu_index]
            gpu.remap = backend.RemappedRows(gpu.remap.correctable, gpu.remap.uncorrectable + 1,
                                             gpu.remap.pending, True)

    def row_remap_pending(self, gpu_index: int = 0) -> None:
        with self._lock:
            gpu = self._gpus[gpu_index]
            gpu.remap = backend.RemappedRows(gpu.remap.correctable, gpu.remap.uncorrectable + 1, True,
                                             gpu.remap.failure)

    def retired_pages_pending(self, gpu_index: int = 0, pending: bool = True) -> None:
        """Pages retired, waiting for a reset (pre-Ampere page retirement)."""
        with self._lock:
            self._gpus[gpu_index].pages_pending = pending

    def unsupported_row_remapper(self, gpu_index: int = 0) -> None:
        with self._lock:
            self._gpus[gpu_index].remap_supported = False

    def clear(self, gpu_index: int = 0) -> None:
        """As after a GPU reset: counters, flags and the lost state are gone."""
        with self._lock:
            gpu = self._gpus[gpu_index]
            self._gpus[gpu_index] = _Gpu(gpu.info, mig=gpu.mig)

    # -------------------------------------------------------------- helpers

    def _emit(self, event: backend.NvmlEvent) -> None:
        with self._lock:
            if self._registered & event.event_type:
                self._events.append(event)
                self._lock.notify_all()

    def _check(self) -> None:
        if not self._initialised:
            raise errors.NvmlError("fake NVML is not initialised", code=backend.CODE_UNKNOWN)

    def _gpu(self, index: int) -> _Gpu:
        self._check()
        gpu = self._gpus[index]
        if gpu.lost:
            raise errors.NvmlError(f"GPU {index} is lost", code=backend.CODE_GPU_LOST)
        return gpu
