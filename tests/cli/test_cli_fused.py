"""`ltc-cache` and the fused tier: `fuse`, and fused entries in `ls`, `stats`,
`show`, `verify`, `prune`, the size limit and bundles.

The fast tests make fused entries without compiling: `fused_entry` and
`refusal_entry` over fake library bytes (a signature needs no real
library), stored next to real graph entries; `fuse` runs with the compile
step (`build.build_entry`) replaced. The CLI runs in this process (torch
is imported already), except where what it imports is the point. One slow
test compiles for real.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import torch
from test_cli import SCRIPT, age, imported_modules

import ltc_cache
from ltc_cache.cli import main
from ltc_cache.config import CacheConfig
from ltc_cache.entries.entry import Entry, decode, encode
from ltc_cache.entries.keys import CacheKey
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.graph.cache import GraphCache, default_cache
from ltc_cache.graph.fused.library_entries import fused_entry, library_of, refusal_entry
from ltc_cache.graph.fused.platform import fused_key, machine_isa, source_key
from ltc_cache.signing import key_path, program_secret
from ltc_cache.store import DiskStore, ReadOnlyDiskStore
from ltc_cache.units import format_size

# A fake library: big enough to dwarf the graph entries, as real ones do.
LIBRARY = b"\x7fELF" + hashlib.sha256(b"fake").digest() * 6000
STATS = {"compile_seconds": 14.2, "script_ms": 0.224, "fused_ms": 0.101,
         "compiler": "g++ (test) 12.2.0"}
LINE = "library, compiled in 14.2 s, 0.45x of TorchScript's time (0.101 ms vs 0.224 ms)"
SLOWER = "not faster: 0.300 ms a call against TorchScript's 0.224 ms"


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + 1.0


def _clean_env(mp: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("LTC_CACHE_")]:
        mp.delenv(name)
    # No background worker: a test compiles only what it means to.
    mp.setenv("LTC_CACHE_FUSE", "off")


def extract(directory: Path, *modules: tuple[str, torch.nn.Module]) -> dict[str, str]:
    """Real graph entries in ``directory``, as a user's process stores them;
    graph name -> key."""
    with pytest.MonkeyPatch.context() as mp:
        _clean_env(mp)
        mp.setenv("LTC_CACHE_DIR", str(directory))
        torch.manual_seed(0)
        for name, module in modules:
            ltc_cache.extract_compiled_graph(torch.fx.symbolic_trace(module),
                                             [torch.randn(2, 8)], name=name)
        store = default_cache().store
        keys = {decode(store.get(k), expected_key=k).graph_name: k
                for k in filter(is_entry_key, store.keys())}
        store.close()  # the directory is copied next
    return keys


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    directory = tmp_path_factory.mktemp("fused") / "ltc"
    return directory, extract(directory, ("mlp", Mlp()), ("scale", Scale()))


@pytest.fixture
def env(monkeypatch, tmp_path) -> Path:
    """No LTC_CACHE_* from outside, and a signing key of this test's own."""
    _clean_env(monkeypatch)
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    return config


@pytest.fixture
def cache(template, tmp_path, env) -> tuple[Path, dict[str, str]]:
    """A copy of the template's two graph entries (mlp, scale) a test may change."""
    directory, keys = template
    copy = tmp_path / "ltc"
    shutil.copytree(directory, copy)
    return copy, keys


