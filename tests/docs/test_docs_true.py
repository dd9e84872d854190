"""What the docs say that can be checked stays true: every `kcover` command and flag they show is one the
command line accepts (its `--help`), README's command table lists every command, and the `kubectl -n`
commands that look at kcover's own objects look in the namespace the install docs install into, where
the chart puts them. (The RBAC tables are checked against the rendered chart in
tests/chart/test_docs_rbac.py; metric names against a running role's /metrics in
tests/integration/test_documented_metrics.py.)
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from kcover import wiring
from kcover.cli import parsing

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
