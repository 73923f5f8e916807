"""The guards of a program that Dynamo cannot save (object identities, and
the guards reached through such objects), and the portable checks that stand
in for them: what each object is (:func:`.describe.describe`), compared on
load and, as one generated function, on every call.

Dynamo's guards (``torch._dynamo.guards``, ``torch._dynamo.source``) are
this module's surface: every use of them in ltc_cache.program goes through
it (:func:`state_pickler` for the modules that patch the guard state's
pickler). Written against torch 2.13.0; each private piece is pinned in
``tests/common/test_torch_private.py`` (section "Dynamo's guards"), which is
where a torch upgrade breaks first."""

from __future__ import annotations

import builtins
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import EntryError, Unportable, first_line
from .check_exprs import checks_code, marshalled, source_digest, without_dict_copies
from .checks import OBJECT, Aliasing, identity_check
from .describe import describe

# Globals Dynamo installs under a name made of an object id and the compile
# id (``OutputGraph.install_global_by_id``: ``f"{prefix}_{id(value)}_c{n}"``;
# ``type(x)`` of a tensor reads ``torch.Tensor`` through one). The name
# exists only in the capturing process.
_BY_ID_GLOBAL = re.compile(r"G\['(\w*_\d{6,}_c\d+)'\]")


def portable_expression(expr: str, globals_: Mapping[str, Any]) -> str:
    """``expr`` (a guard's source) with every global that Dynamo named
    after an object id replaced by an expression that finds the same
    object in any process: ``__import__(name)`` for a module. Raises
    Unportable where such a global holds anything else (its name, and so
    the check, would hold in this process only)."""

    def stand_in(match: re.Match[str]) -> str:
        name = match.group(1)
        value = globals_.get(name)
        if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value:
            return f"__import__({value.__name__!r}, fromlist=['_'])"
        raise Unportable(f"a guard names {name}, a global named after an object id "
                         f"({type(value).__name__})")

    return _BY_ID_GLOBAL.sub(stand_in, expr)


def names_process_specific(expr: str) -> bool:
    """Whether ``expr`` names a global named after an object id."""
    return _BY_ID_GLOBAL.search(expr) is not None


_BUILTINS_DICT = re.compile(r"G\['(__builtins_dict___\d+)'\]")


_UNSERIALIZABLE = ("DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH",
                   "MODULE_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE")


def _guard_closure_vars() -> dict[str, Any]:
    from torch._dynamo.guards import _get_closure_vars

    return dict(_get_closure_vars())


def _global_root(source: Any) -> str | None:
    from torch._dynamo.source import get_global_source_name

    return get_global_source_name(source)


def state_pickler() -> Any:
    """Dynamo's ``GuardsStatePickler``, which pickles a program's guard
    state: patched while a program is captured
    (:func:`.capture.shared_constants_saved`) and loaded
    (:func:`.load_costs.one_fake_mode`)."""
    from torch._dynamo.guards import GuardsStatePickler

    return GuardsStatePickler


def checked_by(check: Callable[[Mapping[str, Any]], bool], said: str) -> Any:
    """A Dynamo guard manager whose one guard is ``check(f_locals)``
    (``said``: how Dynamo's recompilation reasons name it): what a frame
    served by :func:`ltc_cache.dynamo_package.serve_frames` is checked by."""
    from torch._dynamo.guards import GuardManagerWrapper

    manager = GuardManagerWrapper()
    manager.root.add_lambda_guard(check, [said], None)
    # What Dynamo's recompilation reasons read of a manager whose guard failed.
    manager.global_scope, manager.closure_vars = {"G": {}}, {}
    manager.args, manager.code_parts, manager.verbose_code_parts = [], [said], [said]
    return manager


class GuardFilter:
    """The ``guard_filter_fn`` of a capture. Keeps every guard Dynamo can
    save; each one it cannot (an object identity), and each guard reached
    through such an object, becomes a portable check instead
    (:mod:`.checks`). A guard that can be neither
    makes the program unportable (it is not stored)."""

    def __init__(self, fn_globals: Mapping[str, Any]) -> None:
        self.checks: list[list[Any]] = []
        self.globals: list[str] = []
        self.unportable: str | None = None
        # Where Dynamo installs the globals it names after object ids.
        self._fn_globals = fn_globals
        self._functions: set[str] = set()

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        self.checks, self.unportable = [], None
        seen: list[Any] = []  # the objects ``object`` checks compare, in order
        # A guard through a global named after an object id would never hold
        # in another process, saved or not: a portable check stands in for it.
        dropped = {e.orig_guard.name for e in entries
                   if self._unserializable(e) or names_process_specific(e.orig_guard.name)}
        # Guards reached through a function Dynamo cannot save (its closure,
        # its defaults) do not load without it: checked here too. Through a
        # module or class they load (those are saved by name) and stay.
        functions = {e.orig_guard.name for e in entries
                     if e.guard_type in ("CLOSURE_MATCH", "FUNCTION_MATCH")}
        self._functions = functions
        keep, direct = [], set()
        for e in entries:
            guard = e.orig_guard
            if guard.name not in dropped and not self._beneath(guard.originating_source,
                                                               functions):
                keep.append(True)
                # Where the guard came from (for messages only) is formatted
                # for every guard as it is built; on load that was a fifth
                # of the time for a 128-layer model.
                guard.stack = guard.user_stack = None
                root = _global_root(guard.originating_source)
                if root and not root.startswith(("__import_", "__builtins_dict__")):
                    direct.add(root)
                continue
            if e.guard_type == "HASATTR" and guard.name in dropped:
                # The check that stands in for the other guard of this name
                # reads the attribute: it fails where the attribute is gone.
                keep.append(False)
                continue
            try:
                expr = portable_expression(guard.name, self._fn_globals)
                if e.guard_type == "DUPLICATE_INPUT" and expr != guard.name:
                    # "this is that" where this is a module's attribute
                    # reached through the module's name: the other source's
                    # own guards say what it is.
                    keep.append(False)
                    continue
                self.checks.append(identity_check(expr, e.guard_type,
                                                  tuple(e.derived_guard_types), e.has_value,
                                                  e.value, seen))
                keep.append(False)
            except Unportable as exc:
                if self._saved_beside(e):
                    keep.append(True)
                    continue
                self.unportable = self.unportable or str(exc)
                keep.append(True)  # saving it then fails: no program is stored
        self.globals = sorted(direct)
        return keep

    def _saved_beside(self, e: Any) -> bool:
        """Whether Dynamo saves this guard though another guard of its
        source is checked here: a guard it can serialise (a config's
        ``NOT_PRESENT_IN_GENERIC_DICT``, read through the pickled scope on
        load) on a source reached by name."""
        guard = e.orig_guard
        return (not self._unserializable(e) and not names_process_specific(guard.name)
                and not self._beneath(guard.originating_source, self._functions))

    @staticmethod
    def _unserializable(e: Any) -> bool:
        return (e.guard_type in _UNSERIALIZABLE
                or any(t in _UNSERIALIZABLE for t in e.derived_guard_types)
                or bool(getattr(e.orig_guard, "_unserializable", False)))

    @staticmethod
    def _beneath(source: Any, dropped: set[str]) -> bool:
        base = getattr(source, "base", None)
        while base is not None:
            if base.name in dropped:
                return True
            base = getattr(base, "base", None)
        return False