def cli(capsys, directory: Path, *args: str) -> tuple[int, str, str]:
    """``ltc-cache --dir directory args`` in this process: status, stdout, stderr."""
    try:
        code = main(["--dir", str(directory), *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def graph_entry(directory: Path, key: str) -> Entry:
    store = ReadOnlyDiskStore(directory)
    try:
        return decode(store.get(key), expected_key=key)
    finally:
        store.close()


def store_entry(directory: Path, entry: Entry, **config: object) -> None:
    """Store as the fused tier does: GraphCache.store_entry."""
    cache = GraphCache(CacheConfig(directory=directory, fuse="off", **config))
    cache.store_entry(entry, fused_key(entry.payload["graph_key"]))
    cache.store.close()


def library_key(directory: Path, graph_key: str) -> CacheKey:
    """Where the library of the graph entry ``graph_key`` is stored: under
    its content (graph/fused/source.py)."""
    return fused_key(source_key(graph_entry(directory, graph_key)))


def make_library(directory: Path, graph_key: str, *, library: bytes = LIBRARY,
                 secret: bytes | None = None, isa: str | None = None) -> Entry:
    key = library_key(directory, graph_key)
    return fused_entry(key, graph_entry(directory, graph_key), library=library,
                       isa=machine_isa() if isa is None else isa, aliases=[],
                       restride=[[0, [2, 4], [4, 1]]],
                       secret=secret or program_secret(None, directory), stats=STATS)


def put_library(directory: Path, graph_key: str, **kwargs: object) -> str:
    entry = make_library(directory, graph_key, **kwargs)
    store_entry(directory, entry)
    return entry.key


def put_refusal(directory: Path, graph_key: str, reason: str = SLOWER) -> str:
    entry = refusal_entry(library_key(directory, graph_key), graph_entry(directory, graph_key),
                          reason,
                          {**STATS, "fused_ms": 0.3})
    store_entry(directory, entry)
    return entry.key


def rewrite_payload(directory: Path, key: str, drop: tuple[str, ...] = (), **changes) -> None:
    """Re-store entry ``key`` with its payload changed (a valid envelope
    around it: only the fused checks can tell)."""
    store = DiskStore(directory)
    entry = decode(store.get(key), expected_key=key)
    payload = {k: v for k, v in {**entry.payload, **changes}.items() if k not in drop}
    store.put(key, encode(dataclasses.replace(entry, payload=payload)))
    store.close()


def sizes(directory: Path) -> dict[str, int]:
    store = ReadOnlyDiskStore(directory)
    try:
        return {row.key: row.size for row in store.rows() if is_entry_key(row.key)}
    finally:
        store.close()


@pytest.fixture
def compiler(monkeypatch):
    """The compile step of `fuse` replaced: what it does per graph name
    (``library``, ``refuse``, ``interrupt``, ``slow``), and the names it was
    called for."""
    fake = SimpleNamespace(calls=[], does={})

    def build_entry(graph: Entry, key, secret: bytes) -> Entry:
        fake.calls.append(graph.graph_name)
        what = fake.does.get(graph.graph_name, "library")
        if what == "interrupt":
            raise KeyboardInterrupt
        if what == "slow":
            time.sleep(10)  # the timeout's SIGALRM ends it
        if what == "refuse":
            return refusal_entry(key, graph, SLOWER, STATS)
        return fused_entry(key, graph, library=LIBRARY, isa=machine_isa(), aliases=[],
                           restride=[], secret=secret, stats=STATS)

    monkeypatch.setattr("ltc_cache.graph.fused.build.build_entry", build_entry)
    return fake


def lines_of(out: str) -> dict[str, str]:
    """`fuse`'s graph lines: graph name -> the rest after ``name key:``."""
    found = re.findall(r"^\[\d+/\d+\] (\S+) ([0-9a-f]{12}): (.*)$", out, re.M)
    return {name: rest for name, _, rest in found}


# -- ls, stats, show ------------------------------------------------------------------------


def test_ls_lists_fused_entries_with_their_size(cache, capsys):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    refusal = put_refusal(directory, keys["scale"])
    stored = sizes(directory)

    code, out, _ = cli(capsys, directory, "ls", "--json")
    assert code == 0
    rows = {e["key"]: e for e in json.loads(out)["entries"]}
    assert rows[library]["kind"] == rows[refusal]["kind"] == "fused"
    assert (rows[library]["fused"], rows[refusal]["fused"]) == ("library", "refusal")
    assert rows[library]["graph_name"] == "mlp" and rows[refusal]["graph_name"] == "scale"
    assert rows[library]["size"] == stored[library] > len(LIBRARY)
    assert rows[keys["mlp"]]["fused"] is None

    code, out, _ = cli(capsys, directory, "ls", "--sort", "size")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["KEY", "NAME", "KIND"]
    assert lines[1].split()[:3] == [library[:12], "mlp", "fused"]  # the largest
    assert format_size(stored[library]) in lines[1]
    assert lines[-1].startswith(f"4 entries, {format_size(sum(stored.values()))}")
    code, out, _ = cli(capsys, directory, "ls", "--json", "--filter", "kind=fused")
    assert {e["key"] for e in json.loads(out)["entries"]} == {library, refusal}


def test_stats_counts_fused_libraries_and_refusals_apart(cache, capsys):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    refusal = put_refusal(directory, keys["scale"])
    stored = sizes(directory)
    graphs = stored[keys["mlp"]] + stored[keys["scale"]]

    def check() -> None:
        code, out, _ = cli(capsys, directory, "stats", "--json")
        assert code == 0
        stats = json.loads(out)
        assert stats["entries"] == 4 and stats["entry_size"] == sum(stored.values())
        kinds = stats["kinds"]
        assert list(kinds) == ["graph", "fused"]
        assert (kinds["graph"]["entries"], kinds["graph"]["size"]) == (2, graphs)
        fused = kinds["fused"]
        assert (fused["entries"], fused["size"]) == (2, stored[library] + stored[refusal])
        assert (fused["library"]["entries"], fused["library"]["size"]) == (1, stored[library])
        assert (fused["refusal"]["entries"], fused["refusal"]["size"]) == (1, stored[refusal])

        code, out, _ = cli(capsys, directory, "stats")
        both, one, other = (re.escape(format_size(n)) for n in (
            stored[library] + stored[refusal], stored[library], stored[refusal]))
        assert re.search(rf"^  fused +2 \({both}\): 1 library \({one}\), 1 refusal \({other}\)$",
                         out, re.M)
        assert re.search(rf"^  graph +2 \({re.escape(format_size(graphs))}\)$", out, re.M)

    check()
    # Summaries written before they told libraries from refusals: the
    # entries are read instead, and counted the same.
    con = sqlite3.connect(directory / "ledger.db")
    with con:
        for key in (library, refusal):
            (summary,) = con.execute("SELECT summary FROM entries WHERE key = ?", (key,)).fetchone()
            old = {k: v for k, v in msgpack.unpackb(summary).items() if k != "fused"}
            con.execute("UPDATE entries SET summary = ? WHERE key = ?", (msgpack.packb(old), key))
    con.close()
    store = ReadOnlyDiskStore(directory)
    assert "fused" not in store.ledger.entries()[library].summary
    store.close()
    check()


# A library no CPU runs: AVX10_2 is no word ltc_cache knows.
ELSEWHERE = "AVX512 AVX512_VNNI AVX512_BF16 AMX_TILE AMX_FP16 AVX10_2"


def test_ls_show_stats_say_what_each_library_needs_and_whether_this_cpu_has_it(cache, capsys):
    directory, keys = cache
    here = put_library(directory, keys["mlp"])
    elsewhere = make_library(directory, keys["scale"], isa=ELSEWHERE)
    store_entry(directory, elsewhere)

    code, out, _ = cli(capsys, directory, "ls", "--json")
    rows = {e["key"]: e for e in json.loads(out)["entries"]}
    assert (rows[here]["isa"], rows[here]["runs_here"]) == (machine_isa(), True)
    assert (rows[elsewhere.key]["isa"], rows[elsewhere.key]["runs_here"]) == (ELSEWHERE, False)
    code, out, _ = cli(capsys, directory, "ls")
    line = next(line for line in out.splitlines() if line.startswith(elsewhere.key[:12]))
    assert f"fused {ELSEWHERE} (not here)" in line
    code, out, _ = cli(capsys, directory, "ls", "--json", "--filter", "isa=*avx10*")
    assert [e["key"] for e in json.loads(out)["entries"]] == [elsewhere.key]

    code, out, _ = cli(capsys, directory, "show", elsewhere.key)
    fields = dict(re.findall(r"^(\w[\w ]*?)  +(.*)$", out, re.M))
    assert fields["ISA"].startswith(f"{ELSEWHERE} (this CPU lacks ") and "AVX10_2" in \
        fields["ISA"] and fields["ISA"].endswith(": not used here)")

    code, out, _ = cli(capsys, directory, "stats", "--json")
    fused = json.loads(out)["kinds"]["fused"]
    assert (fused["library"]["entries"], fused["other-CPU library"]["entries"]) == (1, 1)
    code, out, _ = cli(capsys, directory, "stats")
    assert code == 0
    assert re.search(r"^  fused +2 \(.*\): 1 library \(.*\), 1 other-CPU library \(.*\)$",
                     out, re.M), out


def test_prune_cpu_drops_the_libraries_no_cpu_of_the_fleet_runs(cache, capsys):
    directory, keys = cache
    here = put_library(directory, keys["mlp"])
    amx = make_library(directory, keys["scale"], isa="AVX512 AVX512_VNNI AMX_TILE")
    store_entry(directory, amx)
    code, out, _ = cli(capsys, directory, "prune", "--cpu", "avx512 avx512_vnni", "--dry-run")
    assert code == 0 and amx.key[:12] in out and here[:12] not in out
    code, out, _ = cli(capsys, directory, "prune", "--cpu", "here", "--cpu", "amx_tile", "--yes")
    assert code == 0 and set(sizes(directory)) >= {here, amx.key}
    code, out, _ = cli(capsys, directory, "prune", "--cpu", "here", "--yes")
    assert code == 0 and amx.key not in sizes(directory) and here in sizes(directory)
    assert set(keys.values()) <= set(sizes(directory))  # graphs are no libraries
    code, _, err = cli(capsys, directory, "prune", "--cpu", "neon")
    assert code == 2 and "not a CPU: 'neon'" in err


def test_stats_of_graphs_alone_shows_no_kind_rows(cache, capsys):
    directory, _ = cache
    code, out, _ = cli(capsys, directory, "stats")
    assert code == 0 and "  graph" not in out and re.search(r"^Entries +2 ", out, re.M)


def test_ls_and_stats_with_fused_entries_never_import_torch(cache):
    directory, keys = cache
    put_library(directory, keys["mlp"])
    put_refusal(directory, keys["scale"])
    for args in (["ls"], ["stats"], ["stats", "--json"]):
        modules = imported_modules(directory, *args)
        assert "ltc_cache" in modules and "torch" not in modules, args


def test_show_a_fused_library(cache, capsys):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    code, out, _ = cli(capsys, directory, "show", library[:10])
    assert code == 0
    fields = dict(re.findall(r"^(\w[\w ]*?)  +(.*)$", out, re.M))
    assert fields["Kind"] == "fused"
    source = source_key(graph_entry(directory, keys["mlp"]))
    assert fields["Graph"] == (f"{source} (the content of mlp: every graph of the same IR "
                               "and input layouts uses this entry)")
    assert fields["Library"] == (f"{format_size(len(LIBRARY))}, sha256 "
                                 f"{hashlib.sha256(LIBRARY).hexdigest()}")
    assert fields["ISA"] == f"{machine_isa()} (this CPU runs it)"
    assert fields["Compiled in"] == "14.2 s by g++ (test) 12.2.0"
    assert fields["Per call"] == "0.45x of TorchScript's time (0.101 ms vs 0.224 ms)"
    assert fields["Signature"] == "holds under this user's key"
    assert "A fused entry" in out and "IR:" not in out and "Inputs (" not in out

    code, out, _ = cli(capsys, directory, "show", library, "--json")
    shown = json.loads(out)
    assert "library" not in shown["payload"] and "hmac" not in shown["payload"]
    assert shown["payload"]["library_size"] == shown["fused"]["library_size"] == len(LIBRARY)
    assert shown["fused"]["ratio"] == pytest.approx(0.101 / 0.224)
    assert shown["fused"]["refused"] is False and shown["signature"].startswith("holds")
    assert len(out) < len(LIBRARY)  # never the library's bytes


def test_show_a_refusal_and_a_library_whose_graph_is_gone(cache, capsys):
    directory, keys = cache
    refusal = put_refusal(directory, keys["scale"])
    code, out, _ = cli(capsys, directory, "show", refusal)
    assert code == 0
    fields = dict(re.findall(r"^(\w[\w ]*?)  +(.*)$", out, re.M))
    assert fields["Refused"] == SLOWER
    assert fields["Graph"].startswith(f"{source_key(graph_entry(directory, keys['scale']))} "
                                      "(the content of scale:")
    assert fields["Per call"] == "1.34x of TorchScript's time (0.300 ms vs 0.224 ms)"
    assert "Library" not in fields and "ISA" not in fields
    assert fields["Signature"].startswith("- (a refusal holds no code)")

    library = put_library(directory, keys["mlp"])
    store = DiskStore(directory)
    store.discard([keys["mlp"]])
    store.close()
    code, out, _ = cli(capsys, directory, "show", library)
    assert code == 0 and "(the content of mlp: every graph" in out  # named by its first graph


# -- verify ---------------------------------------------------------------------------------


def test_verify_checks_fused_signatures(cache, capsys):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    refusal = put_refusal(directory, keys["scale"])
    code, out, _ = cli(capsys, directory, "verify")
    assert code == 0 and "Checked 4 entries: 0 bad." in out

    # The library's bytes changed, its recorded digest changed to match:
    # only the signature can tell.
    tampered = LIBRARY[:-1] + b"\x00"
    rewrite_payload(directory, library, library=tampered,
                    library_sha256=hashlib.sha256(tampered).hexdigest())
    rewrite_payload(directory, refusal, drop=("reason",))
    code, out, _ = cli(capsys, directory, "verify")
    assert code == 1
    assert re.search(rf"^BAD {library[:12]} .*signature mismatch", out, re.M)
    assert re.search(rf"^BAD {refusal[:12]} .*malformed", out, re.M)
    assert "Checked 4 entries: 2 bad." in out
    code, out, _ = cli(capsys, directory, "show", library)
    assert re.search(r"^Signature +BAD: .*signature mismatch", out, re.M)

    code, out, _ = cli(capsys, directory, "verify", "--fix")
    assert code == 0 and "2 bad, 2 removed" in out
    assert set(sizes(directory)) == {keys["mlp"], keys["scale"]}


def test_verify_refuses_a_library_signed_with_another_key(cache, capsys):
    directory, keys = cache
    program_secret(None, directory)  # this user's own key, which did not sign it
    library = put_library(directory, keys["mlp"], secret=b"another user's key" * 2)
    code, out, _ = cli(capsys, directory, "verify")
    assert code == 1 and re.search(rf"^BAD {library[:12]} .*signature mismatch", out, re.M)


def test_verify_without_a_signing_key_checks_the_form_and_creates_no_key(cache, capsys,
                                                                        monkeypatch, tmp_path):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])  # signed with the test's key
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "elsewhere"))
    code, out, _ = cli(capsys, directory, "verify")
    assert code == 0 and "0 bad" in out  # cannot check what no key here signed
    assert not key_path().exists()
    code, out, _ = cli(capsys, directory, "show", library)
    assert re.search(r"^Signature +not checked: no signing key here", out, re.M)

    rewrite_payload(directory, library, library=LIBRARY[:-1] + b"\x00")
    code, out, _ = cli(capsys, directory, "verify")
    assert code == 1 and "do not match its recorded sha256" in out
    assert not key_path().exists()


# -- fuse -----------------------------------------------------------------------------------


def test_fuse_compiles_each_graph_once_with_a_line_each(cache, capsys, compiler):
    directory, keys = cache
    compiler.does["scale"] = "refuse"
    code, out, err = cli(capsys, directory, "fuse")
    assert code == 0, err
    assert sorted(compiler.calls) == ["mlp", "scale"]
    assert lines_of(out) == {"mlp": LINE, "scale": f"refused: {SLOWER}"}
    assert re.search(rf"^\[\d/2\] mlp {keys['mlp'][:12]}: ", out, re.M)
    assert "Done in" in out and "1 library compiled, 1 refused, 0 skipped" in out
    stored = ReadOnlyDiskStore(directory)
    mlp = decode(stored.get(library_key(directory, keys["mlp"]).digest))
    scale = decode(stored.get(library_key(directory, keys["scale"]).digest))
    stored.close()
    assert library_of(mlp, program_secret(None, directory),
                      source_key(graph_entry(directory, keys["mlp"]))).data == LIBRARY
    assert scale.payload["reason"] == SLOWER and "library" not in scale.payload

    # Run again: nothing compiles; --retry compiles the refused graph alone.
    code, out, _ = cli(capsys, directory, "fuse")
    assert code == 0 and len(compiler.calls) == 2
    assert lines_of(out) == {"mlp": "already fused",
                             "scale": f"already refused: {SLOWER} (--retry compiles it again)"}
    assert "0 libraries compiled, 0 refused, 2 skipped" in out
    compiler.does["scale"] = "library"
    code, out, _ = cli(capsys, directory, "fuse", "--retry")
    assert code == 0 and compiler.calls[2:] == ["scale"]
    assert lines_of(out) == {"mlp": "already fused", "scale": LINE}


