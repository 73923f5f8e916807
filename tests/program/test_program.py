"""``ltc_cache.compile``: whole programs, cold then warm in child processes.

Each test writes a small model module (``progmodels.py``, and ``helper.py``
whose function the model inlines) into its temp dir, so that it can edit
them between processes, and runs ``tests/children/program.py`` against it.
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import CHILDREN, captured_models, child_env, on_import_path

import ltc_cache
from ltc_cache.entries.entry import decode, encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.store import DiskStore, ReadOnlyDiskStore

MODELS = '''\
import torch
import helper

SCALE = 2.0


class Net(torch.nn.Module):
    def __init__(self, width=16, depth=2):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = helper.act(layer(x))
        return x * SCALE


class Broken(Net):
    def forward(self, x):
        x = self.layers[0](x)
        torch._dynamo.graph_break()
        return helper.act(self.layers[1](x))


def build():
    torch.manual_seed(0)
    return Net()


def deeper():
    torch.manual_seed(0)
    return Net(depth=3)


def broken():
    torch.manual_seed(0)
    return Broken()
'''

HELPER = '''\
import torch


def act(x):
    return torch.relu(x)
'''

# More models, each a test's: appended to MODELS in the models of ``variants``.
TYPE_CHECKED = '''

class TypeChecked(Net):
    def forward(self, x):
        if type(x) is torch.Tensor:
            x = x * 3.0
        return super().forward(x)


def type_checked():
    torch.manual_seed(0)
    return TypeChecked()
'''

COPIES = '''

import copy


class Config:
    kind = "plain"  # read through the instance: absent from its __dict__

    def __init__(self, scale=3.0):
        self.scale = scale
        self.labels = {0: "a", 1: "b"}


class Copies(Net):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, x):
        config = copy.deepcopy(self.config)
        if config.kind == "plain":
            x = x * config.scale
        return super().forward(x)


def copies():
    torch.manual_seed(0)
    return Copies(Config())


def copies_scaled():
    torch.manual_seed(0)
    return Copies(Config(scale=5.0))
'''

DECORATED = '''

import ltc_cache


@ltc_cache.compile
def fn(x):
    return helper.act(x) * SCALE
'''

SCRIPT = Path(sys.executable).with_name("ltc-cache")
# A payload that, unpickled, leaves a file behind.
MARKER = "PAYLOAD_RAN"


class Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def models(tmp_path, cache_dir, monkeypatch) -> Path:
    """The models directory; the per-user signing key under the test's
    own config directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "progmodels.py").write_text(MODELS)
    (directory / "helper.py").write_text(HELPER)
    return directory


@pytest.fixture(scope="session")
def captured(tmp_path_factory) -> dict:
    """One cold process over ``MODELS`` (Net, one call) for the whole run,
    shared by the tests that start from a stored program: its report, its
    models directory (read only: the program names its files), its cache
    (each test copies it: ``stored``) and its signing key's config
    directory."""

    def cold(models: Path, env: dict) -> dict:
        report = run(models, env=env)
        assert_captured(report)
        return report

    return captured_models(tmp_path_factory, "test_program",
                           {"progmodels.py": MODELS, "helper.py": HELPER}, cold)


# Runs of children/program.py that share a cold and a warm process, one after
# the other in each, counted on their own: what each compiles is its own
# code (Net.forward is compiled whole by "train" alone). name -> options.
VARIANTS = {
    "train": ["--train", "--call", "4x16:float32", "--call", "4x16:float32"],
    "type_checked": ["--model", "type_checked"],
    "copies": ["--model", "copies"],
    "decorated": ["--decorator"],
    "broken": ["--model", "broken"],
}


@pytest.fixture(scope="session")
def variants(tmp_path_factory) -> dict:
    """Once for the whole run, over models of their own (MODELS with
    TYPE_CHECKED, COPIES and DECORATED): the runs of VARIANTS in a cold
    process, then in a warm one (where "train" watches its loads).
    ``"cold"`` and ``"warm"``: name -> result; the models directory, the
    cache and the signing key's config directory, as ``captured``'s."""

    def cold_then_warm(models: Path, env: dict) -> dict:
        first, *more = VARIANTS.values()
        results = {}
        for process, watch in (("cold", []), ("warm", ["--watch-loads"])):
            argv = [*first, *watch, *(f"--also={shlex.join(options)}" for options in more)]
            results[process] = dict(zip(VARIANTS, run(models, *argv, env=env), strict=True))
        return results

    files = {"progmodels.py": MODELS + TYPE_CHECKED + COPIES + DECORATED, "helper.py": HELPER}
    captured = captured_models(tmp_path_factory, "test_program_variants", files, cold_then_warm)
    return {**captured.pop("report"), **captured}


def run(models: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(CHILDREN / "program.py"), str(models), *args],
                          capture_output=True, text=True,
                          env=on_import_path(env or child_env(), models), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_correct(result: dict) -> None:
    assert result["max_error"] <= 1e-5, result
    assert result["grad_error"] <= 1e-5, result
    assert result["stats"]["errors"] == 0, result
    assert not result["warnings"], result["warnings"]


def assert_warm(result: dict, programs: int = 1) -> None:
    """Loaded: no Dynamo capture, no LTC trace, no program captured."""
    assert_correct(result)
    stats = result["stats"]
    assert result["frames_ok"] == 0, result
    assert stats.get("program_hits", 0) == programs, result
    assert stats.get("program_captures", 0) == 0, result
    assert stats["traces"] == 0, result


def assert_captured(result: dict, programs: int = 1) -> None:
    assert_correct(result)
    assert result["stats"].get("program_captures", 0) == programs, result
    assert result["stats"].get("program_fallbacks", 0) == 0, result


def program_keys(directory: Path) -> list[str]:
    store = ReadOnlyDiskStore(directory)
    try:
        keys = list(store.keys())
        return [k for k in keys if is_entry_key(k)
                and decode(store.peek(k)).kind == "program"]
    finally:
        store.close()


def stored_checks(directory: Path, graph_name: str) -> list:
    """The portable checks of the one program named ``graph_name`` stored in
    ``directory``."""
    store = ReadOnlyDiskStore(directory)
    try:
        (checks,) = [entry.payload["checks"] for entry in map(decode, map(
            store.peek, program_keys(directory))) if entry.graph_name == graph_name]
        return checks
    finally:
        store.close()


@pytest.mark.slow  # child processes
def test_cold_then_warm(stored, cache_dir):
    models, cold = stored
    assert any("captured and stored program" in line for line in cold["logs"]), cold["logs"]
    assert cold["same_state"] and cold["same_parameters"]

    warm = run(models)
    assert_warm(warm)
    assert warm["stats"]["hits"] > 0 and warm["stats"]["misses"] == 0
    assert warm["outputs"] == cold["outputs"]
    assert len(program_keys(cache_dir)) == 1


@pytest.mark.slow  # the shared child processes
def test_training_cold_then_warm(variants):
    cold, warm = variants["cold"]["train"], variants["warm"]["train"]
    assert_captured(cold)
    assert_warm(warm)
    assert warm["outputs"] == cold["outputs"]
    # What the warm start rebuilt (the program, both graphs of the training
    # plan, each region's IR) it rebuilt with the cyclic collector held off,
    # and the collector is on again after.
    seen = warm["loads"]
    assert seen["after"] == [True], seen
    assert len(seen["program"]) == 1 and len(seen["plan"]) == 2 and seen["ir"], seen
    assert not any(seen["program"] + seen["plan"] + seen["ir"]), seen
    # The plan was found by the key parts stored with the program's graph,
    # which the cold process computed as the backend keys the graph: the
    # Dynamo graph itself was never unpickled (docs/torch/dynamo.md#program-stores-graph-key-parts).
    assert "dynamo_graph" not in seen, seen
    # The checks ran as the cold process compiled them
    # (docs/torch/dynamo.md#three-load-costs-paid-elsewhere).
    assert "checks_compile" not in seen, seen
    # Through LTC, not eagerly: the backend's AOTAutograd path runs outside
    # the AOTAutograd-cache settings aot_compile forces; the warm process
    # builds the forward and backward from the stored training plan instead.
    for result in (cold, warm):
        assert result["stats"]["ltc_ops"] > 0, result
    assert cold["stats"].get("aot_graphs", 0) > 0, cold
    assert warm["stats"].get("aot_traces", 0) == 0 and warm["stats"].get("plan_hits", 0) > 0, warm


