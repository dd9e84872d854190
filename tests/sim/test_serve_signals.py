"""`kcover sim --serve` stops on SIGINT and SIGTERM, also when started with SIGINT ignored.

A process a shell without job control starts in the background (CI runners, `nohup`, `cmd &` in a script)
inherits SIGINT ignored, and Python then raises no KeyboardInterrupt: the served cluster ignored `kill -INT`
and SIGTERM alike, and only SIGKILL ended it (every test that served one waited 20 s for it, then killed it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_served_cluster_started_with_sigint_ignored_stops_on_the_signal(tmp_path: Path, sig: signal.Signals) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    served = [sys.executable, "-m", "kcover.cli", "sim", "pod-error", "--serve", "--nodes", "2", "--jobs", "1",
              "--gpus-per-node", "1", "--kubeconfig-out", str(kubeconfig)]
    # SIGINT ignored by a first process that then execs the served one (an ignored signal stays ignored
    # across exec), as a shell does: not by `preexec_fn`, whose Python code runs between fork and exec in a
    # copy of this multi-threaded test process (a fresh-clone run saw that child die of a segmentation fault)
    ignoring = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", ignoring, *served],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the line that says it serves is the last one before serving
            seen.append(line)
            if line.startswith("serving the simulated cluster"):
                break
        assert kubeconfig.is_file(), "".join(seen)
        # what it logs from here on is drained: a full pipe would block its shutdown, not the signal
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        sent = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"exit {rc} after {sig.name}"
    print(f"{sig.name}: stopped {took:.2f} s after the signal")
