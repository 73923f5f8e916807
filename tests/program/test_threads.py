"""Many threads calling one compiled callable at once (issue 34): a threaded
server. Every result is eager's, no call raises, and each program, plan and
LTC graph is captured, AOTAutograd-traced and LTC-traced at most once per
process (README, "Threads").

Cold and warm in real child processes (``tests/children/threads.py``: threads
released together by a barrier, 48 calls of a tiny model); the pieces that
make it so in this process.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import child_env, json_child, once_per_run

import ltc_cache
from ltc_cache.compile_backend.first_call import Guarded
from ltc_cache.threads import SharedPatch

THREADS = 4


def serve(route: str, model: str, *options: str, env: dict[str, str] | None = None) -> dict:
    """One child process serving ``model`` through ``route`` on THREADS
    threads at once: checked for errors, wrong results, warnings and LTC
    graphs traced twice, and its report returned."""
    return checked(json_child("threads.py", route, model, "--threads", str(THREADS),
                              *options, env=env or child_env(), timeout=900))


def checked(report: dict) -> dict:
    """``report`` (of one trial), checked for errors, wrong results, warnings
    and LTC graphs traced twice."""
    assert report["errors"] == [], report["errors"][0]
    assert report["wrong"] == [], report["wrong"]  # every call equal to eager's
    assert report["warnings"] == [], report["warnings"]
    assert report["stats"]["errors"] == 0, report["stats"]
    traced = report["traced"]
    assert len(traced) == len(set(traced)), traced  # each LTC graph traced once
    assert report["stats"]["traces"] == report["stats"]["misses"] == len(traced)
    return report


def assert_warm(report: dict) -> None:
    """What a warm process shows: no capture, no AOTAutograd, no LTC trace."""
    stats = report["stats"]
    assert stats.get("program_captures", 0) == 0, stats
    assert stats.get("aot_traces", 0) == 0, stats
    assert stats["traces"] == stats["misses"] == 0, stats


# -- ltc_cache.compile: a module, a function, generate() -----------------------------

# Trials that share a cold and a warm process, one after the other in each,
# counted on their own (their graphs are not each other's).
COMPILED = ("module:mlp", "function:mlp", "module:branchy", "extract:mlp", "torch:mlp")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """Once for the whole run: the trials of COMPILED in a cold process
    over a new cache directory, then in a warm one. ``"cold"`` and
    ``"warm"``: trial -> its report."""

    def cold_then_warm(directory: Path) -> dict:
        env = {k: v for k, v in child_env().items() if not k.startswith("LTC_CACHE_")}
        env.update(LTC_CACHE_DIR=str(directory / "ltc"), LTC_CACHE_FUSE="off",
                   XDG_CONFIG_HOME=str(directory / "config"))
        first, *more = COMPILED
        argv = [*first.split(":"), "--threads", str(THREADS),
                *(arg for trial in more for arg in ("--also", trial))]
        return {process: dict(zip(COMPILED, json_child("threads.py", *argv, env=env,
                                                       timeout=900), strict=True))
                for process in ("cold", "warm")}

    return once_per_run(tmp_path_factory, "test_threads", cold_then_warm)[1]


def test_threads_share_one_program_of_a_module_cold_then_warm(compiled):
    """The issue saw each thread capture (cold) or load (warm) the program
    of its own: 4 captures, 4 loads. One thread does it, the others wait
    and run what it made."""
    cold = checked(compiled["cold"]["module:mlp"])["stats"]
    assert cold["program_captures"] == 1 and cold.get("program_hits", 0) == 0, cold
    assert cold["traces"] == 1, cold
    warm = checked(compiled["warm"]["module:mlp"])
    assert_warm(warm)
    assert warm["stats"]["program_hits"] == 1, warm["stats"]  # loaded once
    assert warm["frames_ok"] == 0  # no Dynamo capture
    # Dynamo's one graph cold; warm, the loaded program's is not counted as one.
    assert cold["dynamo_graphs"] == 1 and warm["stats"].get("dynamo_graphs", 0) == 0, warm


def test_threads_share_one_program_of_a_function_cold_then_warm(compiled):
    cold = checked(compiled["cold"]["function:mlp"])["stats"]
    assert cold["program_captures"] == 1 and cold.get("program_fallbacks", 0) == 0, cold
    warm = checked(compiled["warm"]["function:mlp"])
    assert_warm(warm)
    assert warm["stats"]["program_hits"] == 1, warm["stats"]


def test_threads_share_one_program_of_frames_cold_then_warm(compiled):
    """A model Dynamo breaks into two frames (a branch on a tensor's value):
    the first call of a layout is made by one thread while the others wait,
    so the frames are captured once (each thread captured its own: 7
    frames), and a warm process loads the program once."""
    cold = checked(compiled["cold"]["module:branchy"])
    assert cold["frames_ok"] == 2 and cold["stats"]["dynamo_graphs"] == 2, cold["stats"]
    warm = checked(compiled["warm"]["module:branchy"])
    assert_warm(warm)
    assert warm["stats"]["program_hits"] == 1 and warm["frames_ok"] == 0, warm["stats"]
    assert warm["stats"].get("dynamo_graphs", 0) == 0, warm["stats"]


@pytest.mark.slow  # two processes importing transformers
def test_threads_share_one_program_of_bert_cold_then_warm(cache_dir):
    """The issue's BERT classifier: a partitioned graph, so its first call
    also runs AOTAutograd and traces LTC regions; once each."""
    cold = serve("module", "bert")["stats"]
    assert cold["program_captures"] == 1 and cold["aot_traces"] == 1, cold
    assert cold.get("program_fallbacks", 0) == 0, cold
    warm = serve("module", "bert")
    assert_warm(warm)
    assert warm["stats"]["program_hits"] == 1 and warm["stats"]["plan_hits"] == 1, \
        warm["stats"]
    # Its inference plan was found by the key parts stored with the
    # program's graph: the graph itself was never unpickled
    # (docs/torch/dynamo.md#program-stores-graph-key-parts).
    assert warm["graphs_unpickled"] == 0, warm


@pytest.mark.slow  # two processes generating
def test_threads_generate_through_a_compiled_model_cold_then_warm(cache_dir):
    """``ltc_cache.compile(model).generate`` on 4 threads: tokens equal to
    eager's, one program per layout (the prompt's, the decoding step's),
    and the module's own forward back in place once all are done (it was
    left replaced, and a thread ran its steps eagerly or raised)."""
    cold = serve("generate", "gpt2", "--calls", "8")
    assert cold["forward_restored"]
    assert cold["stats"]["program_captures"] == 2 and cold["stats"]["aot_traces"] == 2, \
        cold["stats"]
    warm = serve("generate", "gpt2", "--calls", "8")
    assert warm["forward_restored"]
    assert_warm(warm)
    assert warm["stats"]["program_hits"] == 2, warm["stats"]


# -- torch.compile(backend="ltc_cache") and extract_compiled_graph -----------------------


def test_threads_through_torch_compile_cold_then_warm(compiled):
    """Dynamo looks for a frame's compiled code before taking its lock and
    not after, so every thread whose first call came with the others
    captured the frame (4 captures cold and warm). Now a thread that
    waited for the lock looks again and runs that one call as it is
    (docs/torch/dynamo.md#dynamo-captures-once-per-missing-thread): one
    capture per frame in a process, cold or warm."""
    cold = checked(compiled["cold"]["torch:mlp"])
    assert cold["frames_ok"] == 1 and cold["stats"]["dynamo_graphs"] == 1, cold["stats"]
    assert cold["stats"]["traces"] == 1
    warm = checked(compiled["warm"]["torch:mlp"])
    assert_warm(warm)
    assert warm["frames_ok"] == 1 and warm["stats"]["dynamo_graphs"] == 1, warm["stats"]


class _Branchy(torch.nn.Module):
    """A branch on a tensor's value: Dynamo compiles two frames (the
    forward up to the branch, and the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if h.sum() > 0:
            h = h * 2
        return self.second(torch.relu(h))


@pytest.mark.parametrize("frames", [1, 2], ids=["one_frame", "graph_break"])
@pytest.mark.usefixtures("dynamo_reset")
def test_threads_whose_first_calls_come_together_capture_a_frame_once(cache_dir, frames):
    """8 threads released together into a model compiled with the backend:
    one captures each frame, the others, waiting for Dynamo's lock
    meanwhile, look again and run that call as it is (each captured the
    frames of its own: 8 and 16 frames); every result is eager's."""
    torch.manual_seed(0)
    model = (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                 torch.nn.Linear(32, 8)) if frames == 1 else _Branchy()).eval()
    compiled = torch.compile(model, backend="ltc_cache")
    captured = torch._dynamo.utils.counters["frames"]["ok"]  # (reset() keeps the counts)
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = model(x)
    barrier, errors, results = threading.Barrier(8), [], []

    def call() -> None:
        barrier.wait()
        try:
            with torch.no_grad():
                results.extend(torch.equal(compiled(x), want) for _ in range(3))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=call) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == [] and results == [True] * 24, errors
    assert torch._dynamo.utils.counters["frames"]["ok"] - captured == frames
    assert ltc_cache.stats()["dynamo_graphs"] == frames


