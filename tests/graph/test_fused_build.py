"""The fused tier for real: libraries compiled by AOTInductor with g++
(10-30 s each here, so a few tiny graphs), stored, and loaded by other
processes. Fast tests of the same code without a compiler:
tests/graph/test_fused.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import child_env, json_child, once_per_run
from torch import fx, nn

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.graph.fused import pickup, tier
from ltc_cache.graph.fused.cpu_isa import inductor_isa
from ltc_cache.graph.fused.library_entries import fused_entry, library_of
from ltc_cache.graph.fused.platform import fused_key, source_key
from ltc_cache.graph.fused.runner import FusedFunction

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                       reason="no C++ compiler"),
]


def fused_env(cache_dir, mode: str, tmp_path) -> dict[str, str]:
    # The signing key of libraries lives in the test's own config directory.
    return child_env(LTC_CACHE_DIR=str(cache_dir), LTC_CACHE_FUSE=mode,
                     XDG_CONFIG_HOME=str(tmp_path / "config"))


# The CPU as it is, and where it has more than AVX2, as an AVX2 one: a
# developer on an AVX-512 machine runs the AVX2 path too.
CPU_AS = [None, *(["avx2"] if "avx512" in inductor_isa() else [])]


def _narrower_capability() -> str:
    """An ATEN_CPU_CAPABILITY that makes this machine another kind of CPU
    for torch and Inductor: AVX2 where it has AVX-512, else none at all."""
    return "avx2" if "avx512" in inductor_isa() else "default"


@pytest.mark.parametrize("capability", CPU_AS, ids=lambda c: f"as {c or 'it is'}")
def test_cold_compiles_warm_loads_and_both_match_eager(cache_dir, tmp_path, capability):
    """A graph that updates an argument in place and returns another as it
    is (zoo/corner_models.py); a training step's forward and backward
    regions. One process compiles them (LTC_CACHE_FUSE=sync), the next
    loads the three libraries, tracing nothing."""
    env = fused_env(cache_dir, "sync", tmp_path)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    runs = {}
    for name in ("cold", "warm"):
        run = runs[name] = json_child("fused.py", "inplace_update", env=env, timeout=600)
        assert not run["failures"], run["failures"]
        assert run["error"] < 1e-5, run
    graphs, stats = run["graphs"], run["stats"]
    assert graphs["traces"] == 0 and graphs["fused_loads"] == 1, run
    assert stats["traces"] == 0 and stats["fused_loads"] - graphs["fused_loads"] == 2, run
    assert "fused_refused" not in stats and "fused_queued" not in stats
    # Checked once: the cold process compared each library's first call
    # with TorchScript and kept the verdicts; the warm one trusts them.
    cold = runs["cold"]["stats"]
    assert cold["fused_checks"] == cold["fused_loads"] >= 3, cold
    assert "fused_checks" not in stats, run
    _libraries_as_compiled(cache_dir, tmp_path)


def _libraries_as_compiled(cache_dir: Path, tmp_path: Path) -> None:
    """Each stored library uses no vector register wider than the ISA it
    records: one for AVX2 (an AVX-512 machine made an AVX2 one, above)
    holds no zmm, which an AVX2 CPU would die on. None holds the input
    checks Inductor writes into a wrapper (graph/fused/aoti.py leaves them
    out: their compile was a quarter of the wrapper's); each holds
    AOTInductor's interface, compiled once and linked in."""
    from ltc_cache.entries.entry import decode
    from ltc_cache.store import ReadOnlyDiskStore

    if shutil.which("objdump") is None:
        return
    store = ReadOnlyDiskStore(cache_dir)
    try:
        entries = [decode(store.get(key)) for key in store.keys()  # noqa: SIM118 (a store)
                   if len(key) == 64]
    finally:
        store.close()
    libraries = [e.payload for e in entries if "library" in e.payload]
    assert libraries
    for payload in libraries:
        assert b"check_input_0" not in payload["library"]
        # The interface compiled once and linked in: what a runner calls.
        assert b"AOTInductorModelContainerRun" in payload["library"]
        assert b"unmatched dim value" not in payload["library"]
        path = tmp_path / "library.so"
        path.write_bytes(payload["library"])
        code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                              capture_output=True, text=True, check=True).stdout
        if "AVX512" not in payload["isa"]:
            assert "%zmm" not in code, payload["isa"]


