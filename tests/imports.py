"""One import graph of ``hacpo/``, read from the code (AST, nothing imported), for the tests that guard the
house: ``tests/test_structure.py`` (no cycles) and ``tests/test_layering.py`` (the layer map).

Every import counts, at module level or inside a function: ``import a.b``, ``from a import b`` (``a.b`` where
``b`` is a module, else ``a``), relative imports resolved, ``importlib.import_module("hacpo....")`` and
``__import__`` with a literal name. With ``names=True``, a string constant naming a hacpo module counts too
(``"hacpo.x"``, ``"hacpo.x:attr"``, ``"hacpo.x.attr"``: an entry point, a preload list, a ``python -m``
argument), but not a docstring or a logger's name. Imports under ``if TYPE_CHECKING:`` are left out (they
never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hacpo"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Nodes that never import: bodies under ``if TYPE_CHECKING:`` and docstrings."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
    return skip


def _named_module(text: str, files: dict) -> str | None:
    """The hacpo module a string names (``hacpo.x``, ``hacpo.x:attr``, ``hacpo.x.attr``), if any."""
    name = text.partition(":")[0]
    while name.startswith("hacpo") and name not in files and "." in name:
        name = name.rpartition(".")[0]
    return name if name in files and name != "hacpo" else None


def _first_string_arg(node: ast.AST, *functions: str) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        name = ast.unparse(node.func).rpartition(".")[2]
        if name in functions and isinstance(node.args[0].value, str):
            return node.args[0].value
    return None


def import_graph(package: Path = PACKAGE, *, names: bool = True) -> dict[str, set[str]]:
    """hacpo module → the hacpo modules it imports. ``from pkg import sub`` points at ``pkg.sub`` (the
    package itself is already imported as its parent); ``from pkg import name`` at ``pkg``. ``names``: count
    the modules a string names (the layering counts them; the cycle check does not, as such a module is
    imported by another process or later, never while the naming module loads)."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _skipped_nodes(tree)
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if _first_string_arg(node, "getLogger") is not None:
                skip.add(id(node.args[0]))  # a logger's name, not a module
            if id(node) in skip:
                continue
            if imported := _first_string_arg(node, "import_module", "__import__"):
                targets = [_named_module(imported, files)]
                skip.add(id(node.args[0]))
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in files]
                if len(targets) < len(subs):  # some names are attributes of the module itself
                    targets.append(base)
            elif names and isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets = [_named_module(node.value, files)]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph
