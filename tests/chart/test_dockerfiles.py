"""The Dockerfiles parse into what the chart assumes: pinned base, pinned packages, the plugins, non-root user.

This checks their text; the images themselves are built by scripts/build-images and run as the chart's
pods on the `node` backend (tests/integration/node).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kcover

ROOT = Path(__file__).resolve().parents[2]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("role", ["controller", "agent"])
def test_dockerfile(role: str) -> None:
    steps = instructions(ROOT / f"Dockerfile.{role}")
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), base  # scripts/build-images passes its own
    assert args["KCOVER_VERSION"] == kcover.__version__
    froms = [a for w, a in steps if w == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE}"]  # multi-stage, same pinned base
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]:]
    assert ("COPY", "--from=builder /opt/kcover /opt/kcover") in final
    users = [a for w, a in final if w == "USER"]
    assert users == ["65532:65532"]
    entrypoints = [a for w, a in final if w == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["kcover", role]]
    builder = steps[: len(steps) - len(final)]
    builder_runs = " ".join(a for w, a in builder if w == "RUN")
    assert "kcover-${KCOVER_VERSION}-py3-none-any.whl" in builder_runs  # the pin: another version fails the build
    # exactly the lock's packages, no resolver: requirements/ is what two builds of a version install
    assert "pip install --no-deps -r requirements/build.txt" in builder_runs
    assert "pip install --no-deps -r requirements/runtime.txt" in builder_runs
    assert "pip wheel --no-deps --no-build-isolation" in builder_runs  # the pinned setuptools builds the wheels
    assert "pip check" in builder_runs  # the lock is complete
    # the project's plugins are in both images, so enabling one is configuration
    assert ("COPY", "plugins ./plugins") in builder
    assert "plugins/*/" in builder_runs
    assert "kcover detectors --strict" in builder_runs


def test_the_lock_pins_every_package_exactly() -> None:
    for name in ("runtime.txt", "build.txt", "dev.txt"):
        lines = [ln for ln in (ROOT / "requirements" / name).read_text().splitlines() if ln and not ln.startswith("#")]
        assert lines, name
        for line in lines:
            assert re.fullmatch(r"[a-z0-9-]+==[0-9][0-9A-Za-z.+!-]*", line), (name, line)
    runtime = (ROOT / "requirements" / "runtime.txt").read_text()
    for needed in ("kubernetes-asyncio==", "aiohttp==", "pydantic==", "grpcio==", "pyyaml=="):
        assert needed in runtime


def test_the_lock_satisfies_pyproject() -> None:
    """`scripts/lock-deps --check`: every direct requirement of kcover and the plugins is pinned within range."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock-deps"), "--check"], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dockerignore_keeps_the_build_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    ignored = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    for path in (".git", "tests", ".venv", "plugins/*/tests"):
        assert path in ignored
    for needed in ("kcover", "pyproject.toml", "README.md", "LICENSE", "plugins", "requirements"):
        assert needed not in ignored