@pytest.mark.slow  # the shared child processes
def test_a_guard_through_a_global_named_after_an_object_id_loads_warm(variants):
    """``type(x) is torch.Tensor`` makes Dynamo install ``torch`` as a global
    named after its object id (``_<id>_c0``) and guard ``torch.Tensor``
    through it (DeBERTa-v2, FNet and LayoutLM do this): such a check never
    held in the next process, which captured again on every start. It is
    stored through the module's name instead, so the warm process loads."""
    cold, warm = variants["cold"]["type_checked"], variants["warm"]["type_checked"]
    assert_captured(cold)
    checks = stored_checks(variants["cache"], "TypeChecked.program")
    exprs = [expr for expr, _, _ in checks]
    assert any("__import__('torch'" in expr and expr.endswith(".Tensor") for expr in exprs), exprs
    assert not any(re.search(r"_\d{6,}_c\d", expr) for expr in exprs), exprs
    assert_warm(warm)
    assert warm["outputs"] == cold["outputs"]


def test_a_global_named_after_an_object_id_is_never_checked_by_that_name():
    """The rewrite on its own: a module global goes by the module's name; any
    other value named after an object id is refused (the program is not
    stored, rather than stored to fail every later load)."""
    import torch

    from ltc_cache.errors import Unportable
    from ltc_cache.program.guards import names_process_specific, portable_expression

    name = f"_{id(torch)}_c0"
    expr = f"G[{name!r}].Tensor"
    assert names_process_specific(expr) and not names_process_specific("G['torch'].Tensor")
    portable = portable_expression(expr, {name: torch})
    assert portable == "__import__('torch', fromlist=['_']).Tensor"
    assert eval(portable, {"__builtins__": __builtins__}) is torch.Tensor
    assert portable_expression("G['torch'].Tensor", {}) == "G['torch'].Tensor"
    with pytest.raises(Unportable, match="object id"):
        portable_expression(f"G['__weakref_{id(expr)}_c1']()", {f"__weakref_{id(expr)}_c1": 1})


@pytest.mark.slow  # the shared child processes, and one more
def test_a_config_deep_copied_in_forward_loads_warm_and_a_changed_one_misses(
        variants, cache_dir, monkeypatch):
    """Encoder-decoder models deep-copy their config in ``forward``, and
    ``copy.deepcopy`` reads ``id(config)``: Dynamo guards the config's
    identity (and that of each value it copies), which no process but the
    capturing one has, and checks class attributes are absent from its
    ``__dict__``. The identities become checks of class and aliasing (no
    check names an address or id), so the warm process loads; a config
    that holds another value than the one the program was traced with
    still misses."""
    cold, warm = variants["cold"]["copies"], variants["warm"]["copies"]
    assert_captured(cold)
    checks = stored_checks(variants["cache"], "Copies.program")
    assert any(kind == "object" for _, kind, _ in checks), checks
    # Nothing process-specific: no global named after an id, no id or address as a value.
    assert not any(re.search(r"_\d{6,}_c\d|0x[0-9a-f]{6,}", expr) for expr, _, _ in checks)
    assert not any(isinstance(v, int) and v > 2**20 for _, _, v in checks), checks
    assert_warm(warm)
    assert warm["outputs"] == cold["outputs"]
    # (In a copy of the shared cache, under its signing key.)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(variants["config"]))
    shutil.copytree(variants["cache"], cache_dir)
    other = run(variants["models"], "--model", "copies_scaled")
    assert_correct(other)
    assert other["stats"].get("program_hits", 0) == 0, other
    assert any("does not fit this call" in line for line in other["logs"]), other["logs"]
    assert other["outputs"] != cold["outputs"]


