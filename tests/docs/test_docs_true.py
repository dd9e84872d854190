"""What the docs say that can be checked stays true: every `kcover` command and flag they show is one the
command line accepts (its `--help`), README's command table lists every command, and the `kubectl -n`
commands that look at kcover's own objects look in the namespace the install docs install into, where
the chart puts them; and every file, folder and test the docs cite is in the tree (`path::test_name`: that
file defines that test; a test named alone: some test file does). (The RBAC tables are checked against the
rendered chart in tests/chart/test_docs_rbac.py; metric names against a running role's /metrics in
tests/integration/test_documented_metrics.py.) install.md starts by building the images; nothing calls the
ledger a ConfigMap; every `*.md` file (and `#anchor`) a setting's description names is in the tree; and
every `snake_case` name the docs cite (a log event, a logged field) is one the code has.
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import importlib.util
import re
import shlex
import typing
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from pydantic import BaseModel

from kcover import codec, settings, wiring
from kcover.cli import parsing
from kcover.detectors import registry

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every fenced code line and every inline code span of a Markdown file."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            out.append((number, line.split(" #", 1)[0]))
        else:
            out += [(number, span) for span in CODE_SPAN.findall(line)]
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """The options `--help` lists for this command."""
    helped = parser.format_help()
    return {opt for action in parser._actions for opt in action.option_strings if opt in helped}


def invocations() -> list[tuple[str, list[str], list[str]]]:
    """(where, command path, flags) of each `kcover ...` the docs show."""
    found = []
    for doc in DOCS:
        for number, text in code_lines(doc):
            for match in re.finditer(r"(?:^|[\s$(])kcover\s+([a-z].*)$", text):
                try:
                    words = shlex.split(match.group(1).split("|", 1)[0].split(";", 1)[0], comments=True)
                except ValueError:
                    words = match.group(1).split()
                found.append((f"{doc.relative_to(ROOT)}:{number}", words))
    parser = parsing.build_parser(wiring.ROLES)
    out = []
    for where, words in found:
        path: list[str] = []
        current = parser
        rest = list(words)
        while rest and ((sub := _subparsers(current)).get(rest[0]) is not None or path + rest[:1] == ["sim", "inject"]):
            path.append(rest[0])
            current = parsing.sim_inject_parser() if path == ["sim", "inject"] else sub[rest.pop(0)]
            if path == ["sim", "inject"]:
                rest.pop(0)
        if not path:
            continue  # `kcover` as a word (a prose span, the package name), not a command
        flags = [w.split("=", 1)[0] for w in rest if w.startswith("--") and len(w) > 2]
        out.append((where, path, flags))
    return out


def _command(path: list[str]) -> argparse.ArgumentParser:
    current = parsing.build_parser(wiring.ROLES)
    for i, word in enumerate(path):
        current = parsing.sim_inject_parser() if path[:i + 1] == ["sim", "inject"] else _subparsers(current)[word]
    return current


def test_the_docs_show_commands() -> None:
    paths = {" ".join(p) for _, p, _ in invocations()}
    assert {"status", "config show", "breaker reset", "sim", "bench", "sim inject xid"} <= paths, \
        "found too few: is the scan right?"


def test_every_flag_the_docs_show_is_one_its_command_accepts() -> None:
    wrong = []
    for where, path, flags in invocations():
        accepted = _options(_command(path))
        wrong += [f"{where}: kcover {' '.join(path)} {flag}" for flag in flags if flag not in accepted]
    assert not wrong, "flags the commands do not take (see their --help):\n" + "\n".join(wrong)


def test_the_flag_scan_catches_a_flag_a_command_does_not_take() -> None:
    assert "--timeout" in _options(_command(["status"]))
    assert "--timeout" not in _options(_command(["config", "show"]))
    assert "--kubeconfig-out" in _options(_command(["sim"]))
    assert "--gpu" in _options(_command(["sim", "inject", "xid"]))
    assert "--gpu" not in _options(_command(["sim", "inject", "pod-error"]))


def test_the_readme_command_table_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = [line for line in readme.splitlines() if line.startswith("| `kcover ")]
    listed = {line.split("`")[1].split()[1] for line in table}
    commands = set(_subparsers(parsing.build_parser(wiring.ROLES)))
    assert commands - listed == set(), f"README's command table omits {sorted(commands - listed)}"
    assert listed - commands == set(), f"README's command table lists {sorted(listed - commands)}, which do not exist"


# ---------------------------------------------------------------------------------------------- namespaces

OWN = re.compile(r"kcover\.io/agent|ledgerentr|\blease|kcover-(controller|agent|ledger|controls|config)|"
                 r"app\.kubernetes\.io/(name|component)=kcover|app\.kubernetes\.io/component=(agent|controller)")
"""What in a kubectl command names one of kcover's own objects (they live in the release namespace)."""


