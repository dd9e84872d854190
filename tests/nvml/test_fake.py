"""The fake backend honours the protocol and its injected faults."""

from __future__ import annotations

import threading
import time

import pytest

from kcover import errors
from kcover.nvml import backend, fake


def _ready(gpus: int = 2) -> fake.FakeNvml:
    nvml = fake.FakeNvml(gpus)
    nvml.init()
    nvml.register_events(backend.EventType.XID_CRITICAL | backend.EventType.DOUBLE_BIT_ECC)
    return nvml


def test_implements_the_protocol() -> None:
    assert isinstance(fake.FakeNvml(), backend.Nvml)


def test_init_error_is_injectable() -> None:
    with pytest.raises(errors.NvmlError) as info:
        fake.FakeNvml(init_error=backend.CODE_NO_GPU).init()
    assert info.value.code == backend.CODE_NO_GPU


def test_xid_wakes_a_waiting_thread_at_once() -> None:
    nvml = _ready()
    got: list[backend.NvmlEvent] = []
    waiter = threading.Thread(target=lambda: got.extend(nvml.wait(5000)))
    started = time.monotonic()
    waiter.start()
    nvml.xid(79, gpu_index=1)
    waiter.join()
    assert time.monotonic() - started < 1.0
    assert got == [backend.NvmlEvent(nvml.device_info(1).uuid, backend.EventType.XID_CRITICAL, 79)]


def test_wait_times_out_empty() -> None:
    assert _ready().wait(1) == []


def test_unregistered_event_types_are_not_delivered() -> None:
    nvml = fake.FakeNvml(1)
    nvml.init()
    nvml.register_events(backend.EventType.DOUBLE_BIT_ECC)
    nvml.xid(13)
    assert nvml.wait(1) == []


def test_health_faults_and_clear() -> None:
    nvml = _ready()
    nvml.double_bit_ecc(0, count=2)
    nvml.row_remap_failure(0)
    nvml.retired_pages_pending(0)
    assert nvml.ecc_double_bit_volatile(0) == 2
    assert nvml.remapped_rows(0).failure
    assert nvml.pending_page_retirement(0)
    nvml.gpu_lost(0)
    with pytest.raises(errors.NvmlError) as info:
        nvml.probe(0)
    assert info.value.code == backend.CODE_GPU_LOST
    nvml.probe(1)
    nvml.clear(0)
    nvml.probe(0)
    assert nvml.ecc_double_bit_volatile(0) == 0
    assert not nvml.remapped_rows(0).failure