def test_threads_extract_compiled_graph_cold_then_warm(compiled):
    """Every thread extracts the same graph, then calls what it got: one
    trace, the other threads' lookups hits."""
    cold = checked(compiled["cold"]["extract:mlp"])["stats"]
    assert (cold["misses"], cold["traces"], cold["hits"]) == (1, 1, THREADS - 1), cold
    warm = checked(compiled["warm"]["extract:mlp"])
    assert_warm(warm)
    assert warm["stats"]["hits"] == THREADS


@pytest.mark.usefixtures("dynamo_reset")
def test_steady_calls_run_while_another_thread_compiles(cache_dir):
    """One thread calls a compiled model over and over while another
    compiles a new graph on its first call (a symbolic graph's shape,
    trained: AOTAutograd, outside Dynamo). AOTAutograd's FX trace flags
    "FX is tracing" process-wide, and every steady call made meanwhile
    raised "Detected that you are using FX to symbolically trace a
    dynamo-optimized function" (thousands in this test)."""
    torch.manual_seed(0)
    steady = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
                           backend="ltc_cache")
    trained = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                                torch.nn.Linear(16, 4)),
                            backend="ltc_cache", dynamic=True)
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = steady(x)
    stop, errors, calls = threading.Event(), [], [0]

    def call_steadily() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    assert torch.equal(steady(x), want)
                calls[0] += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    caller = threading.Thread(target=call_steadily)
    caller.start()
    try:
        trained(torch.randn(3, 8, requires_grad=True)).sum().backward()
    finally:
        stop.set()
        caller.join()
    assert ltc_cache.stats()["aot_traces"] == 1  # the compile did happen meanwhile
    assert errors == [], (len(errors), errors[0])
    assert calls[0] > 0


