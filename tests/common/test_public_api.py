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
    ("ltc_cache.errors", "UsageError", Exception),
    ("ltc_cache.errors", "PlanError", ValueError),
    ("ltc_cache.errors", "NoLibrary", Exception),
    ("ltc_cache.errors", "Unrepeatable", Exception),
    ("ltc_cache.errors", "Unspecializable", ValueError),
    ("ltc_cache.errors", "UnexpectedPackage", RuntimeError),
    ("ltc_cache.errors", "FuseFailed", RuntimeError),
    ("ltc_cache.errors", "GrowingLayout", Exception),
    ("ltc_cache.errors", "AmbiguousKey", ValueError),
    ("ltc_cache.errors", "BundleError", ValueError),
    ("ltc_cache.errors", "UnsafeDirectory", PermissionError),
    ("ltc_cache.errors", "NoCache", FileNotFoundError),
    # What was raised as the builtin itself, before each had a class.
    ("ltc_cache.errors", "BadArgument", ValueError),
    ("ltc_cache.errors", "WrongType", TypeError),
    ("ltc_cache.errors", "NoSuchEntry", KeyError),
    ("ltc_cache.errors", "KindNotRegistered", KeyError),
    ("ltc_cache.errors", "ReadOnlyStore", PermissionError),
    ("ltc_cache.errors", "UnsafeProgramKey", PermissionError),
    ("ltc_cache.errors", "StoreTimeout", TimeoutError),
    ("ltc_cache.errors", "MissingDependency", ImportError),
    ("ltc_cache.errors", "RewriteRefused", ValueError),
    ("ltc_cache.errors", "LayoutChanged", RuntimeError),
    ("ltc_cache.errors", "UnpickledForward", RuntimeError),
    ("ltc_cache.errors", "Unreplaceable", AttributeError),
    ("ltc_cache.errors", "StoreUnreachable", ConnectionError),
    ("ltc_cache.errors", "NotACacheDirectory", NotADirectoryError),
]
# Exceptions that must not be Exceptions: the fused worker's timeout is a
# BaseException so that build_entry's ``except Exception`` lets it through.
NOT_LTC_CACHE_ERRORS = {("ltc_cache.errors", "CompileTimeout")}

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


def test_every_exception_class_lives_in_errors_py():
    """One place for every exception the package defines; where the public
    API exports one, ``ltc_cache`` imports it from there."""
    defined_elsewhere = [f"{_module(path)}.{node.name}" for path in PACKAGE.rglob("*.py")
                         if path.name != "errors.py"
                         for node in ast.walk(ast.parse(path.read_text()))
                         if isinstance(node, ast.ClassDef) and any(
                             ast.unparse(base).rpartition(".")[2] in _BUILTIN_EXCEPTIONS
                             | {"LtcCacheError"} | {name for _, name, _ in EXCEPTIONS}
                             for base in node.bases)]
    assert not defined_elsewhere, defined_elsewhere


# Builtins a module may raise as they are: an abstract method's, an
# invariant's, and the attribute protocol's (a module's or a class's
# ``__getattr__``, which Python asks for an AttributeError).
_RAISED_AS_THEY_ARE = {"NotImplementedError", "AssertionError"}
_PROTOCOL = {"__getattr__": "AttributeError"}


def builtin_raises(module: str, text: str) -> list[str]:
    """Each ``raise`` in ``text`` of a builtin exception class itself, where
    an LtcCacheError subclass of it (tests/common/test_public_api.py's
    EXCEPTIONS) says what failed. Re-raising a caught exception is fine."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = raised.id if isinstance(raised, ast.Name) else None
            if name in _BUILTIN_EXCEPTIONS and name not in _RAISED_AS_THEY_ARE \
                    and _PROTOCOL.get(function or "") != name:
                found.append(f"{module}:{node.lineno} raises {name}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(text), None)
    return found


def test_no_module_raises_a_builtin_exception_itself():
    found = [use for path in PACKAGE.rglob("*.py")
             for use in builtin_raises(_module(path), path.read_text())]
    assert not found, found


def test_the_raise_check_sees_builtins_and_leaves_the_rest():
    text = ("def f(x):\n"
            "    if x:\n        raise ValueError('bad')\n"
            "    raise KeyError\n"
            "def g():\n"
            "    try:\n        pass\n    except OSError as exc:\n        raise exc\n"
            "    raise BadArgument('fine')\n"
            "def __getattr__(name):\n    raise AttributeError(name)\n"
            "def h():\n    raise NotImplementedError\n")
    assert builtin_raises("m", text) == ["m:3 raises ValueError", "m:4 raises KeyError"]