def test_object_checks_compare_class_and_aliasing():
    """Two sources that were one object at capture must be one object on
    load, two distinct ones distinct; the class must be described alike."""
    from ltc_cache.errors import Unportable
    from ltc_cache.program.checks import identity_check
    from ltc_cache.program.guards import Checks

    class Config:
        pass

    shared, other = Config(), Config()
    seen: list = []
    one = [identity_check(f"L[{n!r}]", "ID_MATCH", ("ID_MATCH",), True, shared, seen)
           for n in ("a", "b")]
    two = [one[0], identity_check("L['b']", "ID_MATCH", ("ID_MATCH",), True, other, seen)]
    assert [c[2][1] for c in one] == [0, 0] and two[1][2][1] == 1
    assert Checks(one).resolve({"a": shared, "b": shared}, {}) is None
    assert Checks(one).resolve({"a": shared, "b": other}, {}) is not None
    assert Checks(two).resolve({"a": other, "b": shared}, {}) is None
    assert Checks(two).resolve({"a": shared, "b": shared}, {}) is not None
    assert Checks(one).resolve({"a": 1, "b": 1}, {}) is not None  # another class
    fits = Checks(one)
    assert fits.resolve({"a": shared, "b": shared}, {}) is None
    assert fits.fast({"a": shared, "b": shared}, {}) and not fits.fast({"a": other, "b": other}, {})
    with pytest.raises(Unportable, match="sentinel"):
        identity_check("L['a']", "ID_MATCH", ("ID_MATCH",), True, object(), [])


@pytest.mark.slow  # the shared child processes
def test_decorated_function(variants):
    # The decorated function (DECORATED) compiles itself; the child calls it
    # again through ltc_cache.compile, which must not nest a second program.
    cold, warm = variants["cold"]["decorated"], variants["warm"]["decorated"]
    assert cold["max_error"] == 0.0, cold
    assert warm["max_error"] == 0.0 and warm["frames_ok"] == 0, warm
    assert warm["stats"].get("program_hits", 0) >= 1, warm


@pytest.mark.slow
def test_edited_sources_are_never_run_stale(models, cache_dir):
    assert_captured(run(models))

    # A function Dynamo inlined from another module, edited.
    (models / "helper.py").write_text(HELPER.replace("torch.relu(x)", "torch.relu(x) * 0.5"))
    edited = run(models)
    assert_captured(edited)
    assert any("is stale" in line and "act" in line for line in edited["logs"]), edited["logs"]
    assert_warm(run(models))

    # A module global the forward reads (a guard Dynamo saves), edited in
    # the file: same key, same function sources.
    (models / "progmodels.py").write_text(MODELS.replace("SCALE = 2.0", "SCALE = 3.0"))
    rescaled = run(models)
    assert_captured(rescaled)
    assert any("does not fit this call" in line for line in rescaled["logs"]), rescaled["logs"]
    assert_warm(run(models))


@pytest.mark.slow  # child processes
def test_a_global_rebound_after_loading_is_seen(stored):
    models, _ = stored
    warm = run(models, "--call", "2x16:float32", "--call", "2x16:float32", "--set", "SCALE=5.0")
    # The first call loads; after SCALE changes the guard fails and the
    # program is captured again, with the right result.
    assert_correct(warm)
    assert warm["stats"]["program_hits"] == 1 and warm["stats"]["program_captures"] == 1, warm


