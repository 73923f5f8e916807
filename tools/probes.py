"""What a measured child process counts about itself beyond
``ltc_cache.stats()``: AOTAutograd's graph captures (counted apart from
ltc_cache's own counters, so a warm run that says it traced nothing is
checked from outside), Dynamo's captures, and the messages ltc_cache logs
about programs. Used by the tools' children and the tests' children."""

from __future__ import annotations

import logging

AOT = {"traces": 0}


def count_aot_traces() -> None:
    """Wrap the two functions that capture AOTAutograd's graphs (training
    and inference): each call is one trace. (Called again: they stay
    wrapped once.)"""
    from torch._functorch._aot_autograd import graph_compile

    for name in ("aot_dispatch_autograd_graph", "aot_dispatch_base_graph"):
        original = getattr(graph_compile, name)
        if getattr(original, "counts_aot_traces", False):
            continue

        def counted(*args, _original=original, **kwargs):
            AOT["traces"] += 1
            return _original(*args, **kwargs)

        counted.counts_aot_traces = True
        setattr(graph_compile, name, counted)


def program_logs() -> list[str]:
    """The messages ltc_cache logs about programs (INFO and up) from now on,
    in a list that grows as they come: why a program was captured again,
    fell back, or was loaded."""
    logs: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logs.append(record.getMessage())  # type: ignore[method-assign]
    for name in ("ltc_cache.precompile", "ltc_cache.program"):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(handler)
    return logs


def captures() -> int:
    """Dynamo captures in this process: frames torch.compile captured, and
    programs ltc_cache.compile captured (AOT precompile, which Dynamo's
    frame counters do not count)."""
    from torch._dynamo.utils import counters

    import ltc_cache

    return int(counters["frames"].get("ok", 0)) + ltc_cache.stats().get("program_captures", 0)


def dynamo_frames() -> tuple[list[str], list[str]]:
    """From now on, the code of each frame Dynamo's callback is handed (what
    ``counters["frames"]`` counts: name, file and caller), and of each it
    traces (a visit may end sooner, on a skip): two lists that grow."""
    from pathlib import Path

    from torch._dynamo import convert_frame

    visited: list[str] = []
    traced: list[str] = []
    original = convert_frame.ConvertFrame.__call__
    original_compile = convert_frame._compile

    def call(self, frame, *args, **kwargs):
        back = frame.f_back
        caller = f", from {back.f_code.co_qualname}" if back is not None else ""
        visited.append(f"{frame.f_code.co_qualname} ({Path(frame.f_code.co_filename).name}"
                       f"{caller})")
        return original(self, frame, *args, **kwargs)

    def compile_frame(code, *args, **kwargs):
        traced.append(code.co_qualname)
        return original_compile(code, *args, **kwargs)

    convert_frame.ConvertFrame.__call__ = call
    convert_frame._compile = compile_frame
    return visited, traced
