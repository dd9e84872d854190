"""A fake `Nvml` whose faults come from a file, so a separate `kcover agent` process can be driven.

Owns `ScriptedNvml`: `fake.FakeNvml` plus a fault file another process appends to, one fault per line
(`kcover agent --fake-nvml FILE`, for test clusters with fake nodes such as kwok's). Lines are read
when the detector waits for events and when it polls health, so a fault takes effect within one
wait slice (`SLICE_SECONDS`). Line grammar, whitespace separated, `#` starts a comment:

    xid <code> [gpu]              an XID critical-error event (gpu defaults to 0)
    double-bit-ecc [gpu] [count]  volatile DBE counter up, with the driver's event
    gpu-lost [gpu]                every later query for the GPU fails with gpu_lost
    row-remap-failure [gpu]
    clear [gpu]                   as after a GPU reset

How it fails: a line it cannot parse is skipped and kept in `rejected` (it never stops the agent); a
missing file means no faults yet. It never touches a real driver.
"""

from __future__ import annotations

import os
import threading
import time

from kcover.nvml import backend, fake

SLICE_SECONDS = 0.1
"""Longest a `wait()` blocks before re-reading the fault file."""


class ScriptedNvml(fake.FakeNvml):
    """`fake.FakeNvml` with `gpus` devices whose faults are appended to `path` by someone else."""

    def __init__(self, path: str, gpus: int = 8, *, uuid_prefix: str = "GPU-fake") -> None:
        super().__init__(gpus, uuid_prefix=uuid_prefix)
        self.path = path
        self.rejected: list[str] = []
        self._offset = 0
        self._read_lock = threading.Lock()

    def wait(self, timeout_ms: int) -> list[backend.NvmlEvent]:
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            self.poll()
            left = deadline - time.monotonic()
            got = super().wait(int(max(0.0, min(left, SLICE_SECONDS)) * 1000))
            if got or time.monotonic() >= deadline:
                return got

    def probe(self, index: int) -> None:
        self.poll()
        super().probe(index)

    def poll(self) -> int:
        """Apply the lines appended since the last call; returns how many were applied."""
        with self._read_lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return 0
            end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
            self._offset += end
        applied = 0
        for raw in data[:end].decode("utf-8", "replace").splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if self.apply(line):
                applied += 1
            else:
                self.rejected.append(raw)
        return applied

    def apply(self, line: str) -> bool:
        """Apply one fault line; False if it does not parse."""
        verb, *args = line.split()
        try:
            numbers = [int(a) for a in args]
        except ValueError:
            return False
        gpu = numbers[1] if verb == "xid" and len(numbers) > 1 else (numbers[0] if numbers and verb != "xid" else 0)
        if not 0 <= gpu < len(self._gpus):
            return False
        if verb == "xid" and len(numbers) in (1, 2):
            self.xid(numbers[0], gpu)
        elif verb == "double-bit-ecc" and len(numbers) <= 2:
            self.double_bit_ecc(gpu, numbers[1] if len(numbers) == 2 else 1)
        elif verb == "gpu-lost" and len(numbers) <= 1:
            self.gpu_lost(gpu)
        elif verb == "row-remap-failure" and len(numbers) <= 1:
            self.row_remap_failure(gpu)
        elif verb == "clear" and len(numbers) <= 1:
            self.clear(gpu)
        else:
            return False
        return True


def from_file(path: str) -> ScriptedNvml:
    """The backend `kcover agent --fake-nvml PATH` uses (the file need not exist yet)."""
    return ScriptedNvml(os.path.abspath(path))