def test_a_mixed_fleet_compiles_each_cpu_kinds_library_once(cache_dir, tmp_path):
    """Two kinds of CPU (this one, and this one made narrower by
    ATEN_CPU_CAPABILITY, as torch and Inductor read it) alternating over one
    directory, six processes: each kind compiles its library once and
    loads it after; neither replaces the other's. Each process runs two
    layers that differ only in their parameter's name (two graph entries):
    one library serves both."""
    env = fused_env(cache_dir, "sync", tmp_path)
    code = ("import torch, ltc_cache, json; from torch import fx; "
            "from graph.test_fused_build import Scaled; x = torch.randn(4, 8)\n"
            "for name in ('w', 'v'):\n"
            "    m = Scaled(name)\n"
            "    c = ltc_cache.extract_compiled_graph(fx.symbolic_trace(m), [x])\n"
            "    with torch.no_grad():\n"
            "        assert torch.allclose(c(x)[0], m(x)) and torch.allclose(c(x)[0], m(x))\n"
            "print(json.dumps(ltc_cache.stats()))")
    compiles = []
    for capability in [None, _narrower_capability()] * 3:
        run_env = dict(env, **({"ATEN_CPU_CAPABILITY": capability} if capability else {}))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=run_env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        stats = json.loads(proc.stdout.splitlines()[-1])
        compiles.append(stats.get("fused_compiles", 0))
        assert "fused_refused" not in stats, stats
        assert stats["fused_loads"] == 2, stats
    assert compiles == [1, 1, 0, 0, 0, 0]