def test_fuse_dry_run_compiles_nothing_even_read_only(cache, capsys, compiler, monkeypatch):
    directory, keys = cache
    put_refusal(directory, keys["scale"])
    before = sizes(directory)
    monkeypatch.setenv("LTC_CACHE_READONLY", "1")
    code, out, _ = cli(capsys, directory, "fuse", "--dry-run")
    assert code == 0 and compiler.calls == []
    assert lines_of(out) == {"mlp": "would compile",
                             "scale": "already refused (--retry compiles it again)"}
    assert "Dry run: 1 of 2 graphs to compile; nothing compiled." in out
    code, out, _ = cli(capsys, directory, "fuse", "--dry-run", "--retry")
    assert lines_of(out)["scale"] == "would compile again (refused before)"
    assert sizes(directory) == before


def test_fuse_takes_the_filters_of_ls(cache, capsys, compiler):
    directory, keys = cache
    code, out, _ = cli(capsys, directory, "fuse", "--filter", "name=ml*")
    assert code == 0 and compiler.calls == ["mlp"] and list(lines_of(out)) == ["mlp"]
    code, out, _ = cli(capsys, directory, "fuse", "--key", keys["scale"][:8])
    assert code == 0 and compiler.calls == ["mlp", "scale"]
    # Fused entries are never compiled themselves.
    code, out, _ = cli(capsys, directory, "fuse", "--filter", "kind=fused")
    assert code == 0 and "No graph entries match" in out and "fuse compiles graphs" in out
    assert len(compiler.calls) == 2