def install_namespace() -> str:
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    match = re.search(r"helm install \S+ \S+ --namespace (\S+)", text)
    assert match, "docs/install.md has no `helm install ... --namespace NS`"
    return match.group(1)


def kubectl_namespaces() -> list[tuple[str, str, str]]:
    """(where, namespace, command) of each `kubectl ... -n NS` in the docs that names kcover's own objects."""
    out = []
    for doc in DOCS:
        for number, text in code_lines(doc):
            if "kubectl" not in text or not OWN.search(text):
                continue
            for match in re.finditer(r"(?:\s-n|--namespace)[ =](\S+)", text):
                out.append((f"{doc.relative_to(ROOT)}:{number}", match.group(1), text.strip()))
    return out


def test_kubectl_looks_for_kcovers_own_objects_in_the_release_namespace() -> None:
    namespace = install_namespace()
    found = kubectl_namespaces()
    assert len(found) >= 5, "found too few kubectl commands: is the scan right?"
    wrong = [f"{where}: -n {ns}: {cmd}" for where, ns, cmd in found if ns != namespace]
    assert not wrong, f"kcover's objects are in the release namespace ({namespace}):\n" + "\n".join(wrong)


@pytest.mark.parametrize("line", [
    "kubectl get events -n default --field-selector reportingComponent=kcover.io/agent",
    "kubectl -n kube-system get ledgerentries",
])
def test_the_namespace_scan_catches_a_wrong_namespace(line: str, tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(f"```\n{line}\n```\n")
    (_, text), = code_lines(doc)
    assert OWN.search(text)
    assert re.search(r"(?:\s-n|--namespace)[ =](\S+)", text).group(1) != install_namespace()  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- cited paths

TOP = {entry.name for entry in ROOT.iterdir()}
"""A word naming one of these first (`tests/...`, `kcover/...`, `scripts/...`, `.ci/...`) is a path in the tree."""
FILE_SUFFIX = re.compile(r"\.(py|ya?ml|sh|md|toml|txt|json|cfg|ini)$")
"""A word ending so is a file too, wherever it is relative to (`files/ledgerentry-crd.yaml`, the chart's)."""
RUNTIME = ("build/", "dist/", ".venv/")
"""Folders created by a build or a test run, not kept in the tree (`.gitignore`)."""
LINK_TARGET = re.compile(r"(?<!!)\]\(\s*<?([^)\s>]+)")
WORD_SPLIT = re.compile(r"[\s=(),'\"]+")


def _prose_words(path: Path) -> list[tuple[int, str]]:
    """(line number, word) of every Markdown link target and every word of prose outside code (a path is
    sometimes cited in plain text: "(tests/sim/test_mttr.py)")."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            prose = CODE_SPAN.sub("", line)
            out += [(number, target.partition("#")[0]) for target in LINK_TARGET.findall(prose)]
            out += [(number, word) for word in WORD_SPLIT.split(LINK_TARGET.sub("]", prose))]
    return out


def _bases(doc: Path) -> list[Path]:
    """Where a path a doc cites may be relative to: the repository, the doc's folder, the chart (the runbook
    names the files `helm upgrade` applies by their place in it) and, for docs/plugins/NAME.md, that plugin."""
    return [ROOT, doc.parent, ROOT / "helm" / "kcover", ROOT / "plugins" / f"kcover-{doc.stem}"]


def citations(doc: Path) -> list[tuple[int, str, str | None]]:
    """(line number, path, test name or None) of each repository path the doc cites in code or a link."""
    out: list[tuple[int, str, str | None]] = []
    words = [(n, w) for n, text in code_lines(doc) for w in WORD_SPLIT.split(text)]
    words += _prose_words(doc)
    for number, word in sorted(words, key=lambda nw: nw[0]):
        word = word.rstrip(".,;:")  # the sentence's punctuation after the path
        if "/" not in word or "://" in word or word.startswith(("/", "~", "$")) or re.search(r"[<>{}*]", word):
            continue  # a URL, an absolute path (in an image, on a node), a placeholder or a glob
        path, _, test = word.partition("::")
        path = re.sub(r":\d+$", "", path).removeprefix("./")
        path = re.sub(r"(\.md)#[\w-]*$", r"\1", path)  # `docs/x.md#heading`: the file (the heading: missing_md_names)
        if path.startswith(RUNTIME):
            continue
        if path.split("/", 1)[0] in TOP or path.startswith("../") or FILE_SUFFIX.search(path):
            name = re.sub(r"\[.*\]$", "", test.rsplit("::", 1)[-1]) or None
            out.append((number, path, name))
    return out


def _exists(doc: Path, path: str) -> Path | None:
    for base in _bases(doc):
        target = (base / path).resolve()
        if target.is_relative_to(ROOT) and target.exists():
            return target
    return None


def missing_paths(docs: list[Path]) -> list[str]:
    """Every cited path that is in none of the doc's bases, and every cited test its file does not define."""
    wrong = []
    for doc in docs:
        where = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
        for number, path, test in citations(doc):
            target = _exists(doc, path)
            if target is None:
                wrong.append(f"{where}:{number}: {path}: no such file or folder")
            elif test and not (target.is_file() and re.search(
                    rf"^\s*(async\s+)?def {re.escape(test)}\b", target.read_text(encoding="utf-8"), re.M)):
                wrong.append(f"{where}:{number}: {path}::{test}: no such test in {target.relative_to(ROOT)}")
    return wrong


