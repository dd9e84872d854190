"""The plugin seam stays one typed module: the shipped plugins import kcover only through the detector
contract (and the event vocabulary, `kcover.model`), and the contract carries no `Any`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kcover.detectors import contract

ROOT = Path(__file__).parents[2]
ALLOWED = {"kcover.detectors.contract", "kcover.model"}
SIM_ONLY = {"plugins/kcover-preflight/kcover_preflight/scenario.py"}
"""A `kcover sim` scenario: only the simulator imports it (its entry point), never a running kcover."""


def _kcover_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kcover"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kcover":
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in ALLOWED else node.module
                      for a in node.names}
    return found


PLUGIN_MODULES = sorted(p for p in ROOT.glob("plugins/*/kcover_*/*.py")
                        if str(p.relative_to(ROOT)) not in SIM_ONLY)


def test_every_shipped_plugin_module_is_looked_at() -> None:
    assert {p.parent.parent.name for p in PLUGIN_MODULES} == {
        "kcover-logscan", "kcover-metax", "kcover-preflight", "kcover-script-detector"}


@pytest.mark.parametrize("path", PLUGIN_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_imports_kcover_only_through_the_contract(path: Path) -> None:
    assert _kcover_imports(path) <= ALLOWED


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from kcover.kube import caching\nfrom kcover import model, errors\nimport kcover.bus\n")
    assert _kcover_imports(module) - ALLOWED == {"kcover.kube", "kcover", "kcover.bus"}


def test_the_contract_has_no_any() -> None:
    tree = ast.parse(Path(contract.__file__).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "Any" not in names
    assert "Any" not in Path(contract.__file__).read_text().split()