def test_fuse_ctrl_c_stops_with_a_summary_and_a_second_run_continues(cache, capsys,
                                                                     compiler):
    directory, keys = cache
    compiler.does["scale"] = "interrupt"
    for name in ("mlp", "scale"):  # mlp first: the most recently used
        age(directory, keys[name], {"mlp": 1, "scale": 2}[name])
    code, out, _ = cli(capsys, directory, "fuse")
    assert code == 130
    assert lines_of(out) == {"mlp": LINE}
    assert "Interrupted at graph 2 of 2: 1 library compiled, 0 refused, 0 skipped" in out
    assert "run the same command again to continue" in out
    assert library_key(directory, keys["mlp"]).digest in sizes(directory)
    assert library_key(directory, keys["scale"]).digest not in sizes(directory)

    compiler.does["scale"] = "library"
    code, out, _ = cli(capsys, directory, "fuse")
    assert code == 0 and compiler.calls == ["mlp", "scale", "scale"]
    assert lines_of(out) == {"mlp": "already fused", "scale": LINE}


def test_fuse_timeout_refuses_a_compile_that_takes_too_long(cache, capsys, compiler,
                                                            monkeypatch):
    directory, keys = cache
    compiler.does["scale"] = "slow"
    started = time.monotonic()
    code, out, _ = cli(capsys, directory, "fuse", "--key", keys["scale"], "--timeout", "0.5")
    assert code == 0 and time.monotonic() - started < 8
    assert lines_of(out) == {"scale": "refused: the compile took over 0.5 s "
                                      "(LTC_CACHE_FUSE_TIMEOUT)"}
    # The default is the configuration's.
    monkeypatch.setenv("LTC_CACHE_FUSE_TIMEOUT", "0.25")
    code, out, _ = cli(capsys, directory, "fuse", "--key", keys["scale"], "--retry")
    assert "took over 0.25 s" in lines_of(out)["scale"] and "within 0.25 s" in out