def test_the_docs_cite_paths() -> None:
    cited = {(path, test) for doc in DOCS for _, path, test in citations(doc)}
    assert len(cited) >= 50, "found too few cited paths: is the scan right?"
    assert {("scripts/test", None), ("helm/kcover", None), ("files/ledgerentry-crd.yaml", None),
            ("../kcover/kube/capabilities.py", None)} <= cited, "found too few cited paths: is the scan right?"
    assert any(test for _, test in cited), "found no cited test names: is the scan right?"


def test_every_path_the_docs_cite_exists() -> None:
    wrong = missing_paths(DOCS)
    assert not wrong, "paths the docs cite that are not in the tree:\n" + "\n".join(wrong)


TEST_NAME = re.compile(r"^test_\w+$")
TEST_FILES = [*(ROOT / "tests").glob("**/test_*.py"), *(ROOT / "plugins").glob("*/tests/**/test_*.py")]


def unknown_tests(docs: list[Path]) -> list[str]:
    """Every test the docs name alone (`test_x`, its file said in prose or not at all) that no test file defines."""
    defined = {name for f in TEST_FILES
               for name in re.findall(r"^\s*(?:async\s+)?def (test_\w+)", f.read_text(encoding="utf-8"), re.M)}
    wrong = []
    for doc in docs:
        where = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
        for number, text in code_lines(doc):
            name = re.sub(r"\[.*\]$", "", text.strip())
            if TEST_NAME.match(name) and name not in defined:
                wrong.append(f"{where}:{number}: {name}: no test of that name in tests/ or plugins/*/tests/")
    return wrong


def test_every_test_the_docs_name_alone_is_defined() -> None:
    wrong = unknown_tests(DOCS)
    assert not wrong, "tests the docs name that no test file defines:\n" + "\n".join(wrong)