# -- the pieces ---------------------------------------------------------------------------


def test_a_first_call_is_made_once_whatever_the_threads(cache_dir):
    """A compiled graph whose first replay fails runs eagerly from then on,
    with one warning and one error counted: by the first thread, while the
    others wait for its choice (each made it, counting 4 errors)."""
    tried = []

    def failing(*args: object) -> object:
        tried.append(threading.get_ident())
        time.sleep(0.05)  # the others arrive meanwhile
        raise RuntimeError("does not run here")

    graph = Guarded(failing, lambda x: x + 1, "threads.graph", ltc_cache.default_cache(),
                    as_tuple=False, ops=1)
    barrier, results = threading.Barrier(THREADS), []

    def call() -> None:
        barrier.wait()
        results.append(graph(1))

    workers = [threading.Thread(target=call) for _ in range(THREADS)]
    with pytest.warns(RuntimeWarning, match="does not run"):
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert results == [2] * THREADS
    assert len(tried) == 1
    assert ltc_cache.stats()["errors"] == 1


def test_a_shared_patch_is_in_place_until_its_last_holder_ends():
    state = {"patched": 0, "applied": 0}

    def apply():
        state["patched"] += 1
        state["applied"] += 1
        return lambda: state.update(patched=state["patched"] - 1)

    patch = SharedPatch(apply)
    first, second = patch.held(), patch.held()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the other holder still needs it
    assert state == {"patched": 1, "applied": 1}
    second.__exit__(None, None, None)
    assert state["patched"] == 0
    with patch.held():
        assert state == {"patched": 1, "applied": 2}
    assert state["patched"] == 0


class _Generating(torch.nn.Module):
    """A model whose generate() notes, at its start and after the others
    have started and one has ended, whether its forward is the compiled
    one (the instance's attribute), as transformers' would call it."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self._barrier = barrier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def generate(self, delay: float) -> tuple[bool, bool]:
        at_start = "forward" in self.__dict__
        self._barrier.wait()
        time.sleep(delay)  # the first thread ends; the second is still generating
        return at_start, "forward" in self.__dict__


def test_generate_keeps_the_compiled_forward_while_any_thread_generates():
    """generate() puts the compiled forward on the module for the time it
    runs. On two threads, the first to end took it away from the other
    (whose next steps ran eagerly), which then put back the compiled one
    for good."""
    model = _Generating(threading.Barrier(2))
    compiled = ltc_cache.compile(model)
    seen: list[tuple[bool, bool]] = []
    workers = [threading.Thread(target=lambda d=delay: seen.append(compiled.generate(d)))
               for delay in (0.0, 0.3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert seen == [(True, True), (True, True)]
    assert "forward" not in model.__dict__  # the module's own forward again


def test_counters_in_the_ledger_are_exact_under_threads(cache_dir):
    """``ltc-cache stats`` counts every thread's events: each thread writes
    on a connection of its own, in a transaction of its own."""
    from helpers import ledger_counts

    from ltc_cache.store import open_directory

    store = open_directory(cache_dir, create=True)
    barrier = threading.Barrier(8)

    def record() -> None:
        barrier.wait()
        for _ in range(50):
            store.record("hits", "0" * 64)
            store.record("stores", None)

    workers = [threading.Thread(target=record) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    store.close()
    counts = ledger_counts(cache_dir)
    assert (counts["hits"], counts["stores"]) == (400, 400)