@pytest.mark.slow
def test_shapes_dtypes_grad_mode_and_structure(models, cache_dir):
    calls = ["--call", "2x16:float32", "--call", "3x16:float32", "--call", "2x16:float64",
             "--call", "2x16:float64:grad"]
    cold = run(models, *calls)
    assert_captured(cold, programs=4)
    warm = run(models, *calls)
    assert_warm(warm, programs=4)
    assert warm["outputs"] == cold["outputs"]
    assert len(program_keys(cache_dir)) == 4

    # Another structure (three layers): another key, captured, correct.
    deeper = run(models, "--model", "deeper")
    assert_captured(deeper)


def _poison(cache_dir: Path, how: str, marker: Path) -> None:
    """Rewrite the one program entry with a pickle payload in its artifact,
    the entry's own checksum made valid again."""
    store = DiskStore(cache_dir)
    try:
        (key,) = program_keys(cache_dir)
        entry = decode(store.get(key))
        program = dict(entry.payload)
        program["artifact"] = pickle.dumps(Payload(str(marker)))
        if how == "unsigned":
            del program["hmac"]
        elif how == "other key":
            from ltc_cache.program.program_entries import sign

            program["hmac"] = sign(b"x" * 64, key, program["sources"], program["checks"],
                                   program["globals"], program["artifact"])
        store.put(key, encode(dataclasses.replace(entry, payload=program)))
    finally:
        store.close()


@pytest.mark.slow  # five child processes
def test_poisoned_program_entries_are_never_unpickled(stored, cache_dir, tmp_path):
    """An entry poisoned each way in turn (its signature left, dropped, or
    made with another key): each next process refuses it with a warning,
    captures and stores a good one, which the last process loads."""
    models, _ = stored
    marker = tmp_path / MARKER
    # Sanity: the payload does run when unpickled.
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Payload(str(probe))))
    assert probe.exists()

    for how in ("tampered", "unsigned", "other key"):
        _poison(cache_dir, how, marker)
        warm = run(models)
        assert not marker.exists(), f"a poisoned program entry ({how}) was unpickled"
        assert warm["max_error"] <= 1e-5, (how, warm)
        assert warm["stats"]["program_captures"] == 1, (how, warm)  # refused, captured, replaced
        assert any("program" in w for w in warm["warnings"]), (how, warm)
    assert_warm(run(models))
    assert not marker.exists()


@pytest.mark.slow  # the shared child processes
def test_a_graph_break_is_a_program_of_several_frames(variants):
    # (More in tests/program/test_frames.py.)
    cold, warm = variants["cold"]["broken"], variants["warm"]["broken"]
    assert_captured(cold)
    lines = [line for line in cold["logs"] if "frames" in line]
    assert len(lines) == 1 and "graph_break()" in lines[0], cold["logs"]

    assert_warm(warm)
    assert warm["outputs"] == cold["outputs"]


@pytest.mark.slow
def test_export_and_import_carry_programs(stored, cache_dir, tmp_path):
    models, _ = stored
    bundle = tmp_path / "warm.ltcb"
    cli = [str(SCRIPT)]
    subprocess.run([*cli, "--dir", str(cache_dir), "export", str(bundle)], check=True,
                   capture_output=True)
    other = tmp_path / "other"
    subprocess.run([*cli, "--dir", str(other), "import", str(bundle)], check=True,
                   capture_output=True)
    warm = run(models, env=child_env(LTC_CACHE_DIR=str(other)))
    assert_warm(warm)


