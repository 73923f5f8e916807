"""The package's layers, as its imports draw them (README, "Layout"): no
module imports from a layer above its own, no modules import one another in
a circle (imports inside functions included), no module imports or reads
another module's private names, and nothing outside the package imports
one of its private names."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ltc_cache"
# Bottom to top; a module may import from its own rank or any lower one.
RANKS = {"ground": 0, "store": 1, "graph": 2, "compile_backend": 3, "program": 4,
         "report": 5, "cli": 6, "top": 7}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"  # ltc_cache/__init__.py: the public API, over everything
    return parts[1] if parts[1] in RANKS else "ground"


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """The ltc_cache modules ``path`` imports (type-checking imports left out)."""
    tree = ast.parse(path.read_text())
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip = _type_checking_lines(tree)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if not isinstance(node, ast.ImportFrom) or not node.level or node.lineno in skip:
            continue
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
        if node.module:
            found.append((target, node.lineno))
        else:  # from . import a, b: each is a module
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        for target, line in _imports(path, top_level_only=False):
            if RANKS[_layer(target)] > RANKS[_layer(module)]:
                upward.append(f"{module}:{line} -> {target}")
    assert not upward, upward


def test_no_two_modules_import_each_other_at_import_time():
    graph: dict[str, set[str]] = {}
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    for module, path in modules.items():
        graph[module] = {t for t, _ in _imports(path, top_level_only=True) if t in modules}
    cycles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                     if a in graph.get(b, ()) and a != b})
    assert not cycles, cycles


def test_nothing_outside_the_package_imports_a_private_name():
    private = re.compile(r"^\s*from ltc_cache[\w.]* import (.*)$", re.M)
    found = []
    for top in ("tests", "tools", "zoo", "examples"):
        for path in (ROOT / top).rglob("*.py"):
            for names in private.findall(path.read_text()):
                found += [f"{path.relative_to(ROOT)}: {n.strip()}" for n in names.split(",")
                          if n.strip().strip("()").startswith("_")]
    assert not found, found


def test_the_checks_see_the_layers():
    # The checks above are only as good as their reading of the imports.
    backend = PACKAGE / "compile_backend" / "backend.py"
    assert "ltc_cache.graph.cache" in {t for t, _ in _imports(backend, top_level_only=True)}
    assert _layer("ltc_cache.program.precompile") == "program"
    assert _layer("ltc_cache.config") == "ground"
    assert RANKS[_layer("ltc_cache.program.frames")] > RANKS[_layer("ltc_cache.graph.keys")]


# Every import in the package, function-level ones included, read once: the
# checks below see what runs when any function runs, not only at import time.
MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _uses(path: Path) -> tuple[set[str], list[str]]:
    """The ltc_cache modules ``path`` imports anywhere in it (type-checking
    imports left out), and each private name of another ltc_cache module it
    imports or reads as ``module._name``."""
    return _uses_in(_module(path), path, path.read_text())


def _uses_in(module: str, path: Path, text: str) -> tuple[set[str], list[str]]:
    tree = ast.parse(text)
    skip = _type_checking_lines(tree)
    targets: set[str] = set()
    private: list[str] = []
    bound: dict[str, str] = {}  # a local name -> the ltc_cache module it is bound to
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    targets.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    if any(_private(part) for part in alias.name.split(".")):
                        private.append(f"{module}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path, node)
            if source not in MODULES:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:  # from . import a: a is a module
                    targets.add(submodule)
                    bound[alias.asname or alias.name] = submodule
                    continue
                targets.add(source)
                if _private(alias.name) and source != module:
                    private.append(f"{module}:{node.lineno} imports {source}.{alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and _private(node.attr)
                and bound[node.value.id] != module):
            private.append(f"{module}:{node.lineno} reads {bound[node.value.id]}.{node.attr}")
    return targets - {module}, private


def test_no_module_uses_another_modules_private_names():
    found = [use for path in MODULES.values() for use in _uses(path)[1]]
    assert not found, found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_modules_import_each_other_in_a_circle_even_inside_functions():
    graph = {module: _uses(path)[0] for module, path in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, cycles


def test_the_checks_see_private_names_and_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _private("_where") and not _private("__all__") and not _private("where")
    # A function-level import counts: backend.py imports plan.py inside methods.
    backend = PACKAGE / "compile_backend" / "backend.py"
    assert "ltc_cache.compile_backend.plan" in _uses(backend)[0]
    # What the private-name check reports, on a module written for it.
    plan = PACKAGE / "compile_backend" / "plan.py"
    targets, private = _uses_in("ltc_cache.compile_backend.plan", plan, (
        "from typing import TYPE_CHECKING\n"
        "from .support import _rules, op_signature\n"
        "from . import support as s\n"
        "if TYPE_CHECKING:\n    from ..program.precompile import _hidden\n"
        "def f():\n    from ..graph.cache import GraphCache\n"
        "    return s._table, s.__name__, _own\n"))
    assert targets == {"ltc_cache.compile_backend.support", "ltc_cache.graph.cache"}
    support = "ltc_cache.compile_backend.support"
    assert private == [f"ltc_cache.compile_backend.plan:2 imports {support}._rules",
                       f"ltc_cache.compile_backend.plan:8 reads {support}._table"]