class Scaled(nn.Module):
    """``tanh(x * w) + 1``, its weight under the attribute ``name``: a
    layer that differs from another only in its parameter's name."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.weight_name = name
        self.register_parameter(name, nn.Parameter(torch.full((8,), 1.5)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * getattr(self, self.weight_name)) + 1


class Act(nn.Module):
    """``fn(x * 1.5) + 1``: the scale is a graph input (a captured scalar),
    the function is code."""

    def __init__(self, fn=torch.tanh) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x * 1.5) + 1


@pytest.fixture(scope="session")
def background(tmp_path_factory) -> dict:
    """Once for the whole run: a cache whose library of ``Act()`` a
    background worker compiled (its own session, idle priority) while the
    caller kept calling now and then, on TorchScript. What the caller saw, the next
    process's stats, and the cache and signing key's config directories."""

    def compile_in_the_background(root: Path) -> dict:
        directory = root / "ltc"
        seen: dict = {}
        with pytest.MonkeyPatch.context() as mp:
            for name in [n for n in os.environ if n.startswith("LTC_CACHE_")]:
                mp.delenv(name)
            mp.setenv("LTC_CACHE_DIR", str(directory))
            mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
            mp.setenv("LTC_CACHE_FUSE", "background")
            cache = GraphCache(CacheConfig.from_env())
            model, x = Act(), torch.randn(4, 8)
            started = time.monotonic()
            compiled = cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
            seen["extract_seconds"] = time.monotonic() - started
            key = fused_key(source_key(compiled.entry))
            calls, deadline = 0, time.monotonic() + 300
            log = directory / "fuse-queue" / "worker.log"
            stored_at = used_at = None
            # Calling on until the caller runs the library, picked up once the
            # worker stored it: seconds from the first call that found it
            # stored (the store read before each call) to the first on it.
            while used_at is None:
                assert time.monotonic() < deadline, log.read_text()
                if stored_at is None and cache.lookup_entry(key, count=False) is not None:
                    stored_at, seen["calls"] = time.monotonic(), calls
                torch.testing.assert_close(compiled(x)[0], model(x))
                calls += 1
                # A serving process between requests: the worker compiles
                # while its clients are idle (tests/graph/test_fused_governor.py).
                time.sleep(0.02)
                if isinstance(compiled._fn.function, FusedFunction):
                    used_at = time.monotonic()
                elif stored_at is not None and not compiled._fn.waiting:
                    break  # resolved without a library: the assertions say so
            seen["pickup_seconds"] = None if used_at is None else used_at - stored_at
            seen["caller_fused"] = used_at is not None
            seen["caller_stats"] = {k: v for k, v in ltc_cache.stats().items()
                                    if k.startswith("fused")}
            seen["stored_library"] = "library" in cache.lookup_entry(key, count=False).payload
            queue = tier.FuseQueue(directory)
            deadline = time.monotonic() + 60
            while queue.pending():  # the worker takes the key off once stored
                assert time.monotonic() < deadline
                time.sleep(0.05)  # a core left for the worker, at the lowest priority
            cache.store.close()

            code = ("import torch, ltc_cache, json; from torch import fx; "
                    "from graph.test_fused_build import Act; m = Act(); x = torch.randn(4, 8); "
                    "c = ltc_cache.extract_compiled_graph(fx.symbolic_trace(m), [x]); "
                    "assert torch.allclose(c(x)[0], m(x)) and torch.allclose(c(x)[0], m(x)); "
                    "print(json.dumps(ltc_cache.stats()))")
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=child_env(), timeout=300)
        seen["next_process"] = {"returncode": proc.returncode, "stdout": proc.stdout,
                                "stderr": proc.stderr[-3000:]}
        return seen

    root, seen = once_per_run(tmp_path_factory, "fused_background", compile_in_the_background)
    return {**seen, "directory": root / "ltc", "config": root / "config"}


def test_a_background_worker_compiles_while_the_caller_keeps_calling(background):
    """The caller never waits: its calls run on TorchScript while the worker
    (its own session, idle priority) compiles, and on the library within
    about a second of its being stored, compared with TorchScript on its
    first call there; the next process loads it and, given that verdict,
    runs it alone from its first call."""
    assert background["extract_seconds"] < 10  # a trace, no compile
    assert background["calls"] > 10 and background["stored_library"]
    assert background["caller_fused"], background
    # About a look (pickup.LOOK_SECONDS) and a load; the bound leaves room for a
    # loaded machine, where the idle-priority worker waits to take the key off.
    assert background["pickup_seconds"] < 30 * pickup.LOOK_SECONDS, background
    assert background["caller_stats"] == {"fused_queued": 1, "fused_pickups": 1,
                                          "fused_loads": 1, "fused_checks": 1}, background
    proc = background["next_process"]
    assert proc["returncode"] == 0, proc["stderr"]
    assert '"fused_loads": 1' in proc["stdout"] and '"fused_queued"' not in proc["stdout"]
    assert '"fused_checks"' not in proc["stdout"], proc["stdout"]


def test_a_library_of_another_graph_is_caught_on_its_first_call(background, tmp_path,
                                                                monkeypatch):
    """Signed anew for another graph (by someone holding the key), a
    library loads, and its first call gives it away: one warning, a
    refusal stored, TorchScript's results. (Moved under another graph's key
    unsigned anew, it is refused before loading: tests/graph/test_fused.py.)
    The library is the background worker's, of ``Act()`` (tanh); the graph
    ``Act(torch.sigmoid)``."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(background["config"]))
    directory = tmp_path / "ltc"
    shutil.copytree(background["directory"], directory)
    x = torch.randn(4, 8)
    a, b = Act(torch.sigmoid), Act(torch.tanh)
    compiled_a = GraphCache(CacheConfig(directory=directory, fuse="off")).extract_compiled_graph(
        fx.symbolic_trace(a), [x])
    cache = GraphCache(CacheConfig(directory=directory, fuse="sync"))
    compiled_b = cache.extract_compiled_graph(fx.symbolic_trace(b), [x])
    assert isinstance(compiled_b._fn, FusedFunction)  # the worker's library, loaded
    key_a, key_b = fused_key(source_key(compiled_a.entry)), fused_key(source_key(compiled_b.entry))
    library_b = cache.lookup_entry(key_b, count=False)

    from ltc_cache.signing import program_secret

    secret = program_secret(None, directory)
    parts = library_of(library_b, secret, source_key(compiled_b.entry))
    forged = fused_entry(key_a, compiled_a.entry, library=parts.data, isa=parts.isa,
                         aliases=parts.aliases, restride=parts.restride, secret=secret, stats={})
    cache.store_entry(forged, key_a)
    fresh = GraphCache(CacheConfig(directory=directory, fuse="sync"))
    compiled = fresh.extract_compiled_graph(fx.symbolic_trace(a), [x])
    with pytest.warns(RuntimeWarning, match="is not used: output 0: differs"):
        first = compiled(x)
    torch.testing.assert_close(first[0], a(x))
    torch.testing.assert_close(compiled(x)[0], a(x))
    refusal = cache.lookup_entry(key_a, count=False)
    assert "library" not in refusal.payload and "on first use" in refusal.payload["reason"]


def test_a_compile_leaves_unbuilt_precompiled_headers_for_after(tmp_path, monkeypatch):
    """In headers_built_after's block (the worker's compile process), a
    library compiles without waiting for Inductor's precompiled headers,
    which a machine's first compile would build first; they are built as
    the block ends, and the library runs as any other."""
    from torch._inductor import codecache
    from torch.fx.experimental.proxy_tensor import make_fx

    from ltc_cache.graph.fused import aoti
    from ltc_cache.graph.fused.platform import inductor_settings
    from ltc_cache.graph.fused.runner import load_runner

    headers = tmp_path / "headers"  # a machine that has none yet
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(headers))
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", str(headers / "locks"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    codecache._precompile_header.cache_clear()
    try:
        x = torch.randn(4, 8)
        graph = make_fx(lambda x: (torch.tanh(x) * 3 + x,))(x)
        with aoti.headers_built_after():
            library, _ = aoti.compile_library(graph, [x], inductor_settings())
            assert list(headers.glob("*.h")) and not list(headers.glob("*.gch"))
        assert list(headers.glob("*.gch"))
    finally:
        codecache._precompile_header.cache_clear()
    (out,) = load_runner(library).run([x])
    torch.testing.assert_close(out, torch.tanh(x) * 3 + x)