def test_the_path_scan_catches_a_missing_file_and_a_missing_test(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "See `tests/docs/test_nothing_here.py` and [the planner](kcover/recovery/no_such_module.py).\n"
        "`tests/docs/test_docs_true.py::test_that_is_not_there` and\n"
        "`tests/docs/test_docs_true.py::test_the_docs_cite_paths` (it is there), `kcover.io/agent`,\n"
        "`/opt/kcover/plugins/x.py`, `https://example.com/tests/x.py`, `<hostPath>/<namespace>/x.py`.\n"
        "```sh\n./scripts/test tests/docs/test_docs_true.py  # tests/not/in/a/comment.py\n```\n"
        "As tests/sim/test_nowhere.py shows; `test_never_written` and `test_the_docs_cite_paths`.\n")
    wrong = missing_paths([doc])
    assert [w.split(": ", 1)[1] for w in wrong] == [
        "tests/docs/test_nothing_here.py: no such file or folder",
        "kcover/recovery/no_such_module.py: no such file or folder",
        "tests/docs/test_docs_true.py::test_that_is_not_there: no such test in tests/docs/test_docs_true.py",
        "tests/sim/test_nowhere.py: no such file or folder",
    ]
    assert [w.split(": ", 1)[1] for w in unknown_tests([doc])] == [
        "test_never_written: no test of that name in tests/ or plugins/*/tests/"]


def _runbook_alerts(text: str) -> set[str]:
    """Alert names in the first column of the runbook's alert table (section 9), `A` / `B` rows split."""
    section = text.split("## 9. Alerts and the dashboard", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(Kcover\w+)`", row.split("|")[1])}


def test_the_runbooks_alert_table_names_every_alert_the_chart_ships() -> None:
    shipped = set(re.findall(r"^\s*- alert: (\w+)", (ROOT / "helm/kcover/files/prometheus-rules.yaml").read_text(),
                             re.MULTILINE))
    assert len(shipped) >= 10
    listed = _runbook_alerts((ROOT / "docs/runbook.md").read_text())
    assert shipped - listed == set(), "alerts the chart ships that docs/runbook.md's table leaves out"
    assert listed - shipped == set(), "alerts docs/runbook.md's table names that the chart does not ship"


# ---------------------------------------------------------------------------------------------- install order

def install_order_problems(text: str) -> list[str]:
    """Why install.md's text does not start from building the images: its first fenced `sh` block must run
    `scripts/build-images --push`, and no `helm install` may come before the first `scripts/build-images`."""
    blocks = re.findall(r"^\s*```sh[ \t]*\n(.*?)^\s*```", text, re.M | re.S)
    if not blocks:
        return ["no fenced sh block"]
    problems = []
    if not re.search(r"^\s*scripts/build-images\b.*\s--push\b", blocks[0], re.M):
        problems.append("its first sh block does not run scripts/build-images --push")
    build = re.search(r"^\s*(?:\$\s+)?scripts/build-images\b", text, re.M)
    helm = re.search(r"helm\s+install\b", text)
    if build is None:
        problems.append("no scripts/build-images command")
    if helm and (build is None or helm.start() < build.start()):
        problems.append("`helm install` comes before the images are built")
    return problems


def test_install_md_builds_the_images_before_it_installs_the_chart() -> None:
    """docs/install.md starts from `scripts/build-images --push`, and shows no `helm install` before it."""
    assert install_order_problems((ROOT / "docs" / "install.md").read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(("text", "problems"), [
    ("```sh\ngit clone x && cd kcover\nhelm install kcover helm/kcover\n```\n"
     "```sh\nscripts/build-images --push r.example/ml\n```\n",
     ["its first sh block does not run scripts/build-images --push",
      "`helm install` comes before the images are built"]),
    ("```sh\nscripts/build-images r.example/ml\nhelm install kcover helm/kcover\n```\n",
     ["its first sh block does not run scripts/build-images --push"]),
    ("Then `helm install` it.\n```sh\nscripts/build-images --push r.example/ml\n```\n",
     ["`helm install` comes before the images are built"]),
    ("```yaml\na: 1\n```\n```sh\nscripts/build-images --push r.example/ml\n```\n"
     "`scripts/build-images --help` lists its options.\n```sh\nhelm install kcover helm/kcover\n```\n", []),
])
def test_the_install_order_scan_catches_an_install_before_the_build(text: str, problems: list[str]) -> None:
    """install_order_problems finds a clone-then-install page and passes one that builds first."""
    assert install_order_problems(text) == problems


# ---------------------------------------------------------------------------------------------- the ledger

def _models(annotation: object, path: str) -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, model) of `annotation` if it is a model, and of every model nested in it (fields, the
    items of lists and maps, the arms of unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found = [(path, annotation)]
        for name, info in annotation.model_fields.items():
            found += _models(info.annotation, f"{path}.{name}".lstrip("."))
        return found
    return [m for arg in typing.get_args(annotation) for m in _models(arg, path)]


def setting_texts() -> list[tuple[str, str]]:
    """(where, text) of every description of kcover's settings and of every installed detector's config:
    each model's docstring, each field's description, each removed setting's text."""
    models = _models(settings.Settings, "")
    for info in registry.discover().infos:
        if info.cls is not None:
            models += _models(info.cls.config_model, f"detectors.entries.{info.name}.config")
    out = []
    for path, model in models:
        out.append((f"{path or 'Settings'} ({model.__name__})", model.__doc__ or ""))
        out += [(f"{path}.{name}".lstrip("."), info.description or "") for name, info in model.model_fields.items()]
        out += [(f"{path}.{name} (removed)".lstrip("."), why) for name, why in getattr(model, "removed", {}).items()]
    return out


LEDGER_AS_CONFIGMAP = [re.compile(p, re.I) for p in (
    r"\bledger(?:'s|`)?\s+configmaps?\b",  # the ledger ConfigMap, the ledger's ConfigMap, `kcover-ledger` ConfigMap
    r"\bconfigmaps?(?:\s+(?:named|called))?[\s/]+`?kcover-ledger(?![\w.-])",  # the ConfigMap `kcover-ledger`
    r"\bledger(?:'s)?\s+(?:is|are|lives|sits|stays)\s+(?:(?:kept|stored|held|written)\s+)?(?:in|as)?\s*"
    r"(?:a|an|the|one)\s+(?:[\w`.-]+\s+)?configmaps?\b",  # the ledger is (kept in) a ConfigMap
    r"\bconfigmaps?\s+(?:that\s+|which\s+)?(?:holding|holds?|keeping|keeps?|storing|stores?|of|for|with)\s+"
    r"(?:the\s+|its\s+|kcover's\s+)?ledger\b",  # the ConfigMap holding the ledger
    r"\bledger\s*[(,:\u2014\u2013]\s*(?:a|an|the|one)\s+configmaps?\b",  # the ledger (a ConfigMap ...)
)]
"""What calls the ledger a ConfigMap. A sentence that only names both ("the ledger and the controls ConfigMap",
"the chart's config ConfigMap and the ledger") says nothing of the kind."""
HISTORY = re.compile(r"\b(?:earlier|previous|former|older)\s+versions?\b|\bno longer\b|\bformerly\b|\bused to\b"
                     r"|\b(?:is|are)\s+gone\b", re.I)