def test_fuse_refuses_a_read_only_cache_and_bad_arguments(cache, capsys, compiler,
                                                         monkeypatch):
    directory, _ = cache
    before = sizes(directory)
    for args in (["--timeout", "0"], ["--timeout", "soon"], ["--bogus"], ["--filter", "x>1"]):
        code, out, err = cli(capsys, directory, "fuse", *args)
        assert code == 2 and out == "", args
        assert len(err.strip().splitlines()) == 1, err
    code, _, err = cli(capsys, directory, "fuse", "--key", "f" * 12)
    assert code == 2 and "no entry" in err
    assert main(["--remote", "redis://localhost:1", "fuse"]) == 2  # Redis alone
    assert "give --dir" in capsys.readouterr().err

    monkeypatch.setenv("LTC_CACHE_READONLY", "1")
    code, out, err = cli(capsys, directory, "fuse")
    assert code == 2 and out == ""
    assert "read-only" in err and "LTC_CACHE_READONLY" in err and "--dry-run" in err
    assert compiler.calls == [] and sizes(directory) == before


def test_fuse_replaces_a_library_it_could_never_load(cache, capsys, compiler):
    directory, keys = cache
    foreign = put_library(directory, keys["mlp"], secret=b"another user's key" * 2)
    code, out, _ = cli(capsys, directory, "fuse", "--key", keys["mlp"])
    assert code == 0 and compiler.calls == ["mlp"]
    assert lines_of(out)["mlp"].startswith(LINE + " (replaced a bad stored library: ")
    store = ReadOnlyDiskStore(directory)
    entry = decode(store.get(foreign), expected_key=foreign)
    store.close()
    assert library_of(entry, program_secret(None, directory),
                      source_key(graph_entry(directory, keys["mlp"]))) is not None


