"""The package's layers, as its imports draw them (docs/development.md,
"Layout"): no module imports from a layer above its own, no modules import
one another in a circle, no module imports or reads another module's private
names, and nothing outside the package imports one of its private names.

Every import counts: inside functions, under ``TYPE_CHECKING``, and by
string (``importlib.import_module``, ``__import__``)."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ltc_cache"
# Bottom to top; a module may import from its own rank or any lower one.
RANKS = {"ground": 0, "store": 1, "entries": 2, "graph": 3, "compile_backend": 4, "program": 5,
         "report": 6, "cli": 7, "top": 8}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"  # ltc_cache/__init__.py: the public API, over everything
    return parts[1] if parts[1] in RANKS else "ground"


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


_IMPORTERS = ("import_module", "__import__")


def _string_imports(module: str, path: Path, tree: ast.Module) -> list[tuple[str, int]]:
    """The ltc_cache modules ``tree`` imports by name: ``import_module`` or
    ``__import__`` of a string, absolute or relative to its package. Where the
    name is computed (``import_module(f".{name}", __package__)``), every
    string in the module that names a module counts: a table of names is
    what such a call reads."""
    strings = [(node, node.value) for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]

    def named(text: str, package: str) -> str | None:
        text = text.partition(":")[0]  # "module:NAME"
        if not text.strip("."):  # a bare "." of an f-string names nothing
            return None
        if text.startswith("."):
            level = len(text) - len(text.lstrip("."))
            parts = package.split(".")
            text = ".".join([*parts[: len(parts) - (level - 1)], text.lstrip(".")]).rstrip(".")
        return text if text in MODULES else None

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _IMPORTERS or not node.args:
            continue
        first, anchor = node.args[0], node.args[1] if len(node.args) > 1 else None
        # What a relative name is relative to: import_module's package.
        if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
            package = anchor.value
        else:
            named_by = getattr(anchor, "id", None)
            package = module if named_by == "__name__" else _package(module, path)
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            texts = [(first.value, node.lineno)]
        else:  # computed: whatever the module's strings name
            texts = [(text, node.lineno) for string, value in strings if string is not anchor
                     for text in (value, f".{value}")]
        found += [(target, line) for text, line in texts
                  if (target := named(text, package)) is not None]
    return found


def _imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """The ltc_cache modules ``path`` imports (type-checking imports
    included; with ``top_level_only`` the ones at the top of the module
    alone, else by string too)."""
    tree = ast.parse(path.read_text())
    module = _module(path)
    package = _package(module, path)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = [] if top_level_only else _string_imports(module, path, tree)
    for node in nodes:
        if not isinstance(node, ast.ImportFrom) or not node.level:
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
    assert RANKS[_layer("ltc_cache.program.frames")] > RANKS[_layer("ltc_cache.graph.graph_keys")]
    assert RANKS[_layer("ltc_cache.graph.cache")] > RANKS[_layer("ltc_cache.entries.entry_cache")]


# Every import in the package, function-level ones included, read once: the
# checks below see what runs when any function runs, not only at import time.
MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = _package(module, path).split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _uses(path: Path) -> tuple[set[str], list[str]]:
    """The ltc_cache modules ``path`` imports anywhere in it (type-checking
    and string imports included), and each private name of another ltc_cache module it
    imports or reads as ``module._name``."""
    return _uses_in(_module(path), path, path.read_text())


def _uses_in(module: str, path: Path, text: str) -> tuple[set[str], list[str]]:
    tree = ast.parse(text)
    targets = {target for target, _ in _string_imports(module, path, tree)}
    private: list[str] = []
    bound: dict[str, str] = {}  # a local name -> the ltc_cache module it is bound to
    for node in ast.walk(tree):
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
    # A type-checking import counts, a private name in it too.
    assert targets == {"ltc_cache.compile_backend.support", "ltc_cache.graph.cache",
                       "ltc_cache.program.precompile"}
    support = "ltc_cache.compile_backend.support"
    assert sorted(private) == [
        f"ltc_cache.compile_backend.plan:2 imports {support}._rules",
        "ltc_cache.compile_backend.plan:5 imports ltc_cache.program.precompile._hidden",
        f"ltc_cache.compile_backend.plan:8 reads {support}._table"]
    # So do imports by string: a name, or a table of names a computed one reads.
    targets, _ = _uses_in("ltc_cache.graph.fused.tier", PACKAGE / "graph" / "fused" / "tier.py", (
        "import importlib\n"
        "def f():\n    return importlib.import_module('ltc_cache.cli.output')\n"
        "def g():\n    return __import__('ltc_cache.cli.parser')\n"
        "TABLE = {'a': 'graph.replay:GRAPH', 'b': 'not a module'}\n"
        "def h(name):\n    return importlib.import_module(f'.{TABLE[name]}', 'ltc_cache')\n"))
    assert targets == {"ltc_cache.cli.output", "ltc_cache.cli.parser", "ltc_cache.graph.replay"}
    upward = PACKAGE / "store" / "base.py"
    assert _layer("ltc_cache.entries.kinds") == "entries"
    assert RANKS["store"] < RANKS["entries"] < RANKS["graph"]
    assert ("ltc_cache.cli.output", 3) in _string_imports("ltc_cache.store.base", upward, ast.parse(
        "import importlib\ndef f():\n    importlib.import_module('ltc_cache.cli.output')\n"))


# -- torch-private surfaces: one module each ---------------------------------------------------
# Each private torch surface the package stands on is touched (imported, or
# read as an attribute) by one module alone, which says which torch it was
# written against; tests/common/test_torch_private.py pins what it uses.
# ``within``: the part of the package held to it.


@dataclasses.dataclass(frozen=True)
class Surface:
    name: str
    owner: str
    torch_modules: tuple[str, ...]
    within: str = "ltc_cache"


SURFACES = [
    Surface("LTC bindings and lazy internals", "ltc_cache.graph.lazy_bindings",
            ("torch._C._lazy", "torch._C._lazy_ts_backend", "torch._lazy", "torch._sync",
             "torch._is_functional_tensor")),
    Surface("AOTAutograd internals, fake tensors and dispatch modes",
            "ltc_cache.compile_backend.aot_autograd",
            ("torch._functorch", "functorch", "torch._dynamo.backends.common",
             "torch._guards", "torch.compiler._compile_session_context", "torch._subclasses",
             "torch.utils._python_dispatch", "torch._C.DispatchKeySet")),
    Surface("AOTInductor", "ltc_cache.graph.fused.aoti",
            ("torch._inductor", "torch._C._aoti", "torch._C._GLIBCXX_USE_CXX11_ABI",
             "torch.compiler._is_exporting_flag")),
    Surface("TorchScript IR", "ltc_cache.graph.torchscript_ir",
            tuple(f"torch._C.{name}" for name in (
                "parse_ir", "parse_schema", "_create_function_from_graph", "_jit_pass_dce",
                "_jit_pass_constant_pooling", "_get_graph_executor_optimize",
                "_set_graph_executor_optimize", "Graph", "Node", "Value", "TensorType",
                "ListType", "BoolType", "Type"))),
    Surface("the CPU probes Inductor's pick reads", "ltc_cache.graph.fused.cpu_isa",
            tuple(f"torch.cpu._is_{probe}_supported" for probe in (
                "avx2", "avx512", "vnni", "avx512_bf16", "amx_tile", "amx_fp16"))),
    Surface("FX and ATen operators", "ltc_cache.fx_ops",
            ("torch._ops", "torch.utils._pytree", "torch._C._dispatch_get_all_op_names",
             "torch._C._DisablePythonDispatcher", "torch._decomp", "torch._prims",
             "torch.fx.graph._BoxedCodeGen", "torch.fx._lazy_graph_module",
             "torch.nn.utils.stateless._reparametrize_module")),
    Surface("Dynamo package and precompile", "ltc_cache.dynamo_package",
            ("torch._dynamo.package", "torch._dynamo.aot_compile",
             "torch._dynamo.aot_compile_types", "torch._dynamo.convert_frame",
             "torch._dynamo.eval_frame", "torch._dynamo.output_graph",
             "torch._dynamo.bytecode_transformation", "torch._dynamo.symbolic_convert",
             "torch._dynamo.side_effects", "torch._dynamo.variables", "torch._C._dynamo",
             "torch._dynamo.types", "torch._dynamo.config", "torch._dynamo.exc",
             "torch._dynamo.utils", "torch._logging", "torch.fx._graph_pickler",
             "torch.nn.Module._call_impl", "torch.nn.Module._wrapped_call_impl")),
    Surface("Dynamo guards", "ltc_cache.program.guards",
            ("torch._dynamo.guards", "torch._dynamo.source")),
]


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """``a.b.c`` with ``a`` resolved through the names imports bind."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    return ".".join([bound[node.id], *reversed(parts)])