@pytest.mark.slow  # the shared cold process
def test_cli_lists_shows_counts_and_prunes_programs(stored, cache_dir, capsys):
    from ltc_cache.cli import main

    def cli(*args: str) -> str:
        """``ltc-cache --dir cache_dir args`` in this process: its output."""
        assert main(["--dir", str(cache_dir), *args]) == 0, capsys.readouterr()
        return capsys.readouterr().out

    listing = json.loads(cli("ls", "--json", "--filter", "kind=program"))
    (row,) = listing["entries"]
    assert row["graph_name"] == "Net.program" and row["node_count"] > 0
    shown = cli("show", row["key"][:12])
    assert "portable checks" in shown and "Kind" in shown
    shown_json = json.loads(cli("show", row["key"][:12], "--json"))
    assert "artifact" not in shown_json["payload"]
    assert shown_json["payload"]["artifact_size"] > 0
    stats = json.loads(cli("stats", "--json"))
    assert stats["entries"] >= 2
    cli("verify")
    cli("prune", "--older-than", "0s", "--yes")
    assert program_keys(cache_dir) == []


def test_compile_takes_torch_compile_arguments_only():
    import torch

    with pytest.raises(TypeError, match="ltc_cache backend"):
        ltc_cache.compile(torch.nn.Linear(2, 2), backend="inductor")
    module = torch.nn.Linear(2, 2)
    assert ltc_cache.compile(module, disable=True) is module
    decorate = ltc_cache.compile(fullgraph=True)
    compiled = decorate(torch.nn.Linear(2, 2))
    assert isinstance(compiled, ltc_cache.CompiledModule)
    assert isinstance(compiled, torch.nn.Module)
    compiled.eval()
    assert not compiled._orig_mod.training
    assert compiled.in_features == 2  # attributes pass through
    assert list(compiled.state_dict()) == ["weight", "bias"]


@pytest.mark.slow  # the shared cold process
def test_program_entries_are_plain_msgpack_entries(stored, cache_dir):
    """Everything but the artifact is data a listing reads without torch."""
    (key,) = program_keys(cache_dir)
    store = ReadOnlyDiskStore(cache_dir)
    try:
        envelope = msgpack.unpackb(store.peek(key), raw=False)
    finally:
        store.close()
    body = msgpack.unpackb(envelope["body"], raw=False)
    program = body["payload"]
    assert body["kind"] == "program"
    assert isinstance(program["artifact"], bytes) and isinstance(program["hmac"], bytes)
    assert all(len(record) == 5 for record in program["sources"])
    assert any(record[4] == "act" for record in program["sources"])


# -- in-process: the parts of ltc_cache.program.program_entries ------------------------------


def test_the_per_user_key_is_private_and_outside_the_cache(tmp_path, monkeypatch):
    from ltc_cache.signing import key_path, program_secret

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cache = tmp_path / "cache"
    first = program_secret(None, cache)
    path = key_path()
    assert path.is_relative_to(tmp_path / "config") and not path.is_relative_to(cache)
    assert path.stat().st_mode & 0o777 == 0o600
    assert program_secret(None, cache) == first and len(first) >= 32
    assert program_secret(b"shared", cache) == b"shared"  # LTC_CACHE_SECRET wins
    path.chmod(0o640)
    with pytest.raises(PermissionError, match="chmod 600"):
        program_secret(None, cache)
    path.chmod(0o600)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cache))
    with pytest.raises(PermissionError, match="inside the cache directory"):
        program_secret(None, cache)


def test_program_signatures_bind_every_part_and_the_key(tmp_path):
    from ltc_cache.entries.keys import key_from_parts
    from ltc_cache.errors import EntryError
    from ltc_cache.program.program_entries import program_entry, program_parts

    key = key_from_parts({"a": "1" * 64})
    code = [["0" * 64, marshal.dumps(compile("x = 1", "<checks>", "exec"))]]
    entry = program_entry(key, "m.program", sources=[["f", 1, 2, "d", "q"]], checks=[],
                          globals_=["SCALE"], artifact=b"pickle", secret=b"k" * 32,
                          node_count=3, checks_code=code)
    parts = program_parts(entry, b"k" * 32)
    assert parts.artifact == b"pickle" and parts.checks_code == code
    with pytest.raises(EntryError, match="signature mismatch"):
        program_parts(entry, b"j" * 32)
    # The checks' code is run by a later process: signed like the rest.
    other_code = [["0" * 64, marshal.dumps(compile("import os", "<checks>", "exec"))]]
    for field, value in [("artifact", b"other"), ("sources", []), ("checks", [["x", "eq", 1]]),
                         ("globals", []), ("checks_code", other_code)]:
        changed = dataclasses.replace(entry, payload={**entry.payload, field: value})
        with pytest.raises(EntryError, match="signature mismatch"):
            program_parts(changed, b"k" * 32)
    moved = dataclasses.replace(entry, key="f" * 64)
    with pytest.raises(EntryError, match="signature mismatch"):
        program_parts(moved, b"k" * 32)
    unsigned = {**entry.payload}
    del unsigned["hmac"]
    with pytest.raises(EntryError, match="unsigned"):
        program_parts(dataclasses.replace(entry, payload=unsigned), b"k" * 32)