# -- prune, the size limit, bundles ---------------------------------------------------------


def test_prune_counts_fused_entries_bytes(cache, capsys):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    refusal = put_refusal(directory, keys["scale"])
    stored = sizes(directory)
    age(directory, library, 40)  # the least recently used, and much the largest

    code, out, _ = cli(capsys, directory, "prune", "--max-size",
                       str(sum(stored.values()) - 1), "--dry-run")
    assert code == 0
    assert f"Will delete 1 entry, freeing {format_size(stored[library])}." in out
    assert library[:12] in out and refusal[:12] not in out
    code, out, _ = cli(capsys, directory, "prune", "--older-than", "30d", "--yes")
    assert code == 0 and "Deleted 1 entry" in out
    assert set(sizes(directory)) == {keys["mlp"], keys["scale"], refusal}


def test_the_size_limit_counts_fused_entries(cache):
    directory, keys = cache
    stored = sizes(directory)
    age(directory, keys["scale"], 2)  # the least recently used
    entry = make_library(directory, keys["mlp"])
    # Room for the graphs and the library, less one byte: storing the
    # library evicts one graph, the least recently used.
    limit = sum(stored.values()) + len(encode(entry)) - 1
    store_entry(directory, entry, max_size=limit)
    after = sizes(directory)
    assert set(after) == {keys["mlp"], entry.key}
    assert sum(after.values()) <= limit
    store = ReadOnlyDiskStore(directory)
    assert store.ledger.counters()["evictions"] == 1
    store.close()


