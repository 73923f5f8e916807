"""One vocabulary of entry kinds (ltc_cache/entries/kinds.py): every kind the
package builds or compares an entry's kind with is an EntryKind, whose
values are the strings stored entries and ``ltc-cache`` output carry."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import msgpack

from ltc_cache.entries import wire
from ltc_cache.entries.kinds import KINDS, EntryKind

PACKAGE = Path(__file__).resolve().parents[2] / "ltc_cache"
# Today's strings, as stored: changing one orphans every stored entry of it.
STORED = ("graph", "negative", "plan", "program", "fused")


def test_the_values_are_the_stored_strings():
    assert [kind.value for kind in EntryKind] == list(STORED)
    assert tuple(EntryKind) == KINDS and wire.KINDS == KINDS
    assert (EntryKind.GRAPH, EntryKind.NEGATIVE, EntryKind.PLAN, EntryKind.PROGRAM,
            EntryKind.FUSED) == STORED


def test_a_kind_is_its_string_wherever_it_goes():
    for kind, text in zip(EntryKind, STORED, strict=True):
        assert isinstance(kind, str) and kind == text and hash(kind) == hash(text)
        assert str(kind) == f"{kind}" == format(kind) == text
        assert "%s" % kind == text  # as logging formats it  # noqa: UP031
        assert f"{kind:<10}" == f"{text:<10}"
        assert json.dumps({kind: kind}) == json.dumps({text: text})
        assert msgpack.packb({kind: kind}) == msgpack.packb({text: text})
        assert {text: 1}[kind] == 1 and {kind: 1}[text] == 1
        assert EntryKind(text) is kind


def _kind_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants an entry's kind is built with or compared with:
    ``kind=...`` arguments and ``kind: str = ...`` defaults, and the
    operands of comparisons with something named ``kind`` (``x.kind``,
    ``kind``, ``summary.get("kind")``)."""

    def strings(node: ast.AST) -> list[ast.Constant]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [c for elt in node.elts for c in strings(elt)]
        return []

    def names_kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "kind"
        if isinstance(node, ast.Attribute):
            return node.attr == "kind"
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and bool(node.args)
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind")

    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        kind_argument = isinstance(node, ast.keyword) and node.arg == "kind"
        kind_default = isinstance(node, ast.AnnAssign) and names_kind(node.target)
        if (kind_argument or kind_default) and node.value:
            found += strings(node.value)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(names_kind(op) for op in operands):
                found += [c for op in operands for c in strings(op)]
    return [(c.lineno, c.value) for c in found]


# Source kinds (entries/layout.py) and other things called "kind" that are not
# an entry's: where a kind string is one of these, it is not an entry kind.
NOT_ENTRY_KINDS = {"arg", "attr", "const", "out", "none", "value", "in", "forward",
                   "backward", "local", "same", "eq", "type", "len", "object", "node",
                   "tuple", "device", "op", "higher_order", "training", "inference",
                   "graph break"}


def test_no_module_spells_an_entry_kind_as_a_string():
    # Every entry kind in the package is an EntryKind member: a string
    # literal that is one of the kinds' values is one that was missed.
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "kinds.py":
            continue
        for line, text in _kind_literals(ast.parse(path.read_text())):
            if text in STORED:
                spelled.append(f"{path.relative_to(PACKAGE)}:{line} {text!r}")
            else:
                assert text in NOT_ENTRY_KINDS, f"{path.relative_to(PACKAGE)}:{line} {text!r}"
    assert not spelled, spelled


def test_the_check_sees_kind_literals():
    tree = ast.parse('Entry(kind="plan")\nif entry.kind != "fused": pass\n'
                     'x = summary.get("kind") == "graph"\nif kind in ("negative", "arg"): pass\n'
                     'class E:\n    kind: str = "program"\n'
                     'ok = entry.kind == EntryKind.GRAPH\n')
    assert sorted(_kind_literals(tree)) == [(1, "plan"), (2, "fused"), (3, "graph"),
                                            (4, "arg"), (4, "negative"), (6, "program")]


def test_an_entry_of_a_member_is_stored_as_one_of_its_string():
    from ltc_cache.entries.entry import Entry, decode, encode

    for kind, text in zip(EntryKind, STORED, strict=True):
        made = Entry("0" * 64, "", (), (), (), {"graph_name": "g"}, kind=kind, payload={"a": 1})
        spelled = Entry("0" * 64, "", (), (), (), {"graph_name": "g"}, kind=text,
                        payload={"a": 1})
        assert encode(made) == encode(spelled)
        assert decode(encode(made)).kind == text
    assert Entry("0" * 64, "", (), (), ()).kind == "graph"
