"""A throwaway plugin distribution is built, installed, discovered, configured and run."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcover import bus as bus_
from kcover import metrics, settings
from kcover.detectors import contract, registry, supervising

PLUGIN = '''
"""A detector outside the kcover package."""
import asyncio
from typing import ClassVar
from pydantic import BaseModel
from kcover import model
from kcover.detectors import contract

class Config(BaseModel):
    greeting: str = "hello"

class Hello:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model = Config

    def __init__(self, name, config, context):
        self.name, self.config = name, config

    async def run(self, bus, stop):
        await bus.publish(model.CollectorEvent(
            detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name="n1"),
            severity=model.Severity.WARNING, reason="Hello", message=self.config.greeting))
        await stop.wait()
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    (src / "kcover_hello").mkdir()
    (src / "kcover_hello" / "__init__.py").write_text(PLUGIN)
    (src / "kcover_broken").mkdir()
    (src / "kcover_broken" / "__init__.py").write_text("raise ImportError('needs libfoo.so')\n")
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "kcover-hello"
        version = "1.2.3"
        [project.entry-points."kcover.detectors"]
        hello = "kcover_hello:Hello"
        broken = "kcover_broken:Detector"
        [tool.setuptools]
        packages = ["kcover_hello", "kcover_broken"]
    '''))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(src)], check=True, capture_output=True)
    return target


def test_kcover_detectors_lists_the_plugin_and_reports_the_broken_one(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-m", "kcover.cli", "detectors", "-o", "json"], env=env,
                         capture_output=True, text=True, check=True)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["hello"]["distribution"] == "kcover-hello"
    assert rows["hello"]["version"] == "1.2.3"
    assert rows["hello"]["status"] == "ok"
    assert rows["broken"]["status"] == "error: ImportError: needs libfoo.so"
    assert rows["pod-status"]["distribution"] == "kcover"  # built-ins still listed
    assert "detector_plugin_import_failed" in out.stderr
    strict = subprocess.run([sys.executable, "-m", "kcover.cli", "detectors", "--strict"], env=env,
                            capture_output=True, text=True)
    assert strict.returncode == 1


async def test_the_plugin_is_configured_and_runs(installed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(installed))
    eps = [ep for dist in md.distributions(path=[str(installed)]) for ep in dist.entry_points
           if ep.group == registry.GROUP]
    reg = registry.discover(eps)
    assert reg.get("broken").cls is None
    m = metrics.Metrics()
    b = bus_.Bus()
    sub = b.subscribe("test")
    entries = {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}
    entries["hello"] = {"config": {"greeting": "bonjour"}}
    sup = supervising.Supervisor(reg, contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=m), b,
                                 settings.DetectorsSettings.model_validate({"entries": entries}), m)
    stop = asyncio.Event()
    task = asyncio.create_task(sup.run(stop))
    got = await asyncio.wait_for(sub.get_batch(), 5)
    stop.set()
    await task
    assert [(e.detector, e.message) for e in got] == [("hello", "bonjour")]
