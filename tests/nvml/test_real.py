"""The real pynvml adapter on a machine without a driver, and its error mapping (no monkeypatching)."""

from __future__ import annotations

import pynvml
import pytest

from kcover import errors
from kcover.nvml import backend, real


def test_init_without_driver_maps_to_library_missing() -> None:
    nvml = real.RealNvml()
    with pytest.raises(errors.NvmlError) as info:
        nvml.init()
    assert info.value.code == backend.CODE_LIBRARY_MISSING
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    nvml.shutdown()  # harmless after a failed init


@pytest.mark.parametrize(("nvml_code", "kcover_code"), [
    (pynvml.NVML_ERROR_GPU_IS_LOST, backend.CODE_GPU_LOST),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, backend.CODE_LIBRARY_MISSING),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, backend.CODE_NO_GPU),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, backend.CODE_NOT_SUPPORTED),
    (pynvml.NVML_ERROR_TIMEOUT, backend.CODE_TIMEOUT),
    (pynvml.NVML_ERROR_UNKNOWN, backend.CODE_UNKNOWN),
])
def test_map_error_from_pynvml_exceptions(nvml_code: int, kcover_code: str) -> None:
    exc = pynvml.NVMLError(nvml_code)  # pynvml's own factory picks the subclass, e.g. NVMLError_GpuIsLost
    mapped = real.map_error(exc, during="nvmlDeviceGetTemperature")
    assert mapped.code == kcover_code
    assert "nvmlDeviceGetTemperature" in str(mapped)


def test_gpu_is_lost_subclass_is_what_the_driver_raises() -> None:
    # Fixture: the last line of a real traceback, "NVMLError_GpuIsLost: GPU is lost".
    exc = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert f"{type(exc).__name__}: {exc}" == "NVMLError_GpuIsLost: GPU is lost"
    assert real.map_error(exc).code == backend.CODE_GPU_LOST


def test_map_error_of_a_failed_library_load() -> None:
    assert real.map_error(OSError("libnvidia-ml.so.1: cannot open shared object file")).code == \
        backend.CODE_LIBRARY_MISSING
    assert real.map_error(ImportError("No module named 'pynvml'")).code == backend.CODE_LIBRARY_MISSING


def test_queries_before_init_fail_cleanly() -> None:
    with pytest.raises(errors.NvmlError):
        real.RealNvml().probe(0)
