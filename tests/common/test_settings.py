"""Cache settings never break the user's model: a malformed LTC_CACHE_*
value warns once, naming the variable and what is used instead, and the
model runs (in a real process, through torch.compile)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import CHILDREN, child_env

from ltc_cache import CacheConfig
from ltc_cache.units import parse_size

CHILD = CHILDREN / "compile_net.py"


def run_user_script(*args: str, **env: str) -> dict:
    proc = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True,
                          env=child_env(**env), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


BAD = {
    "LTC_CACHE_DISABLE": ("maybe", "the cache stays on"),
    "LTC_CACHE_READONLY": ("perhaps", "read and write"),
    "LTC_CACHE_MAX_SIZE": ("2 gigs", "no size limit"),
    "LTC_CACHE_REMOTE_TTL": ("bogus", "entries stay in Redis until deleted"),
    "LTC_CACHE_LOCK_TIMEOUT": ("abc", "600 seconds"),
}


@pytest.mark.slow  # a child process (torch.compile)
def test_malformed_settings_warn_once_each_and_the_model_runs(cache_dir):
    report = run_user_script(**{name: value for name, (value, _) in BAD.items()})
    assert report["matched"], report["error"]
    messages = [w["message"] for w in report["warnings"]]
    for name, (value, fallback) in BAD.items():
        said = [m for m in messages if f"{name}={value!r}" in m]
        assert len(said) == 1, (name, messages)
        assert f"using: {fallback}" in said[0]
    # The fallbacks are the defaults: the cache is on and writes.
    assert report["stats"]["traces"] == 1 and report["stats"]["stores"] == 1
    # The warnings point at the user's script, not at ltc_cache or torch.
    assert {w["file"] for w in report["warnings"]} == {str(CHILD)}


@pytest.mark.slow  # a child process (torch.compile)
def test_an_unusable_secret_turns_the_cache_off_and_the_model_runs(cache_dir, tmp_path):
    report = run_user_script(LTC_CACHE_SECRET_FILE=str(tmp_path / "missing-key"))
    assert report["matched"], report["error"]
    (message,) = [w["message"] for w in report["warnings"]]
    assert "LTC_CACHE_SECRET" in message and "the cache is off" in message
    assert report["stats"]["stores"] == 0
    assert not cache_dir.exists()


@pytest.mark.parametrize(("name", "value"), [
    ("LTC_CACHE_MAX_SIZE", "0"), ("LTC_CACHE_MAX_SIZE", "-1GB"), ("LTC_CACHE_MAX_SIZE", "10Mb"),
    ("LTC_CACHE_LOCK_TIMEOUT", "nan"), ("LTC_CACHE_LOCK_TIMEOUT", "-5"),
    ("LTC_CACHE_REMOTE_TTL", "0"), ("LTC_CACHE_REMOTE_TTL", "7 days"),
])
def test_every_malformed_value_falls_back_in_the_library_and_is_refused_strictly(
        name, value, tmp_path):
    env = {"LTC_CACHE_DIR": str(tmp_path), name: value}
    with pytest.warns(RuntimeWarning, match=name):
        config = CacheConfig.from_env(env)
    # LTC_CACHE_FUSE unset is background; a configuration built in code says.
    assert config == CacheConfig(directory=tmp_path, fuse="background")
    with pytest.raises(ValueError, match=name):
        CacheConfig.from_env(env, strict=True)


@pytest.mark.parametrize(("text", "size"), [
    ("1024", 1024), ("10KB", 10_000), ("10kB", 10_000), ("10KiB", 10_240), ("1.5GB", 1.5e9),
    ("1.1KB", 1100), ("2 GiB", 2 * 2**30), ("7B", 7),
])
def test_sizes_follow_one_rule(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["10K", "10kb", "10Mb", "10mb", "1.5", "2 gigs", "1.5B",
                                  "10M", "-1", ""])
def test_sizes_outside_the_rule_are_refused(text):
    with pytest.raises(ValueError, match="powers of 1000"):
        parse_size(text)


@pytest.mark.slow
def test_a_backend_the_program_initialised_itself_is_used_and_nothing_is_remembered(
        cache_dir):
    first = run_user_script("--extract", "--init-ts")
    assert first["matched"], first["error"]
    assert first["stats"]["traces"] == 1 and first["stats"]["stores"] == 1
    second = run_user_script("--extract")
    assert second["matched"], second["error"]
    assert second["stats"]["hits"] == 1 and "negative_hits" not in second["stats"]


def test_a_failure_of_the_process_never_becomes_a_negative_entry(cache_dir, monkeypatch):
    import ltc_cache.graph.extract
    from ltc_cache import GraphCache
    from zoo.corner_models import build, random_inputs

    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    real_trace = ltc_cache.graph.extract.trace
    for failure in (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                                 "allocate 123 bytes"),
                    RuntimeError("Tried to register multiple backend fallbacks for the same "
                                 "dispatch key Lazy")):
        def failing(*args, failure=failure):
            raise failure
        monkeypatch.setattr(ltc_cache.graph.extract, "trace", failing)
        with pytest.raises(RuntimeError):
            GraphCache(CacheConfig.from_env()).extract_compiled_graph(gm, example)
    monkeypatch.setattr(ltc_cache.graph.extract, "trace", real_trace)
    cache = GraphCache(CacheConfig.from_env())
    compiled = cache.extract_compiled_graph(gm, example)  # traced: nothing was remembered
    assert compiled.entry.kind == "graph"


def test_a_negative_entry_that_remembers_the_process_is_dropped(cache_dir):
    # As stored before such failures were told apart (issue 14, item 15).
    from ltc_cache import GraphCache
    from ltc_cache.entries.entry import Entry, encode, new_meta
    from ltc_cache.graph.graph_keys import compute_key
    from zoo.corner_models import build, random_inputs

    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    key = compute_key(gm, example)
    meta = new_meta(graph_name="weighted", node_count=0, graph_hash="", key_parts=key.parts)
    reason = "Tried to register multiple backend fallbacks for the same dispatch key Lazy"
    cache = GraphCache(CacheConfig.from_env())
    cache.store.put(key.digest, encode(Entry(key.digest, "", (), (), (), meta, kind="negative",
                                             payload={"reason": reason})))
    compiled = GraphCache(CacheConfig.from_env()).extract_compiled_graph(gm, example)
    assert compiled.entry.kind == "graph"


@pytest.mark.usefixtures("dynamo_reset")
def test_unknown_and_mistyped_torch_compile_options_are_refused(cache_dir):
    # Issue 14, item 2: nothing torch.compile hands the backend is silently ignored.
    import torch

    model, x = torch.nn.Linear(8, 4).eval(), torch.randn(3, 8)
    with pytest.raises(Exception) as unknown, torch.no_grad():
        torch.compile(model, backend="ltc_cache", options={"foo": 1})(x)
    error = str(unknown.value)
    assert "'foo'" in error and "whole_graph" in error and "name" in error
    torch._dynamo.reset()
    with pytest.raises(Exception, match="True or False"), torch.no_grad():
        torch.compile(model, backend="ltc_cache", options={"whole_graph": "yes"})(x)


@pytest.mark.slow
def test_torch_compile_options_are_checked_and_a_mode_warns(cache_dir, tmp_path):
    # Issue 14, item 2: nothing torch.compile hands the backend is silently
    # ignored (options it refuses: above).
    moded = run_user_script("--mode", "max-autotune")
    assert moded["matched"], moded["error"]
    (warning,) = moded["warnings"]
    assert "mode='max-autotune'" in warning["message"] and warning["file"] == str(CHILD)

    # The name is no part of the key: a directory of its own, so it is stored.
    named_dir = tmp_path / "named"
    named = run_user_script("--options", '{"name": "mine"}', LTC_CACHE_DIR=str(named_dir))
    assert named["matched"], named["error"]
    from ltc_cache.report import scan
    from ltc_cache.store import ReadOnlyDiskStore

    store = ReadOnlyDiskStore(named_dir)
    assert "mine.inference" in {e.graph_name for e in scan(store).entries}
    store.close()


def test_no_home_directory_turns_the_cache_off_instead_of_failing(monkeypatch):
    monkeypatch.delenv("HOME", raising=False)
    import pwd

    # Path.home() falls back to the password database: make that fail too.
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    with pytest.warns(RuntimeWarning, match="LTC_CACHE_DIR.*the cache is off"):
        config = CacheConfig.from_env({})
    assert config.disable
    with pytest.raises(ValueError, match="LTC_CACHE_DIR"):
        CacheConfig.from_env({}, strict=True)
