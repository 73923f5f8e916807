"""Each entry kind's registration (ltc_cache/entries/kind_registry.py): every
kind has one, declared by the product that makes its entries (registered
when its module is imported, by the product's modules that make such
entries and by ltc_cache.report), with every handler; resolving them
imports no torch (``ls`` and ``stats`` resolve them); the
report and cli packages name no kind but the default one, and dispatch
instead; and each kind's handlers do on an entry of it what ``show``,
``verify`` and ``ls`` print (tests/cli compares the whole output)."""
from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import torch

from ltc_cache.entries.entry import Entry, encode
from ltc_cache.entries.kind_registry import (
    KindHandlers,
    KindView,
    ShowContext,
    handlers,
    handlers_of,
    register,
    registered,
    summarise,
)
from ltc_cache.entries.kinds import KINDS, EntryKind
from ltc_cache.entries.layout import Source, Update
from ltc_cache.errors import EntryError
from ltc_cache.graph.fused.library_entries import FUSED_FORMAT
from ltc_cache.graph.fused.platform import FUSED_VERSION
from ltc_cache.report import KIND_REGISTRATIONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ltc_cache"
# The layers a registration may live in: the products, never the ground,
# report/ or cli/ (which dispatch through it).
PRODUCTS = ("graph", "compile_backend", "program")


def test_every_kind_has_a_registration_with_every_handler():
    assert set(registered()) == set(EntryKind)  # ltc_cache.report imported them all
    assert {module.__name__ for module in KIND_REGISTRATIONS} == {
        handled.show.__module__ for handled in registered().values()}
    for kind in KINDS:
        handled = handlers(kind)
        assert isinstance(handled, KindHandlers) and handled.kind is kind
        for name in ("verify", "show", "summarise"):
            assert callable(getattr(handled, name)), (kind, name)
        if handled.parts is not None:
            assert handled.parts.field and len(set(handled.parts.names)) > 1
        assert handlers(kind.value) is handled  # the stored string finds it too


def test_registrations_live_in_the_products_and_import_no_torch():
    for kind, handled in registered().items():
        # Its registration module, named after its kind: the module of its handlers.
        module = handled.show.__module__
        assert module.split(".")[1] in PRODUCTS and module.endswith("_kind"), (kind, module)
        assert handled in vars(sys.modules[module]).values(), (kind, module)
        assert (PACKAGE.parent / Path(*module.split("."))).with_suffix(".py").is_file()
    assert _last_line_of("import sys\nimport ltc_cache.report\n"
                         "from ltc_cache.entries.kinds import KINDS\n"
                         "from ltc_cache.entries.kind_registry import handlers\n"
                         "[handlers(kind) for kind in KINDS]\n"
                         "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
                         ) == "[]"


