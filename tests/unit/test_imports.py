"""The shape of the code: the core names no capability, and no module imports itself back.

Every module of ``promreflex/``, ``controllers/`` and ``exporters/`` is parsed (not imported),
and every import is an edge, including those inside functions: a lazy import hides a cycle
from Python at start-up, not from the next reader.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from controllers.rca.graph import strongly_connected_components

from promreflex.config import REPO_ROOT

PACKAGES = ("promreflex", "controllers", "exporters")

#: Names the core must not say outside comments and docstrings (explaining the mechanism with
#: an example is fine; code that names a capability is not).
CAPABILITY_NAMES = re.compile(
    r"copy[_-]guard|nginx[_-]tuner|\brca\b|access-?log|\bmesh\b|exporter-|tune-nginx|calibrate",
    re.IGNORECASE,
)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of ours that ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (the RCA engine's Tarjan, which
    works on any adjacency; every module named by an edge is also a key here)."""
    adj = {v: sorted(ws) for v, ws in graph.items()}
    for ws in graph.values():
        for w in ws:
            adj.setdefault(w, [])
    return sorted(sorted(c) for c in strongly_connected_components(adj) if len(c) > 1)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    known = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": tmp_path / "pkg" / "a.py",
             "pkg.b": tmp_path / "pkg" / "b.py", "pkg.c": tmp_path / "pkg" / "c.py"}
    (tmp_path / "pkg").mkdir()
    known["pkg.a"].write_text("def f():\n    from pkg.b import thing\n")
    known["pkg.b"].write_text("from . import c\n")
    known["pkg.c"].write_text("import pkg.a\n")
    graph = {name: imports_of(name, path, known) for name, path in known.items() if path.exists()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_core_imports_no_capability() -> None:
    wrong = {f"{m} imports {t}" for m, targets in import_graph().items() if m.startswith("promreflex")
             for t in targets if not t.startswith("promreflex")}
    assert not wrong, sorted(wrong)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def code_without_comments_and_docstrings(path: Path) -> str:
    """The source with comments and docstrings (string statements) blanked out."""
    source = path.read_text()
    docstrings = {(n.lineno, n.col_offset) for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start in docstrings):
            continue
        kept.append(tok.string)
    return " ".join(kept)


def test_the_core_names_no_capability() -> None:
    said = {}
    for path in sorted((REPO_ROOT / "promreflex").rglob("*")):
        if path.suffix == ".py":
            text = code_without_comments_and_docstrings(path)
        elif path.suffix in (".yml", ".yaml"):
            text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        else:
            continue
        hits = sorted({m.group(0) for m in CAPABILITY_NAMES.finditer(text)})
        if hits:
            said[str(path.relative_to(REPO_ROOT))] = hits
    assert not said, said


@pytest.mark.parametrize("source, hit", [("x = 'copy_guard'\n", True), ("# copy_guard\n", False),
                                         ('"""the mesh"""\n', False), ("from exporters.mesh import cli\n", True)])
def test_the_name_check_can_fail(tmp_path: Path, source: str, hit: bool) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert bool(CAPABILITY_NAMES.search(code_without_comments_and_docstrings(path))) is hit