class Checks:
    """Portable checks, resolved against the first call (each object
    described as recorded), then one generated function that compares
    identities and values on every call."""

    def __init__(self, checks: Sequence[Any], compiled: Sequence[Any] = ()) -> None:
        """``compiled``: :func:`marshalled` code of the check sources, as a
        program entry stores it; ignored where malformed."""
        self._stored = {item[0]: item[1] for item in compiled
                        if isinstance(item, list | tuple) and len(item) == 2
                        and isinstance(item[0], str) and isinstance(item[1], bytes)}
        self._digests: list[str] = []  # of the sources resolve compiled
        parsed = []
        for check in checks:
            try:
                expr, kind, expected = check
            except (TypeError, ValueError):
                raise EntryError(f"program: malformed check {check!r:.80}") from None
            # One expression a line (they are compiled together, once).
            if not isinstance(expr, str) or "\n" in expr or "\r" in expr:
                raise EntryError(f"program: malformed check {check!r:.80}")
            if kind not in ("same", "eq", "type", "len", OBJECT):
                raise EntryError(f"program: unknown check kind {kind!r}")
            parsed.append((expr, kind, expected))
        self._checks = parsed
        self.builtins_dicts = {m.group(1) for expr, _, _ in parsed
                               for m in _BUILTINS_DICT.finditer(expr)}
        self.fast: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None

    def resolve(self, f_locals: Mapping[str, Any], f_globals: Mapping[str, Any]) -> str | None:
        """Compare every check on this call; None where all hold (and the
        per-call function is built), else the first that does not."""
        closure = _guard_closure_vars()
        # Every value in one compiled function (one compile, not one a check).
        getters = "".join(f"    try:\n        _out.append(({expr},))\n"
                          f"    except Exception as _e:\n        _out.append(_e)\n"
                          for expr, _, _ in self._checks)
        namespace = {**closure, "__builtins__": builtins}
        exec(self._code(f"def _values(L, G):\n    _out = []\n{getters}    return _out\n"),
             namespace)
        values = namespace["_values"](f_locals, f_globals)
        objects, lines = [], []
        aliasing = Aliasing()
        for (expr, kind, expected), got in zip(self._checks, values, strict=True):
            try:
                if isinstance(got, Exception):
                    raise got
                (value,) = got
                if kind == "len":
                    ok = len(value) == expected
                elif kind == OBJECT:
                    ok = aliasing.fits(value, expected)
                else:
                    ok = describe(type(value) if kind == "type" else value) == expected
            except Exception as exc:
                return f"{expr}: {type(exc).__name__}: {first_line(exc)}"
            if not ok:
                return f"{expr} is not what the program was made with"
            expr = without_dict_copies(expr)  # the same value, read without copying
            if kind in ("same", OBJECT):
                objects.append(value)
                lines.append(f"if ({expr}) is not _o[{len(objects) - 1}]: return False")
            elif kind == "type":
                objects.append(type(value))
                lines.append(f"if type({expr}) is not _o[{len(objects) - 1}]: return False")
            elif kind == "eq":
                objects.append(value)
                lines.append(f"_v = ({expr})")
                lines.append(f"if type(_v) is not type(_o[{len(objects) - 1}]) "
                             f"or _v != _o[{len(objects) - 1}]: return False")
            else:
                lines.append(f"if len({expr}) != {int(expected)}: return False")
        body = "\n".join(f"        {line}" for line in lines) or "        pass"
        source = ("def _check(L, G):\n    try:\n" + body +
                  "\n    except Exception:\n        return False\n    return True\n")
        namespace = {**closure, "__builtins__": builtins, "_o": objects}
        exec(self._code(source), namespace)
        self.fast = namespace["_check"]
        return None

    def _code(self, source: str) -> types.CodeType:
        self._digests.append(source_digest(source))
        return checks_code(source, self._stored)

    def compiled(self) -> list[list[Any]]:
        """The code :meth:`resolve` ran, marshalled for the program entry."""
        return marshalled(self._digests)