def torch_touches(text: str) -> set[tuple[str, int]]:
    """Each torch (or functorch) module or attribute ``text`` imports or
    reads, as a dotted name, with its line."""
    tree = ast.parse(text)
    bound: dict[str, str] = {}
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add((alias.name, node.lineno))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add((node.module, node.lineno))
            for alias in node.names:
                found.add((f"{node.module}.{alias.name}", node.lineno))
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node, bound)
            if name is not None:
                found.add((name, node.lineno))
    return {(name, line) for name, line in found
            if name.partition(".")[0] in ("torch", "functorch")}


def _in(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in modules)


@pytest.mark.parametrize("surface", SURFACES, ids=[s.name for s in SURFACES])
def test_each_private_torch_surface_is_touched_by_its_module_alone(surface):
    assert surface.owner in MODULES, f"{surface.owner} does not exist"
    owner_text = MODULES[surface.owner].read_text()
    assert "tests/common/test_torch_private.py" in owner_text and "torch 2." in owner_text, \
        f"{surface.owner}'s docstring names neither its torch nor its pins"
    elsewhere: dict[str, str] = {}  # module:line -> the shortest name touched there
    for module, path in MODULES.items():
        if module == surface.owner or not (module == surface.within
                                           or module.startswith(f"{surface.within}.")):
            continue
        for name, line in torch_touches(path.read_text()):
            place = f"{module}:{line}"
            if _in(name, surface.torch_modules) and (
                    place not in elsewhere or len(name) < len(elsewhere[place])):
                elsewhere[place] = name
    assert not elsewhere, sorted(f"{place} {name}" for place, name in elsewhere.items())