def test_export_and_import_carry_fused_entries(cache, capsys, tmp_path):
    directory, keys = cache
    library = put_library(directory, keys["mlp"])
    refusal = put_refusal(directory, keys["scale"])
    bundle = tmp_path / "fused.ltcb"
    code, out, _ = cli(capsys, directory, "export", str(bundle), "--filter", "kind=fused")
    assert code == 0 and "Exported 2 entries" in out

    image = tmp_path / "image"
    code, out, _ = cli(capsys, image, "import", str(bundle))
    assert code == 0 and "Imported 2 entries" in out
    source, copy = ReadOnlyDiskStore(directory), ReadOnlyDiskStore(image)
    for key in (library, refusal):
        assert copy.get(key) == source.get(key)
    source.close()
    copy.close()
    code, out, _ = cli(capsys, image, "verify")
    assert code == 0 and "Checked 2 entries: 0 bad." in out
    code, out, _ = cli(capsys, image, "ls", "--json")
    assert {e["fused"] for e in json.loads(out)["entries"]} == {"library", "refusal"}


# -- one real compile -----------------------------------------------------------------------


def _compiler_running(pid: int) -> bool:
    """Whether process ``pid`` has a child process (the C++ compiler)."""
    try:
        return any(Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                   for task in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False


@pytest.mark.slow  # g++: 20-40 s for one tiny graph
def test_fuse_compiles_a_real_library_and_ctrl_c_stops_it(tmp_path, env, capsys):
    directory = tmp_path / "ltc"
    keys = extract(directory, ("mlp", Mlp()))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    argv = [str(SCRIPT), "--dir", str(directory), "fuse"]

    # Ctrl-C in the middle of the compile: a summary, status 130, nothing stored.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    header = proc.stdout.readline()
    assert header.startswith("Fusing 1 graph in "), header
    deadline = time.monotonic() + 300
    while not _compiler_running(proc.pid):  # inside the compile: g++ is its child
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Interrupted at graph 1 of 1" in out and "run the same command again" in out
    assert library_key(directory, keys["mlp"]).digest not in sizes(directory)

    proc = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("[1/1]")]
    compiled = re.fullmatch(
        rf"\[1/1\] mlp {keys['mlp'][:12]}: library, compiled in [\d.]+ s, [\d.]+x of "
        r"TorchScript's time \([\d.]+ ms vs [\d.]+ ms\)", line)
    # A library slower than TorchScript (a loaded machine) is refused, but
    # was still compiled and timed against it.
    assert compiled or re.search(r": refused: not faster: ", line), line
    store = ReadOnlyDiskStore(directory)
    entry = decode(store.get(library_key(directory, keys["mlp"]).digest))
    store.close()
    assert entry.payload["compile_seconds"] > 0 and entry.payload["script_ms"] > 0
    if compiled:
        library = library_of(entry, program_secret(None, directory),
                             source_key(graph_entry(directory, keys["mlp"])))
        assert library.data.startswith(b"\x7fELF") and library.isa == machine_isa()
    code, out, _ = cli(capsys, directory, "fuse", "--dry-run")
    assert code == 0 and "already" in out and "0 of 1 graph to compile" in out
