"""Compile a graph entry into a fused library (a minute's work; never in
the path of a user's call).

The library is compiled from the entry alone, so any process can do it:
the stored TorchScript function is exported (traced on fake tensors, in a
graph of one call: :mod:`.aten_graph`) and compiled by AOTInductor
(:mod:`.aoti`) with the graph's inputs as the library's inputs, in the
TorchScript function's order. Inputs are made from the layouts the entry recorded
(``input_specs``); stored constants are used as they are.

Before it is stored, the library is checked against the TorchScript
function on those inputs and both are timed, interleaved: a library that
differs, or is not faster, is stored as a refusal instead.

:func:`build_library` does the compile, the check and the timing for any
function of tensors that ``make_fx`` can trace: a plan's whole graph
against its per-region path too (:mod:`ltc_cache.compile_backend.plan_library`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ...entries.entry import Entry
from ...entries.keys import CacheKey
from ...entries.kinds import EntryKind
from ...errors import FuseFailed, UnexpectedPackage
from ..replay import build_function
from .aoti import compile_library, exports_call_scripts
from .aten_graph import CALL_FAILED, as_tuple, aten_graph, one_call, view_copies
from .cpu_isa import library_needs
from .exact import no_further_from_exact
from .governor import timed_alone
from .library_entries import DATA_DEPENDENT, NOT_FASTER, fused_entry, refusal_entry
from .platform import compiler_id, compiler_version, inductor_settings
from .runner import FusedFunction, load_runner, mismatch, put_back, saved_writes

__all__ = ["KEEP_PLAN", "Built", "build_entry", "build_library", "example_inputs",
           "laid_out_input", "output_aliases", "refusal_reason"]

logger = logging.getLogger("ltc_cache.fused")

# Rounds of the interleaved timing, and the time each round's calls take at
# least; a library is kept where it takes at most _KEEP of TorchScript's time.
# Each side's fastest round is compared: other work on the machine only adds
# time, and medians taken beside two other jobs refused 7 of a small GPT's 11
# region libraries, where a quiet machine kept 9. Fewer rounds (at least
# _MIN_ROUNDS) where they would take over _TIMING_SECONDS: GPT-2 small's
# backward runs 9.4 s a call, and 15 rounds of both were 280 s of its build,
# twice its compile. A call of _ONE_ROUND_SECONDS or more is an average of
# its own: its first call each is the timing (three rounds of that
# backward were 55 s, a third of the time to its libraries being ready),
# and the first calls are those the build makes to check the library.
# (Its 2.3 s training forward keeps its rounds: timed by one, its library
# measured 1.05x of the per-region path and was refused, where the fastest
# of four rounds kept it.)
_ROUNDS = 15
_MIN_ROUNDS = 3
_ROUND_SECONDS = 0.004
_TIMING_SECONDS = 20.0
_ONE_ROUND_SECONDS = 5.0
_KEEP = 0.97
# A plan's library is kept unless it is clearly slower than its per-region
# path: refusing it queues the plan's regions, more compiles (a small GPT's
# forward, five) that are rarely faster one by one. Its forward library
# measured 0.98x and 1.004x of that path in two runs, a tie that refused at
# 1.0 and doubled the time to the libraries being ready; its backward's
# measured 0.99x, 1.01x and, timed twice, 1.038x in three first runs on a
# fresh machine, and the refusal at 1.03 made the libraries ready in 54 s
# where they were at 33 s.
KEEP_PLAN = 1.05
# A library refused by less than this share past its keep line is timed
# again, both sides, and each side's fastest of both timings is compared:
# on a shared 2-core machine a small GPT's backward plan library measured
# 0.99x of its per-region path in one run and 1.22x in the next, and a
# refused plan queues its regions (more compiles, and a refusal stored).
_CLOSE = 1.3
# The check against the reference at build time catches a miscompile (an
# error the size of the values); the rule (outputs within 1e-5 of
# TorchScript's, verdicts.RTOL) is applied on the library's first call on
# a run's own inputs. Here weights are drawn from a standard normal, not a
# model's initialisation, so activations grow by the square root of each
# layer's width and reordered sums differ far more than on real data: a
# hidden-256 BERT's pooled output by 2.2e-5 of its largest value, a small
# GPT's training forward by 1.4e-4
# (docs/torch/aot-inductor.md#random-weights-make-build-check-stricter). Past this rule, a library
# is still kept where it is no further than the reference from the graph run in float64
# (:mod:`.exact`).
_BUILD_RTOL = 1e-3
_REASON_CHARS = 600


def build_entry(graph: Entry, key: CacheKey, secret: bytes) -> Entry:
    """The fused entry of ``graph`` under ``key``: its library, or a
    refusal saying why it has none. Raises only what the caller must see
    (KeyboardInterrupt, the worker's timeout)."""
    started = time.monotonic()
    try:
        return _build(graph, key, secret, started)
    except Exception as exc:  # Inductor, export, g++: whatever they raise
        reason = refusal_reason(exc)
    logger.info("no library for %s: %s", graph.key[:12], reason)
    return refusal_entry(key, graph, reason,
                         {"compile_seconds": round(time.monotonic() - started, 2)})


def _build(graph: Entry, key: CacheKey, secret: bytes, started: float) -> Entry:
    if graph.kind != EntryKind.GRAPH or not graph.ir:
        raise FuseFailed(f"a {graph.kind} entry holds no graph to compile")
    if compiler_id() == "none":
        raise FuseFailed("no C++ compiler ($CXX, else g++) on PATH")
    inputs = example_inputs(graph)
    script = build_function(graph.ir)
    assert script is not None
    built = build_library(script, inputs, started=started, versus="TorchScript")
    if built.slower is not None:
        return refusal_entry(key, graph, built.slower, built.stats)
    return fused_entry(key, graph, library=built.library, isa=built.isa, aliases=built.aliases,
                       restride=built.restride, secret=secret, stats=built.stats)


class Built(NamedTuple):
    """A library compiled and checked against the function it stands in
    for: ``slower`` says why it is not kept where it is not faster."""

    library: bytes
    isa: str
    aliases: list[list[Any]]
    restride: list[list[Any]]
    stats: dict[str, Any]
    slower: str | None


def build_library(reference: Callable[..., Any], inputs: list[torch.Tensor], *, started: float,
                  versus: str, traced: Callable[..., Any] | None = None,
                  writes: Sequence[int] = (), settings: Mapping[str, Any] | None = None,
                  keep: float = _KEEP) -> Built:
    """Compile what ``reference`` (``fn(*inputs) -> tuple`` of tensors, run
    under no grad: a TorchScript function, a plan's per-region path)
    computes on ``inputs`` into a library with those inputs and outputs,
    check it against ``reference`` and time both, interleaved (``versus``
    names the reference in the reason and the stats). ``traced``: what
    ``make_fx`` traces for the library, where ``reference`` cannot be
    traced on fake tensors (it computes the same). ``writes``: the inputs
    it writes in place, put back before each run that is compared, and
    compared too. ``settings``: Inductor settings over ltc_cache's
    (:func:`~.platform.inductor_settings`). ``keep``: the share of the
    reference's time the library may take at most. Raises FuseFailed
    where the library's outputs differ, and whatever the compile raises."""
    before = saved_writes(inputs, writes)
    # Each side's first call is timed too, as the timing times them, and
    # counts as its first round (a call of GPT-2 small's training backward
    # takes 9 s: its timing is that one round).
    with _timing(), torch.no_grad(), torch.jit.optimized_execution(False):  # as replays run it
        called = time.process_time()
        expected = as_tuple(reference(*inputs))
        script_first = time.process_time() - called
    written = saved_writes(inputs, writes)
    put_back(inputs, writes, before)
    aliases = output_aliases(expected, inputs)
    traceable = traced or reference
    try:
        library, inductor_isa = _compiled(traceable, inputs, len(expected),
                                          {**inductor_settings(), **(settings or {})})
    except UnexpectedPackage as exc:
        raise FuseFailed(str(exc)) from None
    isa = library_needs(inductor_isa)
    compile_seconds = round(time.monotonic() - started, 2)
    runner = load_runner(library)
    with _timing(), torch.no_grad():
        # One call gives the layouts to restride to and the outputs to check.
        called = time.process_time()
        out = runner.run(list(inputs))
        restride = _restride(expected, out, aliases)
        fused = FusedFunction(runner, reference, aliases=aliases, restride=restride,
                              check=lambda expected, got, error: True)
        arranged = fused.arranged(out, inputs)  # run_library's call, in two
        fused_first = time.process_time() - called
    with torch.no_grad(), torch.jit.optimized_execution(False):
        got = arranged + tuple(inputs[i].clone() for i in writes)
        problem = mismatch(expected + written, got, rtol=_BUILD_RTOL)
        put_back(inputs, writes, before)
        if problem and not no_further_from_exact(aten_graph(traceable, inputs), inputs, writes,
                                                 expected + written, got):
            raise FuseFailed(f"the library's outputs differ from {versus}'s: {problem}")
        script_ms, fused_ms = _times_to_keep_by(keep, reference, fused.run_library, inputs,
                                                writes, first=(1e3 * script_first,
                                                               1e3 * fused_first))
    stats = {"compile_seconds": compile_seconds, "script_ms": round(script_ms, 4),
             "fused_ms": round(fused_ms, 4), "compiler": compiler_version()}
    slower = None
    if fused_ms > keep * script_ms:
        slower = (f"{NOT_FASTER}: {fused_ms:.3f} ms a call against {versus}'s "
                  f"{script_ms:.3f} ms (CPU time)")
    return Built(library, isa, aliases, restride, stats, slower)


def _compiled(traceable: Callable[..., Any], inputs: list[torch.Tensor], outputs: int,
              settings: Mapping[str, Any]) -> tuple[bytes, str]:
    """:func:`~.aoti.compile_library` of ``traceable``: traced once, by the
    export, as one call where the export can call TorchScript; where it
    cannot, or where its trace of the call fails, from the aten graph
    ``make_fx`` traces, its views made reshapes (T5's training forward:
    a view of a tensor the functionalized trace laid out otherwise)."""
    if exports_call_scripts():
        graph = one_call(traceable, len(inputs), outputs)
        try:
            return compile_library(graph, inputs, settings, view_copies())
        except Exception as exc:
            if not graph.meta.get(CALL_FAILED):
                raise
            logger.info("the export could not trace the call (%s); traced to an aten graph "
                        "first", " ".join(str(exc).split())[:200])
    return compile_library(aten_graph(traceable, inputs), inputs, settings)


def refusal_reason(exc: Exception) -> str:
    """The reason a refusal stores for a build that raised ``exc``."""
    if isinstance(exc, FuseFailed):
        return str(exc)
    reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:_REASON_CHARS]}"
    # A guard on a data-dependent value has a type of its own; what Inductor
    # wraps it in, or says of a SymInt, has none: told by message.
    if _data_dependent(exc) or "SymInt" in reason or "data-dependent" in reason.lower():
        # A value read as a number: symbolic on fake inputs.
        reason = f"{DATA_DEPENDENT}: the graph reads a tensor's value as a number ({reason})"
    return reason


