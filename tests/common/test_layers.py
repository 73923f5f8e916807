"""The package's layers, as its imports draw them (README, "Layout"): no
module imports from a layer above its own, no two modules import each other,
and nothing outside the package imports one of its private names."""
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
    for top in ("tests", "tools", "examples"):
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
