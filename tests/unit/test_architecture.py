"""The import layers hold (README "Architecture"): import-linter's contracts in
pyproject.toml pass, no module imports ragscope code inside a function (where a cycle
could hide), and the import graph has no cycle. Each check is shown to fail on a
wrong-way import planted in a copy of the tree."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from core.base.paths import repo_root
from tools import architecture

ROOT = repo_root()
PACKAGES = ("core", "app", "tools")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _function_level_imports(root: Path) -> list[str]:
    """``file:line`` of every import of a ragscope module inside a function."""
    out = []
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text(encoding="utf-8"))
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom):
                        names = [node.module or ""] if not node.level else ["."]
                    elif isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    else:
                        continue
                    if any(n == "." or n.split(".")[0] in PACKAGES for n in names):
                        out.append(f"{f.relative_to(root)}:{node.lineno}")
    return sorted(set(out))


_CYCLES = """
import json, sys
import grimp

graph = grimp.build_graph(*sys.argv[1:], cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
index, low, stack, on, found = {}, {}, [], set(), []
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            found.append(sorted(comp))


for v in sorted(edges):
    if v not in index:
        visit(v)
print(json.dumps(found))
"""


def _cycles(root: Path) -> list[list[str]]:
    """Strongly connected components (more than one module) of the import graph that
    grimp (import-linter's graph builder) draws of the tree at ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    got = subprocess.run(
        [sys.executable, "-c", _CYCLES, *PACKAGES],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(got.stdout)


def test_layer_contracts_hold() -> None:
    got = _lint(ROOT)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]
    assert "0 broken" in got.stdout


def test_every_module_is_in_a_layer() -> None:
    """A module left out of the layer lists would be unchecked."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for contract in contracts["contracts"]:
        for container in contract.get("containers", []):
            named = {
                m.strip()
                for layer in contract["layers"]
                for m in layer.replace(":", "|").split("|")
            }
            folder = ROOT.joinpath(*container.split("."))
            there = {
                p.stem if p.is_file() else p.name
                for p in folder.iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
            }
            assert there <= named, f"{container}: not in any layer: {sorted(there - named)}"


def test_no_ragscope_import_inside_a_function() -> None:
    assert _function_level_imports(ROOT) == []


def test_no_import_cycle() -> None:
    assert _cycles(ROOT) == []


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # the engine reaching up into a detector, at function level
        (
            "core/storage/db.py",
            "from core.detectors import make_detector",
            "core.storage is not allowed to import core.detectors",
        ),
        # a detector importing another detector
        (
            "core/detectors/spad.py",
            "from core.detectors.redeep import RedeepConfig",
            "core.detectors.spad is not allowed to import core.detectors.redeep",
        ),
        # the engine importing the app
        (
            "core/pipeline/extract.py",
            "from app.text import md",
            "core is not allowed to import app",
        ),
    ],
)
def test_a_wrong_way_import_breaks_the_contracts(
    tmp_path: Path, module: str, planted: str, broken: str
) -> None:
    root = _copy(tmp_path)
    f = root / module
    f.write_text(f.read_text() + f"\n\ndef _planted() -> None:\n    {planted}  # noqa\n")
    got = _lint(root)
    assert got.returncode != 0 and broken in got.stdout, got.stdout[-3000:]
    assert _function_level_imports(root) == [f"{module}:{len(f.read_text().splitlines())}"]


def test_a_cycle_is_found(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    f = root / "core" / "base" / "errors.py"
    f.write_text(f.read_text() + "\n\nimport core.base.examples  # noqa: E402,F401\n")
    assert ["core.base.errors", "core.base.examples"] in _cycles(root)


HOOK_APIS = frozenset({"run_with_hooks", "hooks", "reset_hooks", "add_hook", "run_with_cache"})


def _hook_calls(root: Path) -> list[str]:
    """``file:line`` of every call of a TransformerLens hook API outside core/engine/trace.py."""
    out = []
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            if f == root / "core" / "engine" / "trace.py":
                continue
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in HOOK_APIS
                ):
                    out.append(f"{f.relative_to(root)}:{node.lineno}")
    return out


def test_only_the_trace_module_sets_hooks(tmp_path: Path) -> None:
    assert _hook_calls(ROOT) == []
    root = _copy(tmp_path)
    f = root / "core" / "interventions" / "steer.py"
    f.write_text(f.read_text() + "\n\ndef _planted(model):\n    return model.bridge.hooks([])\n")
    assert _hook_calls(root) == [f"core/interventions/steer.py:{len(f.read_text().splitlines())}"]


# SQL as this codebase writes it: statements start with an upper-case keyword.
SQL = re.compile(
    r"\bSELECT\b.*\bFROM\b|\bUPDATE\s+\w+\s+SET\b|\b(?i:INSERT\s+(OR\s+\w+\s+)?INTO"
    r"|DELETE\s+FROM|(CREATE|ALTER|DROP)\s+(TABLE|(UNIQUE\s+)?INDEX|TRIGGER|VIEW)"
    r"|PRAGMA\s+\w+\s*=?|BEGIN\s+(IMMEDIATE|EXCLUSIVE|DEFERRED))\b",
    re.S,
)
SQL_CALLS = frozenset({"execute", "executemany", "executescript"})


def _sql_lines(source: str) -> list[int]:
    """Lines of ``source`` with SQL: a string (f-strings included, docstrings and other
    bare strings not) that reads as a statement, an ``execute`` call or ``sqlite3``."""
    tree = ast.parse(source)
    docs = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant | ast.JoinedStr)
    }
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SQL_CALLS:
                out.add(node.lineno)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if "sqlite3" in [*names, *(a.name for a in node.names)]:
                out.add(node.lineno)
        elif id(node) in docs or id(node) in parts:
            continue
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if SQL.search(text):
                out.add(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if SQL.search(node.value):
                out.add(node.lineno)
    return sorted(out)


def _sql_outside_storage(root: Path) -> list[str]:
    """``file:line`` of SQL anywhere but core/storage/ (where all of it lives)."""
    storage = root / "core" / "storage"
    return [
        f"{f.relative_to(root)}:{line}"
        for pkg in PACKAGES
        for f in sorted((root / pkg).rglob("*.py"))
        if storage not in f.parents
        for line in _sql_lines(f.read_text(encoding="utf-8"))
    ]


def test_sql_lives_only_in_storage() -> None:
    assert _sql_outside_storage(ROOT) == []
    found = {  # the same scan does see the SQL that is in core/storage/
        f.name
        for f in (ROOT / "core" / "storage").glob("*.py")
        if _sql_lines(f.read_text(encoding="utf-8"))
    }
    assert {"db.py", "migrations.py", "datasets.py", "reviews.py"} <= found


def test_sql_outside_storage_is_found() -> None:
    planted = '''"""A docstring may say SELECT name FROM datasets."""
import sqlite3


def names(store, table):
    """Or DELETE FROM annotations."""
    rows = store._query(f"SELECT name FROM {table} WHERE id = ?", (1,))
    store.run("delete from analyses")
    store.run("UPDATE reviews SET note = ?", ("x",))
    store._conn.execute("ROLLBACK")
    return rows, "Select a dataset from the list; update it, then delete it."
'''
    assert _sql_lines(planted) == [2, 7, 8, 9, 10]


def test_core_holds_one_package_per_layer_each_with_its_own_contract() -> None:
    """``core/`` has no loose modules; each package is a layer of core's contract and
    layers its own modules in a contract of its own."""
    core = ROOT / "core"
    loose = sorted(
        p.name for p in core.iterdir() if p.is_file() and p.name not in {"__init__.py", "py.typed"}
    )
    assert loose == []
    packages = {p.name for p in core.iterdir() if (p / "__init__.py").is_file()}
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    containers = {c for contract in contracts["contracts"] for c in contract.get("containers", [])}
    assert {f"core.{p}" for p in packages} <= containers


# Named after what they serve, in parallel with the code they serve: the CLI's command
# groups (``cli/model``, ``cli/sae``) and storage's table repositories (``storage/jobs``).
PARALLEL_NAMES = ("cli", "storage")


def test_a_module_name_means_one_thing_in_core() -> None:
    seen: dict[str, list[str]] = {}
    for f in (ROOT / "core").rglob("*.py"):
        if f.stem == "__init__" or f.parent.name in PARALLEL_NAMES:
            continue
        seen.setdefault(f.stem, []).append(str(f.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_the_layer_diagram_is_drawn_from_the_packages(tmp_path: Path) -> None:
    assert architecture.stale(ROOT) == [], "run `python -m tools.architecture`"
    root = _copy(tmp_path)
    for name in architecture.DOCS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    assert architecture.stale(root) == []
    init = root / "core" / "signals" / "__init__.py"
    init.write_text(init.read_text().replace('"""', '"""Renamed. ', 1))
    assert architecture.stale(root) == list(architecture.DOCS)
    assert "core/signals/" in architecture.render(root, modules=False)
    assert "attribution | copying_heads" not in architecture.render(root, modules=False)
    architecture.write(root)
    assert architecture.stale(root) == []
    assert "core/signals/" in (root / "README.md").read_text().split("Renamed")[0][-40:]


# `# type: ignore[code]  # why`: mypy (make lint, make test) checks each is still needed
# (warn_unused_ignores) and that it names its code; this checks it says why.
EXPLAINED_IGNORE = re.compile(r"#\s*type:\s*ignore\[[-a-z, ]+\]  # \S")


def _unexplained_ignores(files: dict[str, str]) -> list[str]:
    return [
        f"{name}:{i}"
        for name, text in files.items()
        for i, line in enumerate(text.splitlines(), 1)
        if re.search(r"#\s*type:\s*ignore", line) and not EXPLAINED_IGNORE.search(line)
    ]


def test_every_type_ignore_names_its_code_and_why() -> None:
    files = {str(f.relative_to(ROOT)): f.read_text() for f in (ROOT / "core").rglob("*.py")}
    assert _unexplained_ignores(files) == []
    planted = {
        "a.py": "x = f()  # type: ignore\ny = g()  # type: ignore[arg-type]\n"
        "z = h()  # type: ignore[arg-type]  # h is untyped\n"
    }
    assert _unexplained_ignores(planted) == ["a.py:1", "a.py:2"]


def test_page_scripts_define_no_widget_keys() -> None:
    """A page's widget-key constants live in its family's module of app/state, where its
    state object is, never in the page script."""
    defined = [
        f"{f.name}:{node.lineno}"
        for f in sorted((ROOT / "app" / "views").glob("*.py"))
        for node in ast.parse(f.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id.startswith("KEY_") for t in node.targets)
    ]
    assert defined == []
