"""The Dockerfiles parse into what the chart assumes: pinned slim base, non-root user, role entrypoint.

No container engine runs in CI, so the images are not built here; this checks their text.
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
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), base
    assert args["KCOVER_VERSION"] == kcover.__version__
    froms = [a for w, a in steps if w == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE}"]  # multi-stage, same pinned base
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]:]
    assert ("COPY", "--from=builder /opt/kcover /opt/kcover") in final
    users = [a for w, a in final if w == "USER"]
    assert users == ["65532:65532"]
    entrypoints = [a for w, a in final if w == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["kcover", role]]
    builder_runs = " ".join(a for w, a in steps[: len(steps) - len(final)] if w == "RUN")
    assert "kcover-${KCOVER_VERSION}-py3-none-any.whl" in builder_runs  # the pin: another version fails the build


def test_dockerignore_keeps_the_build_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    ignored = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    for path in (".git", "tests", ".venv"):
        assert path in ignored
    for needed in ("kcover", "pyproject.toml", "README.md", "LICENSE"):
        assert needed not in ignored