def _module_from(path: Path) -> Any:
    """The module of the Python file ``path``, imported under its stem."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sources_are_compared_line_for_line(tmp_path):
    import linecache

    from ltc_cache.errors import Unportable
    from ltc_cache.program.describe import changed_source, code_record

    path = tmp_path / "mod_src.py"
    path.write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x\n")
    record = code_record(_module_from(path).f.__code__)
    assert record[:3] == [str(path), 1, 3] and record[4] == "f"
    assert changed_source([record]) is None
    path.write_text("def f(x):\n    return x + 2\n\n\ndef g(x):\n    return x\n")
    linecache.checkcache(str(path))
    assert "f" in changed_source([record])
    assert code_record(compile("1", "<frozen thing>", "eval")) is None
    with pytest.raises(Unportable):
        code_record(compile("1", "<nowhere>", "eval"))


def test_a_source_file_with_its_recorded_stat_is_not_read_again(tmp_path, monkeypatch):
    import linecache
    import os

    from ltc_cache.entries.keys import key_from_parts
    from ltc_cache.errors import EntryError
    from ltc_cache.program import describe
    from ltc_cache.program.describe import changed_source, code_record, source_stats
    from ltc_cache.program.program_entries import program_entry, program_parts

    path = tmp_path / "mod_stat.py"
    path.write_text("def f(x):\n    return torch.tanh(x)\n")
    record = code_record(_module_from(path).f.__code__)
    # Just written: an edit within the same clock tick could keep its times.
    assert source_stats([record]) == []
    monkeypatch.setattr(describe, "_RACY_NS", 0)  # as if written long ago
    stats = source_stats([record])
    st = path.stat()
    assert stats == [[str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]]

    def no_reading(*args):
        raise AssertionError("read a file whose stat is recorded")

    with monkeypatch.context() as m:
        m.setattr(linecache, "getlines", no_reading)
        assert changed_source([record], stats) is None
        # A record of size and mtime alone (older programs) vouches for nothing.
        with pytest.raises(AssertionError, match="read a file"):
            changed_source([record], [[str(path), st.st_size, st.st_mtime_ns]])

    # The same length, the modification time put back: the change time
    # moved, so the file is read, and the edit is seen.
    path.write_text("def f(x):\n    return torch.relu(x)\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    linecache.checkcache(str(path))
    assert "f" in changed_source([record], stats)
    assert "f" in changed_source([record], [["x", "malformed"]])
    # The stats decide what a later process reads: signed with the rest.
    path.write_text("def f(x):\n    return torch.tanh(x)\n")
    linecache.checkcache(str(path))
    key = key_from_parts({"a": "1" * 64})
    entry = program_entry(key, "m.program", sources=[record], checks=[], globals_=[],
                          artifact=b"pickle", secret=b"k" * 32, node_count=1)
    assert program_parts(entry, b"k" * 32).source_stats == source_stats([record]) != []
    forged = dataclasses.replace(entry, payload={**entry.payload, "source_stats": []})
    with pytest.raises(EntryError, match="signature mismatch"):
        program_parts(forged, b"k" * 32)


def test_objects_are_described_by_what_they_are():
    import enum
    import operator

    import torch

    from ltc_cache.errors import Unportable
    from ltc_cache.program.describe import describe

    def make(k):
        def inner(x):
            return x * k
        return inner

    assert describe(make(2)) == describe(make(2))
    assert describe(make(2)) != describe(make(3))  # the closure counts

    def other(x):
        return x + 1

    def other2(x):
        return x + 2

    assert describe(other) != describe(other2)
    assert describe(torch) == ["module", "torch"]
    assert describe(operator.index) == describe(operator.index)
    assert describe(torch.relu)[0] == "builtin"

    class Color(enum.Enum):
        RED = 1

    assert describe(Color.RED) == ["enum", describe(Color.RED)[1], "RED"]

    class A:
        SCALE = 2

        def f(self):
            return 1

    class B:
        SCALE = 3

        def f(self):
            return 1

    B.__qualname__ = A.__qualname__
    assert describe(A) != describe(B)  # a class constant counts
    assert describe(int | None) == describe(int | None) != describe(float | None)
    assert describe(A | None) != describe(B | None)  # a union's classes by what they are
    with pytest.raises(Unportable):
        describe(object())


def test_the_graph_keeps_what_aotautograd_reads_through_serialisation(dynamo_reset):
    """torch's graph pickler drops each placeholder's ``_dynamo_source``;
    AOTAutograd asserts on it for a Dynamo graph (training)."""
    import torch

    from ltc_cache.program.program_graph import LtcProgramGraph

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = torch.nn.Linear(4, 4)
    torch.compile(model, backend=keep, fullgraph=True)(torch.randn(2, 4))
    (gm,) = graphs
    sources = [n._dynamo_source for n in gm.graph.find_nodes(op="placeholder")]
    assert all(s is not None for s in sources)
    data = LtcProgramGraph.serialize_compile_artifacts(LtcProgramGraph(gm, "Linear"))
    loaded = LtcProgramGraph.deserialize_compile_artifacts(data)
    assert [n._dynamo_source for n in loaded.gm.graph.find_nodes(op="placeholder")] == sources
    assert loaded.gm.code == gm.code  # the same graph: the same LTC cache keys


@pytest.mark.slow
def test_programs_are_evicted_like_any_entry(models, cache_dir):
    """Under LTC_CACHE_MAX_SIZE a program is an entry like the others: the
    least recently used go, and an evicted program is captured again."""
    env = child_env(LTC_CACHE_MAX_SIZE="2KB")
    cold = run(models, env=env)
    assert_captured(cold)
    assert program_keys(cache_dir) == []  # evicted by the graph entries stored after it
    stats = json.loads(subprocess.run([str(SCRIPT), "--dir", str(cache_dir), "stats", "--json"],
                                      check=True, capture_output=True, text=True).stdout)
    assert stats["counters"]["evictions"] >= 1
    again = run(models, env=env)
    assert_captured(again)


def test_a_capture_starts_the_fuse_worker_before_anything_is_traced(cache_dir, monkeypatch,
                                                                     dynamo_reset):
    """A program capture is a cold run's first miss: the fused tier's worker
    is started then, before Dynamo, AOTAutograd or LTC has traced a graph
    (its compile imports Inductor while they do)."""
    import torch

    from ltc_cache.graph.fused import tier

    monkeypatch.setenv("LTC_CACHE_FUSE", "background")
    seen: list[dict] = []
    monkeypatch.setattr(tier, "start_worker", lambda directory: seen.append(ltc_cache.stats()))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    torch.testing.assert_close(ltc_cache.compile(model)(x), model(x))
    after = ltc_cache.stats()
    assert after["program_captures"] == 1 and after["traces"] >= 1, after
    assert seen, "no worker started"
    first = seen[0]
    assert first.get("program_captures") == 1, first
    assert [first.get(n, 0) for n in ("dynamo_graphs", "aot_traces", "traces")] == [0, 0, 0]
