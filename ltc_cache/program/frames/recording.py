"""What Dynamo does during one call through a program of frames, recorded in
the thread making it: the globals it installs, the frames it captures with
their checks, the graph-break reasons of the frames it adds to the package,
the codes it decides to run as they are, and what it raised converting a
frame (its failure, not the user's code's)."""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from ...dynamo_package import ConvertFrame, OutputGraph, graph_break_counts, skipped_recursively
from ...threads import SharedPatch
from .code_lookup import skip_record

__all__ = ["CallRecord", "graph_break_reasons", "recording"]

logger = logging.getLogger("ltc_cache.precompile")


class CallRecord:
    """What Dynamo did for one call of a program of frames, in the thread
    making it: the frames it captured (``(code, Dynamo's code, checks)``,
    as the package's ``ltc_live``), the graph-break reasons of the captures
    that added frames to the package, and what Dynamo raised converting a
    frame (its failure, not the user's code's)."""

    __slots__ = ("breaks", "error", "live", "package")

    def __init__(self, package: Any) -> None:
        self.package = package
        self.live: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
        self.breaks: dict[str, int] = {}
        self.error: BaseException | None = None


# The record of the call this thread is making through a package, if any.
_calls = threading.local()


def graph_break_reasons() -> dict[str, int]:
    """Dynamo's graph-break reasons (first line -> count) as they stand: its
    ``unimplemented`` counter (what it could not trace) and ``graph_break``
    (breaks it reports by message)."""
    reasons: dict[str, int] = {}
    for group in ("unimplemented", "graph_break"):
        for reason, count in graph_break_counts(group).items():
            line = (str(reason).strip().splitlines() or ["?"])[0][:200]
            reasons[line] = reasons.get(line, 0) + int(count)
    return reasons


def _install_recorders() -> Callable[[], None]:
    """Hook Dynamo where a call through a package is recorded (the globals
    Dynamo installs, each frame it converts); returns what unhooks it. A
    hook records into the calling thread's :class:`CallRecord`, and does
    nothing more in a thread making no such call."""
    install_original, call_original = OutputGraph.install_global_unsafe, ConvertFrame.__call__

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        record = getattr(_calls, "record", None)
        if record is not None:
            record.package.ltc_installed[name] = value
        install_original(self, name, value)

    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        record = getattr(_calls, "record", None)
        if record is None:
            return call_original(self, frame, *args, **kwargs)
        return _converting(record, lambda: call_original(self, frame, *args, **kwargs), frame)

    OutputGraph.install_global_unsafe = install_global_unsafe  # type: ignore[method-assign]
    ConvertFrame.__call__ = call  # type: ignore[method-assign]

    def uninstall() -> None:
        OutputGraph.install_global_unsafe = install_original  # type: ignore[method-assign]
        ConvertFrame.__call__ = call_original  # type: ignore[method-assign]

    return uninstall


# In place while any thread makes a call through a package.
_RECORDERS = SharedPatch(_install_recorders)


def _converting(record: CallRecord, convert: Callable[[], Any], frame: Any) -> Any:
    """Dynamo converting one frame of a recorded call (``convert()``). It
    runs under Dynamo's compile lock, so what the package gains meanwhile
    is this conversion's."""
    package = record.package
    live, frames, reasons = len(package.ltc_live), len(package.ltc_frames), \
        graph_break_reasons()
    try:
        result = convert()
    except BaseException as exc:
        record.error = exc  # Dynamo's failure, not the user's code's
        raise
    record.live.extend(package.ltc_live[live:])
    if len(package.ltc_frames) != frames:
        for reason, count in graph_break_reasons().items():
            if count > reasons.get(reason, 0):
                record.breaks[reason] = record.breaks.get(reason, 0) + count - \
                    reasons.get(reason, 0)
    try:
        recursive = skipped_recursively(result)
        if recursive is not None:
            skip = skip_record(frame.f_code, frame.f_globals, recursive)
            if skip is not None and skip not in package.ltc_skips:
                package.ltc_skips.append(skip)
    except Exception:  # only a record for later processes: never in the way
        logger.debug("ltc_cache: no skip record for a frame", exc_info=True)
    return result


@contextlib.contextmanager
def recording(package: Any) -> Iterator[CallRecord]:
    """While a call runs through Dynamo: record each global it installs
    (name -> value), and each code it decides to run as it is from then on
    (the frames the eager parts between graphs call: a logger's, say),
    which a later process is told at load instead of visiting each again;
    and what the call's own conversions did (the :class:`CallRecord` given).
    Calls on several threads at once each get their own record; the hooks
    stay in place until the last of them ends (ltc_cache/threads.py)."""
    record = CallRecord(package)
    outer = getattr(_calls, "record", None)
    _calls.record = record
    try:
        with _RECORDERS.held():
            yield record
    finally:
        _calls.record = outer