def _data_dependent(exc: BaseException) -> bool:
    """Whether ``exc``, or what it was raised from, is a guard on a value
    that depends on tensor data."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, GuardOnDataDependentSymNode):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def example_inputs(graph: Entry) -> list[torch.Tensor]:
    """Inputs laid out as the graph's were when it was traced: random
    floating values, zeros elsewhere (valid indices), stored constants as
    they are."""
    specs = graph.meta.get("input_specs")
    if not isinstance(specs, list) or len(specs) != len(graph.inputs):
        raise FuseFailed("the entry records no input layouts (stored by an older ltc_cache, "
                         "or its inputs are not CPU tensors)")
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for source, spec in zip(graph.inputs, specs, strict=True):
        if source.kind == "const":
            inputs.append(source.ref)
            continue
        inputs.append(laid_out_input(*spec, generator=generator))
    return inputs


def laid_out_input(dtype_name: str, shape: Sequence[int], stride: Sequence[int], *,
                   generator: torch.Generator) -> torch.Tensor:
    """An input of this layout: random floating values, zeros elsewhere
    (valid indices)."""
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise FuseFailed(f"input of unknown dtype {dtype_name!r}")
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) \
        if all(n > 0 for n in shape) else 0
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(extent, dtype=dtype, generator=generator)
    else:
        base = torch.zeros(extent, dtype=dtype)
    return base.as_strided(shape, stride)


def _restride(expected: Sequence[Any], got: Sequence[Any], aliases: list[list[Any]]
              ) -> list[list[Any]]:
    """The outputs the library lays out otherwise than TorchScript (its
    size and stride for each), but for those taken as views anyway."""
    aliased = {a[0] for a in aliases}
    return [[i, list(e.shape), list(e.stride())]
            for i, (e, g) in enumerate(zip(expected, got, strict=True))
            if i not in aliased and e.numel() > 1 and e.stride() != g.stride()]


def output_aliases(outputs: Sequence[Any], inputs: Sequence[torch.Tensor]) -> list[list[Any]]:
    """Which outputs view an input or another output (the TorchScript
    function returns views where the stored IR takes them). Outputs that
    view one tensor no output returns whole (a forward's saved query and
    key, slices of one projection) are left to the library as tensors of
    their own where no element is in two of them: no write through one can
    show through another, so nothing tells them from views. Raises
    FuseFailed for outputs that share storage in a way a library's fresh
    outputs cannot reproduce."""
    def storage(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr() if t.untyped_storage().nbytes() else -1

    by_storage = {storage(t): i for i, t in reversed(list(enumerate(inputs)))}
    aliases, owners, hidden = [], {}, {}
    for o, t in enumerate(outputs):
        if not isinstance(t, torch.Tensor):
            raise FuseFailed(f"output {o} is a {type(t).__name__}, not a tensor")
        ptr = storage(t)
        if ptr == -1:
            continue
        if ptr in by_storage:
            base, kind = inputs[by_storage[ptr]], "in"
            index = by_storage[ptr]
        elif ptr in owners:
            index, kind = owners[ptr], "out"
            base = outputs[index]
            if not _whole(base):
                hidden.setdefault(ptr, [outputs[index]]).append(t)
                continue
        else:
            owners[ptr] = o
            continue
        aliases.append([o, kind, index, list(t.shape), list(t.stride()),
                        t.storage_offset() - base.storage_offset()])
    for ptr, views in hidden.items():
        if _overlap(views):
            raise FuseFailed(f"outputs {owners[ptr]} and others view one tensor neither "
                             "returns whole, and overlap")
    return aliases


def _whole(t: torch.Tensor) -> bool:
    """Whether ``t`` is all of its storage, each element once."""
    return (not t.storage_offset() and t.nbytes == t.untyped_storage().nbytes()
            and all(stride or size == 1 for size, stride in zip(t.shape, t.stride(), strict=True)))


def _overlap(views: Sequence[torch.Tensor]) -> bool:
    """Whether an element of the storage ``views`` share is in two of them."""
    storage = views[0].untyped_storage()
    counts = torch.zeros(storage.nbytes() // views[0].element_size(), dtype=torch.int32)
    for view in views:
        # Views of one dtype (a graph's saved slices of one result).
        if view.element_size() != views[0].element_size():
            return True
        try:
            counts.as_strided(view.shape, view.stride(), view.storage_offset()).add_(1)
        except RuntimeError:  # a view that overlaps itself (an expanded one)
            return True
    return bool((counts > 1).any())


def _times_to_keep_by(keep: float, script: Callable[..., Any], fused: Any,
                      inputs: list[torch.Tensor], writes: Sequence[int],
                      first: tuple[float, float]) -> tuple[float, float]:
    """:func:`_time_both`'s times (``first``: the milliseconds of each
    side's first call), and where the library misses ``keep`` of the
    script's time by a close call (less than :data:`_CLOSE` past it), both
    timed again and each side's fastest of the two timings."""
    script_ms, fused_ms = _time_both(script, fused, inputs, writes, first)
    if keep * script_ms < fused_ms < _CLOSE * keep * script_ms:
        again = _time_both(script, fused, inputs, writes)
        script_ms, fused_ms = min(script_ms, again[0]), min(fused_ms, again[1])
    return script_ms, fused_ms


