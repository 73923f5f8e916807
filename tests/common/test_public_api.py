"""The public API: ``ltc_cache.__all__`` (names resolved lazily, on first
use), what type checkers see of it, what the README documents of it, and
the exceptions, which all subclass ``ltc_cache.LtcCacheError`` besides the
builtin each refines."""
from __future__ import annotations

import ast
import builtins
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ltc_cache
from ltc_cache import LtcCacheError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ltc_cache"
README = ROOT / "README.md"

# Exported names the README does not mention (yet): documenting one means
# taking it off this list.
NOT_IN_README = {"EntryError", "LockTimeout", "LtcCacheError", "UncacheableGraph",
                 "default_cache"}

# Every exception class the package defines, with the builtin it subclassed
# before LtcCacheError was added: each must still subclass it.
EXCEPTIONS = [
    ("ltc_cache.errors", "EntryError", ValueError),
    ("ltc_cache.errors", "LockTimeout", TimeoutError),
    ("ltc_cache.errors", "UncacheableGraph", TypeError),
    ("ltc_cache.errors", "LtcUnavailable", RuntimeError),
    ("ltc_cache.errors", "Unportable", ValueError),
    ("ltc_cache.errors", "NotForThisCpu", ValueError),
    ("ltc_cache.errors", "GraphNotExtractable", RuntimeError),
    ("ltc_cache.errors", "RememberedFailure", RuntimeError),
    ("ltc_cache.cli.output", "UsageError", Exception),
    ("ltc_cache.compile_backend.graph_wire", "PlanError", ValueError),
    ("ltc_cache.compile_backend.plan_library", "NoLibrary", Exception),
    ("ltc_cache.compile_backend.plan_rng", "Unrepeatable", Exception),
    ("ltc_cache.compile_backend.specialize", "Unspecializable", ValueError),
    ("ltc_cache.graph.fused.aoti", "UnexpectedPackage", RuntimeError),
    ("ltc_cache.graph.fused.build", "FuseFailed", RuntimeError),
    ("ltc_cache.program.loaded", "GrowingLayout", Exception),
    ("ltc_cache.report.selection", "AmbiguousKey", ValueError),
    ("ltc_cache.store.bundle", "BundleError", ValueError),
    ("ltc_cache.store.safety", "UnsafeDirectory", PermissionError),
    ("ltc_cache.store.tiers", "NoCache", FileNotFoundError),
]
# Exceptions that must not be Exceptions: the fused worker's timeout is a
# BaseException so that build_entry's ``except Exception`` lets it through.
NOT_LTC_CACHE_ERRORS = {("ltc_cache.graph.fused.deadline", "CompileTimeout")}

_BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                       if isinstance(value, type) and issubclass(value, BaseException)}


def _type_checking_imports() -> dict[str, tuple[str, str | None]]:
    """What ``ltc_cache/__init__.py`` imports for type checkers: each name,
    with its module (relative to the package) and the name it is bound as."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    found: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                assert isinstance(inner, ast.ImportFrom) and inner.level == 1, ast.unparse(inner)
                for alias in inner.names:
                    assert alias.name not in found, f"{alias.name} imported twice"
                    found[alias.name] = (inner.module or "", alias.asname)
    return found


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_all_has_no_duplicates():
    assert len(ltc_cache.__all__) == len(set(ltc_cache.__all__)), ltc_cache.__all__
    assert all(isinstance(name, str) for name in ltc_cache.__all__)


@pytest.mark.parametrize("name", ltc_cache.__all__)
def test_every_exported_name_resolves(name):
    module, _ = _type_checking_imports()[name]
    value = getattr(ltc_cache, name)
    assert value is getattr(importlib.import_module(f"ltc_cache.{module}"), name)
    namespace: dict[str, object] = {}
    exec(f"from ltc_cache import {name}", namespace)
    assert namespace[name] is value
    assert name in dir(ltc_cache)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        ltc_cache.no_such_name  # noqa: B018


def test_star_import_gives_exactly_all():
    namespace: dict[str, object] = {}
    exec("from ltc_cache import *", namespace)
    del namespace["__builtins__"]
    assert sorted(namespace) == sorted(ltc_cache.__all__)


def test_type_checkers_see_exactly_all_as_explicit_re_exports():
    """The imports under ``if TYPE_CHECKING`` are what type checkers see of
    the lazy names: the same names as ``__all__``, each ``X as X``."""
    imports = _type_checking_imports()
    assert sorted(imports) == sorted(ltc_cache.__all__)
    assert [name for name, (_, asname) in imports.items() if asname != name] == []


def test_exported_names_are_in_the_readme():
    readme = README.read_text()
    missing = {name for name in ltc_cache.__all__ if not re.search(rf"\b{name}\b", readme)}
    assert missing == NOT_IN_README, (
        f"not in README.md: {sorted(missing - NOT_IN_README)}; "
        f"in it now, take off NOT_IN_README: {sorted(NOT_IN_README - missing)}")


def test_importing_the_package_and_its_errors_leaves_torch_alone():
    """The lazy names: the package and its exceptions import no torch."""
    code = ("import sys, ltc_cache; ltc_cache.LtcCacheError; ltc_cache.EntryError; "
            "ltc_cache.LockTimeout; ltc_cache.UncacheableGraph; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "False"


def test_ltc_cache_error_is_a_plain_exception():
    assert LtcCacheError.__mro__ == (LtcCacheError, Exception, BaseException, object)
    assert LtcCacheError.__module__ == "ltc_cache.errors"
    assert LtcCacheError.__doc__


@pytest.mark.parametrize(("module", "name", "builtin"), EXCEPTIONS,
                         ids=[f"{module}.{name}" for module, name, _ in EXCEPTIONS])
def test_every_exception_subclasses_ltc_cache_error_and_its_builtin(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert cls.__module__ == module
    assert issubclass(cls, LtcCacheError)
    assert issubclass(cls, builtin)
    # Nothing else changed: without ltc_cache's own classes (LtcCacheError,
    # and EntryError for its refinements), the MRO is what it was.
    assert [c for c in cls.__mro__[1:] if not c.__module__.startswith("ltc_cache")] \
        == list(builtin.__mro__)


def test_exported_exceptions_are_listed():
    exported = {name for name in ltc_cache.__all__
                if isinstance(getattr(ltc_cache, name), type)
                and issubclass(getattr(ltc_cache, name), BaseException)}
    assert exported == {"EntryError", "LockTimeout", "LtcCacheError", "UncacheableGraph"}
    for module, name, _ in EXCEPTIONS:
        if name in exported:
            assert getattr(ltc_cache, name) is getattr(importlib.import_module(module), name)


def test_every_exception_class_in_the_package_is_listed():
    """Source, not imports: a class (at any depth) one of whose bases is a
    builtin exception, LtcCacheError or a listed exception."""
    listed = {(module, name) for module, name, _ in EXCEPTIONS}
    exception_names = _BUILTIN_EXCEPTIONS | {"LtcCacheError"} | {name for _, name in listed}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(base).rpartition(".")[2] in exception_names
                    for base in node.bases):
                found.add((_module(path), node.name))
    found.discard(("ltc_cache.errors", "LtcCacheError"))
    assert found - NOT_LTC_CACHE_ERRORS == listed