def test_the_surface_check_sees_every_way_in():
    text = ('"""torch._lazy in a docstring is no use."""\n'
            "import torch\n"
            "import torch._lazy.metrics as metrics\n"
            "from torch import _inductor\n"
            "from torch._dynamo import package\n"
            "def f(x):\n"
            "    from torch._functorch import config\n"
            "    return torch._C._lazy._get_force_fallback(), torch._sync(x), config.patch\n")
    touched = torch_touches(text)
    names = {name for name, _ in touched}
    assert ("torch._lazy.metrics", 3) in touched and "torch._inductor" in names
    assert "torch._dynamo.package" in names and ("torch._C._lazy", 8) in touched
    assert ("torch._sync", 8) in touched and ("torch._functorch.config.patch", 8) in touched
    assert not any(line == 1 for _, line in touched)
    assert _in("torch._C._lazy._get_force_fallback", ("torch._C._lazy",))
    assert not _in("torch._C._lazy_ts_backend", ("torch._C._lazy",))


def _private_torch(name: str) -> bool:
    """Whether ``name`` is private to torch: a part of it starts with an
    underscore. An operator's name is not (``torch.ops.aten._unsafe_view``
    is an ATen op, called as the graph calls it)."""
    return not name.startswith("torch.ops.") and any(_private(p) for p in name.split("."))


def stray_private_torch_names(module: str, text: str) -> list[str]:
    """Each private torch name ``module`` touches that is not its own: in no
    surface, or in one another module owns. A name touched only as the
    parent of longer ones (``torch._C`` of ``torch._C._lazy``) counts as
    the longer ones; one touched bare (``hasattr(torch._C, "_aoti")``)
    belongs to the owners of the surfaces under it."""
    by_line: dict[int, set[str]] = {}
    for name, line in torch_touches(text):
        by_line.setdefault(line, set()).add(name)
    stray = []
    for line, names in sorted(by_line.items()):
        for name in sorted(names):
            if not _private_torch(name) or any(o.startswith(f"{name}.") for o in names):
                continue
            owners = {s.owner for s in SURFACES if _in(name, s.torch_modules)} or {
                s.owner for s in SURFACES
                if any(m.startswith(f"{name}.") for m in s.torch_modules)}
            if module not in owners:
                stray.append(f"{module}:{line} {name} (owned by {sorted(owners) or 'nothing'})")
    return stray


def test_every_private_torch_name_is_touched_by_its_owner_alone():
    stray = [s for module, path in MODULES.items()
             for s in stray_private_torch_names(module, path.read_text())]
    assert not stray, stray


def test_each_private_torch_name_has_one_owner():
    owners: dict[str, set[str]] = {}
    for surface in SURFACES:
        for name in surface.torch_modules:
            owners.setdefault(name, set()).update(
                s.owner for s in SURFACES if _in(name, s.torch_modules))
    shared = {name: sorted(o) for name, o in owners.items() if len(o) > 1}
    assert not shared, shared


def test_the_owner_check_sees_a_stray_private_name():
    text = ("import torch\n"
            "from torch._dynamo.exc import Unsupported\n"
            "def f(node):\n"
            "    return isinstance(node.target, torch._ops.OpOverload), torch.ops.aten._foo\n"
            "def g():\n"
            "    return torch._C._lazy._get_force_fallback(), torch._private_thing\n")
    stray = stray_private_torch_names("ltc_cache.program.example", text)
    assert stray == [
        "ltc_cache.program.example:2 torch._dynamo.exc.Unsupported "
        "(owned by ['ltc_cache.dynamo_package'])",
        "ltc_cache.program.example:4 torch._ops.OpOverload (owned by ['ltc_cache.fx_ops'])",
        "ltc_cache.program.example:6 torch._C._lazy._get_force_fallback "
        "(owned by ['ltc_cache.graph.lazy_bindings'])",
        "ltc_cache.program.example:6 torch._private_thing (owned by nothing)"], stray
    assert stray_private_torch_names("ltc_cache.fx_ops", text.replace(
        "torch._private_thing", "0").replace("torch._C._lazy._get_force_fallback()", "0")
        .replace("from torch._dynamo.exc import Unsupported", "")) == []
    assert not stray_private_torch_names(
        "ltc_cache.graph.fused.aoti", "import torch\nok = hasattr(torch._C, '_aoti')\n")
    assert stray_private_torch_names(
        "ltc_cache.store.disk", "import torch\nok = hasattr(torch._C, '_aoti')\n")