def _time_both(script: Callable[..., Any], fused: Any, inputs: list[torch.Tensor],
               writes: Sequence[int], first: tuple[float, float] | None = None
               ) -> tuple[float, float]:
    """Milliseconds a call of each, the fastest of interleaved rounds (the
    first calls' milliseconds ``first`` where they were timed), in the
    process's CPU time: the background worker runs at idle priority, where
    the wall clock mostly measures who preempted it; in the worker, with
    its other compile processes stopped (:func:`time_alone_in`). The
    integer inputs a call writes (a decoding step's position counter) are
    put back before each call (as they are before it): run on, they would
    index past the cache's end."""
    counters = [i for i in writes if not inputs[i].is_floating_point()]
    start_values = saved_writes(inputs, counters)

    def per_call(fn: Any, calls: int) -> float:
        start = time.process_time()
        for _ in range(calls):
            put_back(inputs, counters, start_values)
            fn(*inputs) if fn is script else fn(inputs)
        return (time.process_time() - start) * 1e3 / calls

    with _timing():
        return _fastest_rounds(per_call, script, fused, first)


# What a library's timing runs in: the background worker's compile
# processes time with the others stopped (governor.timed_alone).
_timing: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext


def time_alone_in(queue_dir: Path) -> None:
    """From now on, time each library alone among the compile processes of
    the worker of ``queue_dir``."""
    global _timing
    _timing = functools.partial(timed_alone, queue_dir)


def _fastest_rounds(per_call: Callable[[Any, int], float], script: Any, fused: Any,
                    first: tuple[float, float] | None = None) -> tuple[float, float]:
    if first is None or min(first) < _ROUND_SECONDS * 1e3:
        # A short call's first is mostly its set-up: timed again, warm.
        first = per_call(script, 1), per_call(fused, 1)
    once = max(*first, 1e-3)
    calls = max(1, math.ceil(_ROUND_SECONDS * 1e3 / once))
    rounds = 1 if once >= _ONE_ROUND_SECONDS * 1e3 else \
        max(_MIN_ROUNDS, min(_ROUNDS, int(_TIMING_SECONDS * 1e3 / (2 * once * calls))))
    # A call of a round's length or more: the first calls are a round already
    # (two of a GPT-2 small backward's eight calls of 8 s).
    script_ms, fused_ms = ([first[0]], [first[1]]) if calls == 1 else ([], [])
    for _ in range(rounds - len(script_ms)):
        script_ms.append(per_call(script, calls))
        fused_ms.append(per_call(fused, calls))
    return min(script_ms), min(fused_ms)
