"""The per-call check of a program reads attribute dictionaries without
copying them (``ltc_cache.program.check_exprs``), and reads the same values."""

from __future__ import annotations

import pytest

from ltc_cache.program.check_exprs import without_dict_copies


class Base:
    flag = True


class Child(Base):
    pass


@pytest.mark.parametrize("expr, cheaper", [
    ("dict(type(L['c']).__mro__[1].__dict__)['flag']", "type(L['c']).__mro__[1].__dict__['flag']"),
    ("dict(L['c'].__dict__)['x'] == dict(type(L['c']).__dict__)['y']",
     "L['c'].__dict__['x'] == type(L['c']).__dict__['y']"),
    ("dict(dict(G['m'].__dict__)['C'].__dict__)['k']", "G['m'].__dict__['C'].__dict__['k']"),
    ("dict(f(')').__dict__)['k']", "f(')').__dict__['k']"),
    # Left alone: not a read of one entry, or not the builtin dict.
    ("dict(L['c'].__dict__).keys()", "dict(L['c'].__dict__).keys()"),
    ("mydict(L['c'].__dict__)['x']", "mydict(L['c'].__dict__)['x']"),
    ("dict(L['c'].items)['x']", "dict(L['c'].items)['x']"),
    ("L['c'].x", "L['c'].x"),
])
def test_dict_copies_are_dropped_where_they_read_one_entry(expr, cheaper):
    assert without_dict_copies(expr) == cheaper


@pytest.mark.parametrize("expr", [
    "dict(type(L['c']).__mro__[1].__dict__)['flag']",
    "dict(L['c'].__dict__)['x']",
    "dict(type(L['c']).__dict__)['flag']",  # missing: the same KeyError
])
def test_the_cheaper_expression_reads_the_same_value(expr):
    child = Child()
    child.x = 3
    scope = {"L": {"c": child}}

    def value(text: str):
        try:
            return eval(text, {}, scope)  # the test's own expressions
        except KeyError as exc:
            return KeyError, exc.args

    assert value(without_dict_copies(expr)) == value(expr)