"""A clause that says it is about what kcover did before (`earlier versions kept it all in the ConfigMap
`kcover-ledger`, which this version no longer reads`)."""


def _clauses(text: str) -> list[str]:
    """The sentences (and clauses after a `;`) of a text, wrapped lines joined; table cells, list items and
    `#` comment lines (YAML, shell) are their own."""
    text = re.sub(r"^[ \t]*#+[ \t]?", "", text, flags=re.M)
    out = []
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*(?:[*+-]|\d+\.)\s)|\|", text):
        out += [c.strip() for c in re.split(r"(?<=[.;!?])\s+", " ".join(paragraph.split())) if c.strip()]
    return out


def ledger_as_configmap(where: str, text: str) -> list[str]:
    """`where: clause` for each clause of `text` that calls the ledger a ConfigMap."""
    return [f"{where}: {clause}" for clause in _clauses(text)
            if any(p.search(clause) for p in LEDGER_AS_CONFIGMAP) and not HISTORY.search(clause)]


LEDGER_SOURCES = [*DOCS, ROOT / "helm" / "kcover" / "values.yaml", ROOT / "helm" / "kcover" / "templates" / "NOTES.txt"]


def test_nothing_calls_the_ledger_a_configmap() -> None:
    """No doc, chart comment or setting's description calls the ledger (LedgerEntry objects) a ConfigMap."""
    texts = [(str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")) for f in LEDGER_SOURCES] + setting_texts()
    assert sum("ledger" in t.lower() and "configmap" in t.lower() for _, t in texts) >= 5, \
        "found too few texts naming both: is the scan right?"
    wrong = [w for where, text in texts for w in ledger_as_configmap(where, text)]
    assert not wrong, "the ledger is LedgerEntry objects (ledgerentries.kcover.io, kcover-ledger.<unit>), " \
                      "not a ConfigMap:\n" + "\n".join(wrong)


@pytest.mark.parametrize(("text", "caught"), [
    ("The controller keeps cooldowns in the ledger ConfigMap.", True),
    ("Back up the ledger's ConfigMap before an upgrade.", True),
    ("Delete the `kcover-ledger` ConfigMap to forget the cooldowns.", True),
    ("```sh\nkubectl -n kcover-system get configmap kcover-ledger -o yaml\n```", True),
    ("The ledger is kept in a ConfigMap in the release namespace.", True),
    ("The ledger lives in one ConfigMap per release.", True),
    ("Restarts are recorded in the ConfigMap holding the ledger;\nit is\nwritten by the leader.", True),
    ("# Lease, ledger ConfigMap and controls\n# names.", True),
    ("| `recovery.ledger_name` | the ledger (a ConfigMap) |", True),
    ("It reads the Lease, the ledger and the controls ConfigMap.", False),
    ("# Lease, ledger and controls ConfigMap names, in the release namespace.", False),
    ("It reads the chart's config ConfigMap and the ledger first.", False),
    ("Namespace of the ledger's LedgerEntry objects, the controls ConfigMap and kcover's Lease.", False),
    ("ConfigMap (in `ledger_namespace`) holding operator controls.", False),
    ("The breaker, `kcover-ledger.breaker` (`recovery.ledger_name`; earlier versions kept it all in the ConfigMap "
     "`kcover-ledger`, which this\nversion no longer reads).", False),
    ("The ledger is LedgerEntry objects. The controls ConfigMap is `kcover-controls`.", False),
])
def test_the_ledger_scan_catches_a_ledger_configmap(text: str, caught: bool) -> None:
    """ledger_as_configmap finds a sentence calling the ledger a ConfigMap, and not one naming both."""
    assert bool(ledger_as_configmap("x", text)) is caught


# ---------------------------------------------------------------------------------------------- named docs

def _check_docs() -> ModuleType:
    """scripts/check-docs as a module, for its heading slugs (GitHub's rules) and anchors."""
    path = ROOT / "scripts" / "check-docs"
    loader = importlib.machinery.SourceFileLoader("check_docs", str(path))
    spec = importlib.util.spec_from_loader("check_docs", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./)?(?:[\w-]+/)*[\w.-]*\w\.md)\b(?:#([\w-]+)|,\s+\"([^\"]+)\")?")
"""A Markdown file a text names (`DESIGN.md`, `docs/runbook.md`), with the `#anchor` or the quoted heading
(`architecture.md, "Workload kinds"`) it points into."""


def missing_md_names(texts: list[tuple[str, str]]) -> list[str]:
    """`where: name` for each `*.md` a text names that is neither in the repository's root nor under docs/
    (nor docs/plugins/, a plugin's page), and each anchor or quoted heading its file does not have."""
    check_docs = _check_docs()
    cache: dict[Path, set[str]] = {}
    wrong = []
    for where, text in texts:
        for name, anchor, heading in MD_NAME.findall(text):
            bases = [ROOT, ROOT / "docs", ROOT / "docs" / "plugins"]
            target = next((b / name for b in bases if (b / name).resolve().is_relative_to(ROOT)
                           and (b / name).is_file()), None)
            if target is None:
                wrong.append(f"{where}: {name}: no such file in the repository's root or docs/")
            elif (anchor or heading) and (anchor or check_docs.slug(heading)) not in check_docs.anchors(target, cache):
                wrong.append(f"{where}: {name}: no heading {anchor or repr(heading)} in {target.relative_to(ROOT)}")
    return wrong


def test_every_md_file_a_settings_description_names_exists() -> None:
    """Every `*.md` file (and heading) a setting's or detector config's description names is in the tree."""
    texts = [*setting_texts(), ("docs/configuration.md", (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))]
    assert any(MD_NAME.search(t) for w, t in texts if w != "docs/configuration.md"), \
        "found no descriptions naming a doc: is the scan right?"
    wrong = missing_md_names(texts)
    assert not wrong, "docs the settings' descriptions name that are not in the tree:\n" + "\n".join(wrong)


@pytest.mark.parametrize(("text", "wrong"), [
    ("The kinds watched (see DESIGN.md).", ["DESIGN.md: no such file in the repository's root or docs/"]),
    ("See docs/nowhere.md and runbook.md.", ["docs/nowhere.md: no such file in the repository's root or docs/"]),
    ("See docs/architecture.md#no-such-heading.", ["docs/architecture.md: no heading no-such-heading in docs/architecture.md"]),
    ('(docs/architecture.md, "No such section").',
     ["docs/architecture.md: no heading 'No such section' in docs/architecture.md"]),
    ("See docs/architecture.md#retries-and-fencing, runbook.md#un-cordoning-a-node, preflight.md and README.md.", []),
    ('(architecture.md, "Contract with the cluster"), `../README.md`', []),
])
def test_the_md_name_scan_catches_a_missing_doc_or_heading(text: str, wrong: list[str]) -> None:
    """missing_md_names finds a named doc, anchor or quoted heading that is not there, and passes those that are."""
    assert [w.split(": ", 1)[1] for w in missing_md_names([("x", text)])] == wrong


def test_the_codec_table_names_every_annotation_and_refusal() -> None:
    """docs/detectors.md's codec table lists every `kcover.io/` annotation the codec reads and every reason it
    refuses an Event for: an annotation added to the codec and not to the table fails here."""
    text = (ROOT / "docs" / "detectors.md").read_text()
    table = text[text.index("| annotation on the Event"):text.index("The refusals are")]
    annotations = {v for k, v in vars(codec).items() if k.isupper() and isinstance(v, str)
                   and v.startswith(codec.PREFIX) and v != codec.PREFIX}
    missing = sorted(a for a in annotations if f"`{a.removeprefix(codec.PREFIX)}" not in table)
    assert not missing, f"docs/detectors.md's codec table lacks {missing}"
    reasons = {v for k, v in vars(codec).items() if k.startswith("REFUSED_") and isinstance(v, str)}
    assert reasons, "the codec names its refusals REFUSED_*"
    assert sorted(r for r in reasons if f"`{r}`" not in table) == []


JUDGEMENT_DEFAULT = re.compile(r"`(recovery\.)?(judgement\.)?([a-z_]+)` \(([0-9][0-9,.]*)( s)?\)")


def judgement_defaults_said(text: str) -> list[tuple[str, str, float]]:
    """(field, as written, the default) for every "`field` (N)" or "`field` (N s)" naming a
    `recovery.judgement` setting (bare, or with its prefix), or a `recovery.` one by its full name, whose
    default is not N."""
    wrong = []
    for found in JUDGEMENT_DEFAULT.finditer(text):
        recovery_only = bool(found[1]) and not found[2]
        fields = (settings.RecoverySettings if recovery_only else settings.JudgementSettings).model_fields
        name, said = found[3], found[4]
        if name not in fields:
            continue
        default = fields[name].default
        if isinstance(default, int | float) and float(said.replace(",", "")) != float(default):
            wrong.append((name, said, float(default)))
    return wrong


def test_the_runbook_says_the_judgements_defaults() -> None:
    text = (ROOT / "docs" / "runbook.md").read_text()
    assert JUDGEMENT_DEFAULT.search(text), "the runbook names the judgement's settings with their defaults"
    assert judgement_defaults_said(text) == []


def test_the_docs_say_the_recovery_settings_defaults_they_name() -> None:
    """`recovery.evict_concurrency` (32) and the like, wherever the docs give a default in brackets."""
    said = {name: judgement_defaults_said((ROOT / "docs" / name).read_text())
            for name in ("architecture.md", "security.md", "runbook.md", "install.md")}
    assert {name: wrong for name, wrong in said.items() if wrong} == {}
    assert "`recovery.evict_concurrency` (32)" in (ROOT / "docs" / "security.md").read_text()


def test_the_defaults_scan_catches_a_wrong_default() -> None:
    assert judgement_defaults_said("within `recovery.judgement.link_seconds` (600 s) after it") == [
        ("link_seconds", "600", 900.0)]
    assert judgement_defaults_said("`device_restarts` (2) times, `node_workloads` (3)") == []
    assert judgement_defaults_said("`recovery.evict_concurrency` (16) evictions, `recovery.delete_concurrency` (16)") == [
        ("evict_concurrency", "16", 32.0)]


NO_SUBRESOURCE = ("the CRD has no status subresource", "the chart's has none")
"""How the docs say the chart's Recovery CRD has no status subresource (a Recovery is created with its status)."""


def recovery_subresource_said_wrong(text: str, *, has_subresource: bool) -> list[str]:
    """The claims of `NO_SUBRESOURCE` in `text` (whitespace folded) that the CRD makes false."""
    folded = " ".join(text.split())
    return [claim for claim in NO_SUBRESOURCE if claim in folded] if has_subresource else []


def test_the_docs_say_what_the_recovery_crd_has() -> None:
    crd = yaml.safe_load((ROOT / "helm" / "kcover" / "files" / "recovery-crd.yaml").read_text())
    has_subresource = "status" in (crd["spec"]["versions"][0].get("subresources") or {})
    texts = {name: (ROOT / "docs" / name).read_text() for name in ("architecture.md", "security.md")}
    for name, text in texts.items():
        assert any(c in " ".join(text.split()) for c in NO_SUBRESOURCE), f"{name} says how a Recovery is written"
        assert recovery_subresource_said_wrong(text, has_subresource=has_subresource) == [], name


def test_the_subresource_scan_catches_a_crd_that_has_one() -> None:
    text = "its own writes them (one create with the status; the CRD has no status\n  subresource)"
    assert recovery_subresource_said_wrong(text, has_subresource=True) == ["the CRD has no status subresource"]
    assert recovery_subresource_said_wrong(text, has_subresource=False) == []


# ---------------------------------------------------------------------------------------------- code names

SNAKE_SPAN = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")
"""A `snake_case` code span: a log event, a logged field, a setting, a function, a JSON field the code writes."""
NOT_OURS = frozenset({"all_reduce_perf", "sendrecv_perf", "tmp_path"})
"""snake_case names the docs cite from outside the code: nccl-tests' binaries and pytest's fixture."""


def _python_sources() -> list[Path]:
    scripts = [p for p in (ROOT / "scripts").iterdir()
               if p.is_file() and p.read_text(encoding="utf-8", errors="replace").startswith("#!/usr/bin/env python")]
    return [*(ROOT / "kcover").glob("**/*.py"), *(p for p in (ROOT / "plugins").glob("*/**/*.py") if "tests" not in p.parts),
            *scripts]


def code_names(sources: list[Path]) -> set[str]:
    """Every string constant, name, attribute, keyword, argument, function and class name in `sources`: the log
    event names (`log.warning("recovery_refused", ...)`) and logged field names among them."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword | ast.arg) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    return names


def unknown_code_names(docs: list[Path], known: set[str]) -> list[str]:
    """Every `snake_case` span of the docs (metric and test names aside: their own tests check them) that the
    code does not hold: a log event or field renamed in the code and not in the docs, so an operator greps for
    a line kcover never writes."""
    wrong = []
    for doc in docs:
        where = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for name in SNAKE_SPAN.findall(line):
                if not name.startswith(("kcover_", "test_")) and name not in known and name not in NOT_OURS:
                    wrong.append(f"{where}:{number}: {name}: nothing in kcover/, plugins/ or scripts/ is called that")
    return wrong


def test_every_log_event_and_field_the_docs_name_is_in_the_code() -> None:
    known = code_names(_python_sources())
    assert {"recovery_refused", "validation_adopted", "verdict_deferred", "supported_mask"} <= known, \
        "the scan missed names the code has: is it right?"
    wrong = unknown_code_names(DOCS, known)
    assert not wrong, "snake_case names the docs cite that the code does not have:\n" + "\n".join(wrong)


def test_the_code_name_scan_catches_a_log_event_the_code_does_not_write(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("the controller log (`recovery_skipped` with `code` and `text`), `kcover_leader`,\n"
                   "`test_not_checked_here`, `all_reduce_perf` and `validation_adopted`.\n")
    known = code_names(_python_sources())
    assert [w.split(": ", 1)[1] for w in unknown_code_names([doc], known)] == [
        "recovery_skipped: nothing in kcover/, plugins/ or scripts/ is called that"]
