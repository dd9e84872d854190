"""The real `Nvml` adapter over nvidia-ml-py (`pynvml`), imported lazily.

Owns the translation of pynvml's `NVMLError` subclasses into `errors.NvmlError` codes
(`map_error`) and of its ctypes results into `backend` dataclasses. It does not decide anything.
A node without a driver fails `init()` with `library_missing`; without devices or a loaded driver
with `no_gpu`; a GPU that stopped answering with `gpu_lost`. Calls block; run them in a thread.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import structlog

from kcover import errors
from kcover.nvml import backend

log = structlog.get_logger()

# NVML return codes (nvml.h); fixed by the C ABI, so they are safe to name here.
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_DRIVER_NOT_LOADED = 9
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_GPU_IS_LOST = 15

_CODES = {
    _NVML_ERROR_LIBRARY_NOT_FOUND: backend.CODE_LIBRARY_MISSING,
    _NVML_ERROR_DRIVER_NOT_LOADED: backend.CODE_NO_GPU,
    _NVML_ERROR_GPU_IS_LOST: backend.CODE_GPU_LOST,
    _NVML_ERROR_NOT_SUPPORTED: backend.CODE_NOT_SUPPORTED,
    _NVML_ERROR_TIMEOUT: backend.CODE_TIMEOUT,
}


def map_error(exc: BaseException, *, during: str = "") -> errors.NvmlError:
    """Translate a pynvml `NVMLError` (or a failed import/library load) into an `errors.NvmlError`."""
    prefix = f"{during}: " if during else ""
    if isinstance(exc, ImportError | OSError):
        return errors.NvmlError(f"{prefix}NVML library unavailable: {exc}", code=backend.CODE_LIBRARY_MISSING)
    value = getattr(exc, "value", None)
    code = _CODES.get(value, backend.CODE_UNKNOWN) if isinstance(value, int) else backend.CODE_UNKNOWN
    return errors.NvmlError(f"{prefix}{exc} (NVML return {value})", code=code)


def _load() -> types.ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise map_error(exc, during="import pynvml") from exc


def _normalise_bus_id(raw: str | bytes) -> str:
    text = raw.decode() if isinstance(raw, bytes) else raw
    # NVML prints an 8-digit domain (`00000000:3B:00.0`); the kernel log a 4-digit one.
    domain, _, rest = text.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else text.lower()


class RealNvml:
    """`backend.Nvml` over the installed driver."""

    def __init__(self) -> None:
        self._nv: types.ModuleType | None = None
        self._handles: list[Any] = []
        self._uuids: dict[int, str] = {}
        self._event_set: Any = None

    def _call(self, during: str, fn_name: str, *args: Any) -> Any:
        nv = self._nv
        if nv is None:
            raise errors.NvmlError(f"{during}: NVML is not initialised", code=backend.CODE_UNKNOWN)
        try:
            return getattr(nv, fn_name)(*args)
        except nv.NVMLError as exc:
            raise map_error(exc, during=during) from exc

    def _handle(self, index: int) -> Any:
        if self._nv is None or not 0 <= index < len(self._handles):
            raise errors.NvmlError(f"no NVML device {index} (initialised: {self._nv is not None})",
                                   code=backend.CODE_UNKNOWN)
        return self._handles[index]

    def init(self) -> None:
        nv = _load()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise map_error(exc, during="nvmlInit") from exc
        except OSError as exc:  # ctypes load of libnvidia-ml.so.1 itself
            raise map_error(exc, during="nvmlInit") from exc
        self._nv = nv
        count = int(self._call("nvmlDeviceGetCount", "nvmlDeviceGetCount"))
        if count == 0:
            raise errors.NvmlError("nvmlDeviceGetCount: no GPUs on this node", code=backend.CODE_NO_GPU)
        self._handles = [self._call("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex", i)
                         for i in range(count)]

    def shutdown(self) -> None:
        nv = self._nv
        if nv is None:
            return
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.warning("nvml_shutdown_failed", error=str(exc))
        self._nv = None
        self._event_set = None
        self._handles = []

    def device_count(self) -> int:
        return len(self._handles)

    def device_info(self, index: int) -> backend.DeviceInfo:
        handle = self._handle(index)
        uuid = self._call("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", handle)
        pci = self._call("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo", handle)
        uuid_text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        self._uuids[index] = uuid_text
        return backend.DeviceInfo(index=index, uuid=uuid_text, pci_bus_id=_normalise_bus_id(pci.busId))

    def register_events(self, types: backend.EventType) -> None:
        self._event_set = self._call("nvmlEventSetCreate", "nvmlEventSetCreate")
        for index, handle in enumerate(self._handles):
            supported = int(self._call("nvmlDeviceGetSupportedEventTypes",
                                       "nvmlDeviceGetSupportedEventTypes", handle))
            wanted = int(types) & supported
            if wanted:
                self._call("nvmlDeviceRegisterEvents", "nvmlDeviceRegisterEvents", handle, wanted,
                           self._event_set)
            else:
                log.info("nvml_events_unsupported", gpu_index=index, asked=int(types), supported=supported)

    def wait(self, timeout_ms: int) -> list[backend.NvmlEvent]:
        try:
            data = self._call("nvmlEventSetWait", "nvmlEventSetWait_v2", self._event_set, timeout_ms)
        except errors.NvmlError as exc:
            if exc.code == backend.CODE_TIMEOUT:
                return []
            raise
        uuid = self._call("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", data.device)
        uuid_text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return [backend.NvmlEvent(gpu_uuid=uuid_text, event_type=backend.EventType(int(data.eventType)),
                                  data=int(data.eventData))]

    def ecc_double_bit_volatile(self, index: int) -> int:
        uncorrected, volatile = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
        return int(self._call("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTotalEccErrors",
                              self._handle(index), uncorrected, volatile))

    def pending_page_retirement(self, index: int) -> bool:
        return bool(self._call("nvmlDeviceGetRetiredPagesPendingStatus",
                               "nvmlDeviceGetRetiredPagesPendingStatus", self._handle(index)))

    def remapped_rows(self, index: int) -> backend.RemappedRows:
        corr, unc, pending, failure = self._call("nvmlDeviceGetRemappedRows", "nvmlDeviceGetRemappedRows",
                                                 self._handle(index))
        return backend.RemappedRows(correctable=int(corr), uncorrectable=int(unc), pending=bool(pending),
                                    failure=bool(failure))

    def probe(self, index: int) -> None:
        self._call("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperature", self._handle(index), 0)

    def mig_mode(self, index: int) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode", self._handle(index))
        return int(current) == 1  # NVML_DEVICE_MIG_ENABLE

    def mig_devices(self, index: int) -> list[backend.MigDevice]:
        try:
            if not self.mig_mode(index):
                return []
        except errors.NvmlError as exc:
            if exc.code == backend.CODE_NOT_SUPPORTED:
                return []
            raise
        handle = self._handle(index)
        out: list[backend.MigDevice] = []
        count = int(self._call("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMaxMigDeviceCount", handle))
        for slot in range(count):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMigDeviceHandleByIndex",
                                 handle, slot)
            except errors.NvmlError:
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            uuid = self._call("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", mig)
            gi = self._call("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetGpuInstanceId", mig)
            ci = self._call("nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetComputeInstanceId", mig)
            out.append(backend.MigDevice(uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                                         gpu_instance_id=int(gi), compute_instance_id=int(ci)))
        return out