def _last_line_of(code: str) -> str:
    """What a fresh interpreter running ``code`` prints last."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_each_product_registers_the_kinds_it_makes_when_imported():
    assert _last_line_of("import ltc_cache.entries.entry_cache\n"
                         "from ltc_cache.entries.kind_registry import registered\n"
                         "def kinds(): return sorted(str(kind) for kind in registered())\n"
                         "seen = [kinds()]\n"
                         "import ltc_cache.graph.cache\nseen.append(kinds())\n"
                         "import ltc_cache.compile_backend.plan_compile\nseen.append(kinds())\n"
                         "import ltc_cache.program.single_graph\nseen.append(kinds())\n"
                         "print(seen)") == str([
        [], ["fused", "graph", "negative"], ["fused", "graph", "negative", "plan"],
        ["fused", "graph", "negative", "plan", "program"]])


def test_a_kind_has_one_registration():
    handled = handlers(EntryKind.GRAPH)
    assert register(handled) is handled  # the same one again: nothing changes
    with pytest.raises(TypeError, match="registered already"):
        register(KindHandlers(EntryKind.GRAPH, verify=handled.verify, show=handled.show,
                              summarise=handled.summarise))
    assert handlers(EntryKind.GRAPH) is handled


def test_what_is_no_kind_has_no_handlers():
    for text in (None, "unreadable", "graphs", 3, ["graph"], {"graph": 1}):
        assert handlers_of(text) is None
    with pytest.raises(KeyError):
        handlers("unreadable")


def _kinds_named(path: Path) -> set[str]:
    """The EntryKind members a module names (``EntryKind.PLAN``)."""
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "EntryKind"}


# `fuse` is about fused entries: the one kind report/fused.py looks for.
NAMED_BY_PURPOSE = {"report/fused.py": {"FUSED"}}


def test_report_and_cli_name_no_kind_but_the_default():
    named = {}
    for package in ("report", "cli"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            where = str(path.relative_to(PACKAGE))
            extra = _kinds_named(path) - {"GRAPH"} - NAMED_BY_PURPOSE.get(where, set())
            if extra:
                named[where] = sorted(extra)
    assert not named, named
    assert _kinds_named(PACKAGE / "report" / "fused.py") <= {"FUSED"}


# --- each kind's handlers on an entry of it ------------------------------------------


def _key(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


GRAPH_KEY = _key("graph")
META = {"graph_name": "g", "node_count": 3, "created": time.time(), "torch_version": "t"}
ENTRIES = {
    EntryKind.GRAPH: Entry(
        GRAPH_KEY, "graph(%p0 : Tensor):\n  return (%p0)\n",
        (Source("arg", 0), Source("attr", "fc.weight")),
        (Source("out", 0), Source("const", torch.tensor(2.5, dtype=torch.float64))),
        (Update(0, Source("arg", 0)),), META),
    EntryKind.NEGATIVE: Entry(_key("negative"), "", (), (), (), META, kind=EntryKind.NEGATIVE,
                              payload={"reason": "no lowering"}),
    EntryKind.PLAN: Entry(_key("plan"), "", (), (), (), META, kind=EntryKind.PLAN, payload={
        "plan": {"graph": {"nodes": [[1], [2]], "constants": [1]},
                 "regions": [["r0", {"nodes": [[1]], "constants": []}, 1, "d" * 64]]},
        "joint": {"outputs": 2, "saved": 3, "saved_unchecked": 1, "tangents": [1]}}),
    EntryKind.PROGRAM: Entry(_key("program"), "", (), (), (), META, kind=EntryKind.PROGRAM,
                             payload={"sources": [[1]], "checks": [], "artifact": b"x" * 2000,
                                      "hmac": b"h" * 32}),
    EntryKind.FUSED: Entry(_key("fused"), "", (), (), (), META, kind=EntryKind.FUSED,
                           payload={"format": FUSED_FORMAT, "version": FUSED_VERSION,
                                    "graph_key": GRAPH_KEY, "reason": "not faster",
                                    "compile_seconds": 3.0}),
}


def test_each_kind_shows_its_own_fields_and_lines():
    context = ShowContext(None, {GRAPH_KEY: "g"}.get, with_ir=False)
    views = {kind: handlers(kind).show(ENTRIES[kind], context) for kind in KINDS}
    assert all(isinstance(view, KindView) and view.lines for view in views.values())
    graph = views[EntryKind.GRAPH]
    assert graph.fields == [] and "  %p1    attr fc.weight" in graph.lines
    assert "  1     const float64[] = 2.5" in graph.lines and "IR:" not in graph.lines
    assert "  output 0 -> arg 0" in graph.lines
    assert dict(views[EntryKind.NEGATIVE].fields) == {"Reason": "no lowering"}
    assert dict(views[EntryKind.PLAN].fields) == {
        "Plan": "3 nodes in 1 LTC regions and the eager rest, 1 tensor constants "
                "(the graphs: --json)",
        "Joint": "2 outputs, 3 + 1 saved tensors, 1 tangents"}
    program = views[EntryKind.PROGRAM]
    # A pickle and machine code are shown by their sizes, never their bytes.
    assert program.payload["artifact_size"] == 2000
    assert "artifact" not in program.payload and "hmac" not in program.payload
    assert dict(program.fields)["Program"].startswith("1 inlined sources, 0 portable checks")
    fused = views[EntryKind.FUSED]
    assert dict(fused.fields)["Graph"] == f"{GRAPH_KEY} (g)"
    assert dict(fused.fields)["Refused"] == "not faster"
    assert fused.json["fused"]["refused"] and fused.payload["library_size"] is None
    assert handlers(EntryKind.GRAPH).show(ENTRIES[EntryKind.GRAPH], ShowContext(
        None, {}.get)).lines[-2:] == ["  graph(%p0 : Tensor):", "    return (%p0)"]


def test_each_kind_verifies_its_own_payload():
    for kind in (EntryKind.GRAPH, EntryKind.NEGATIVE, EntryKind.FUSED):
        handlers(kind).verify(ENTRIES[kind], None, "unused")
    with pytest.raises(EntryError, match="not a plan"):
        handlers(EntryKind.PLAN).verify(ENTRIES[EntryKind.PLAN], None, "unused")
    broken = Entry(_key("broken"), "", (), (), (), META, kind=EntryKind.FUSED,
                   payload={"graph_key": "nope"})
    with pytest.raises(EntryError, match="no graph key"):
        handlers(EntryKind.FUSED).verify(broken, None, "unused")


def test_summaries_carry_each_kinds_own_fields():
    for kind, entry in ENTRIES.items():
        summary = summarise(encode(entry))
        assert summary["kind"] == kind and "problem" not in summary
        parts = handlers(kind).parts
        common = {"graph_name", "kind", "node_count", "inputs", "created", "torch_version",
                  "schema", "size"}
        if kind == EntryKind.GRAPH:  # and what its fused library is keyed by
            assert set(summary) == common | {"source"}
        elif parts is None:
            assert set(summary) == common
        else:
            assert summary[parts.field] in parts.names
    assert summarise(encode(ENTRIES[EntryKind.FUSED]))["fused"] == "refusal"
    # A body whose kind is no kind summarises with the common fields alone.
    envelope = msgpack.unpackb(encode(ENTRIES[EntryKind.FUSED]))
    body = msgpack.unpackb(envelope["body"])
    envelope["body"] = msgpack.packb({**body, "kind": "fusedd"})
    summary = summarise(msgpack.packb(envelope))
    assert summary["kind"] == "fusedd" and "fused" not in summary and "problem" not in summary
