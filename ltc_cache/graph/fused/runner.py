"""Load a fused library and call it in place of a TorchScript function.

The library is loaded through torch's C++ AOTInductor runner
(:func:`.aoti.cpu_runner`), which takes a shared library's path and runs it
on a list of tensors in about a millisecond. The bytes come from a
verified entry and are written under a fresh name into a private (0700)
directory of this process, loaded from there and unlinked at once: the
loader maps the file, so nothing another user can write is ever loaded,
and nothing is left behind.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..replay import GraphFunction
from .aoti import cpu_runner

__all__ = ["ATOL", "FusedFunction", "layout_mismatch", "load_runner", "mismatch", "put_back",
           "same_non_finite", "saved_writes"]

_private_dir_lock = threading.Lock()
_loaded = itertools.count()


@functools.lru_cache(maxsize=1)
def _private_dir() -> str:
    with _private_dir_lock:
        path = tempfile.mkdtemp(prefix="ltc_cache-fused-")  # mode 0700, ours alone
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        return path


def load_runner(library: bytes) -> Any:
    """A runner of the library ``library`` (verified bytes). Raises
    RuntimeError (or OSError) where it does not load."""
    # A name never used before in this process: the dynamic loader hands
    # back the library it already loaded under a name it has seen, whatever
    # the file now holds (docs/torch/aot-inductor.md#dlopen-keys-by-file-name).
    path = os.path.join(_private_dir(), f"{next(_loaded)}-{os.getpid()}.so")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(library)
        return cpu_runner(path)
    finally:
        os.unlink(path)  # mapped by the loader: the name is no longer needed


class FusedFunction:
    """``fn(*inputs) -> tuple``, as the TorchScript function it stands in for.

    The library runs where autograd would record nothing (no grad mode, or
    no input requiring grad: a library's outputs have no history); else the
    TorchScript function runs. Outputs the TorchScript function returns as
    views are taken as views again, and the outputs in ``restride`` are
    copied into its layout. The first call runs both and hands both results
    to ``check(expected, got, error)``, whose verdict says whether the
    library stays in use, unless ``checked`` (a verdict stored by an
    earlier process: the library runs alone from its first call); a
    library that raises later is handed to it too, and TorchScript runs the
    call. One thread makes the first call's comparison; the others wait
    for its verdict.

    ``writes``: the inputs both write in place (a plan's static key/value
    cache, BatchNorm's running statistics). The first call runs the
    TorchScript function, keeps what it wrote, puts the inputs back, runs
    the library and compares what each wrote too; the inputs are left as
    the TorchScript function wrote them, so a write is never made twice.
    """

    __slots__ = ("_aliases", "_check", "_checked", "_first_lock", "_restride", "_run",
                 "_script", "_used", "_writes")

    def __init__(self, runner: Any, script: GraphFunction, *, aliases: Sequence[Sequence[Any]],
                 restride: Sequence[Sequence[Any]],
                 check: Callable[[Sequence[Any], Sequence[Any] | None, Exception | None], bool],
                 checked: bool = False, writes: Sequence[int] = ()) -> None:
        self._run = runner.run
        self._script = script
        self._aliases = [(int(o), kind, int(i), list(size), list(stride), int(offset))
                         for o, kind, i, size, stride, offset in aliases]
        self._restride = [(int(i), list(size), list(stride)) for i, size, stride in restride]
        self._check = check
        self._checked = checked
        self._first_lock = threading.Lock()
        self._used = True  # False once the check failed
        self._writes = tuple(writes)

    @property
    def checked(self) -> bool:
        """Whether the library's first-call verdict is in (stored or made here)."""
        return self._checked

    @property
    def in_use(self) -> bool:
        return self._used

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        if not self._used or (torch.is_grad_enabled()
                              and any(t.requires_grad for t in inputs)):
            return self._script(*inputs)
        if not self._checked:
            return self._first_call(inputs)
        try:
            return self.run_library(inputs)
        except Exception as exc:  # never the user's failure: TorchScript takes over
            results = self._script(*inputs)
            self._used = self._check(results, None, exc)
            return results

    def run_library(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """The library's outputs for ``inputs``, restrided and aliased as
        the TorchScript function's: no check, no fallback."""
        return self.arranged(self._run(list(inputs)), inputs)

    def arranged(self, out: list[Any], inputs: Sequence[Any]) -> tuple[Any, ...]:
        """The library's outputs ``out`` for ``inputs`` (what its runner
        returned), restrided and aliased as the TorchScript function's."""
        for i, size, stride in self._restride:
            t = out[i]
            out[i] = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
        for o, kind, i, size, stride, offset in self._aliases:
            base = inputs[i] if kind == "in" else out[i]
            out[o] = base.as_strided(size, stride, base.storage_offset() + offset)
        return tuple(out)

    def _first_call(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        with self._first_lock:
            if not self._checked:
                before = saved_writes(inputs, self._writes)
                expected = self._script(*inputs)
                expected = expected if isinstance(expected, tuple) else (expected,)
                written = saved_writes(inputs, self._writes)
                put_back(inputs, self._writes, before)
                try:
                    got = self.run_library(inputs)
                except Exception as exc:
                    self._used = self._check(expected, None, exc)
                else:
                    self._used = self._check(expected + written,
                                             got + tuple(inputs[i] for i in self._writes), None)
                put_back(inputs, self._writes, written)
                self._checked = True
                return expected
        return self(*inputs)  # another thread's first call gave the verdict


def saved_writes(inputs: Sequence[Any], writes: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Copies of the inputs ``writes`` (indices), as they are now."""
    with torch.no_grad():
        return tuple(inputs[i].clone() for i in writes)


def put_back(inputs: Sequence[Any], writes: Sequence[int], saved: Sequence[torch.Tensor]
             ) -> None:
    """The inputs ``writes`` set to ``saved`` (:func:`saved_writes`) in place."""
    with torch.no_grad():
        for i, value in zip(writes, saved, strict=True):
            inputs[i].copy_(value)


# An output whose values are all near zero (a gradient that cancels out, a
# small statistic) carries the rounding of the unit-scale values it was
# computed from: a tiny BERT's training regions differed by 2.6e-9 to
# 3.7e-8 on outputs whose largest was 3.3e-9 to 3.3e-3, over 1e-5 of it.
# float32 rounds a value near one to within 6e-8 (half a unit in its last
# place), so two correct results, each rounded, can part by one unit:
# float32's epsilon, 1.19e-7, whatever the output's own scale. (At 1e-7,
# a tiny Swin's training region was refused for 1.04e-7 on an output whose
# largest value was 3e-3.)
ATOL = torch.finfo(torch.float32).eps


def mismatch(expected: Sequence[Any], got: Sequence[Any] | None, *,
             rtol: float = 1e-5, error: Exception | None = None) -> str | None:
    """Why the library's outputs ``got`` differ from the TorchScript
    function's ``expected`` (None where they match): sizes, strides and
    dtypes exactly, values within ``rtol`` of each output's largest
    magnitude (a fused kernel may sum in another order) or within
    :data:`ATOL`, NaN and infinity where the TorchScript function has
    them, integers exactly."""
    if got is None:
        return f"the library failed on the call ({type(error).__name__}: {error})"
    if len(got) != len(expected):
        return f"{len(got)} outputs where TorchScript has {len(expected)}"
    floating = []
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        problem = layout_mismatch(i, e, g)
        if problem is not None:
            return problem
        if isinstance(e, torch.Tensor) and (e.is_floating_point() or e.is_complex()) \
                and e.numel():
            floating.append(i)
    if not floating:
        return None
    # Each output's largest magnitude and largest difference, read back in
    # one step: a graph has up to a few hundred outputs, checked on the
    # first call of a warm process.
    scales = torch.stack([expected[i].abs().amax().double() for i in floating]).tolist()
    worst = torch.stack([(expected[i] - got[i]).abs().amax().double() for i in floating]).tolist()
    for i, scale, diff in zip(floating, scales, worst, strict=True):
        if math.isfinite(scale) and diff <= max(rtol * scale, ATOL):
            continue
        problem = _non_finite_mismatch(expected[i], got[i], rtol)
        if problem is not None:
            return f"output {i}: {problem}"
    return None


def layout_mismatch(i: int, e: Any, g: Any) -> str | None:
    """Why output ``i`` of the library (``g``) differs from TorchScript's
    (``e``) in anything but floating values: a non-tensor, a shape, a
    dtype, strides, an integer; None where it does not."""
    if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
        if e is not g and e != g:
            return f"output {i}: {g!r} where TorchScript has {e!r}"
    elif e.shape != g.shape or e.dtype != g.dtype:
        return (f"output {i}: {tuple(g.shape)} {g.dtype} where TorchScript has "
                f"{tuple(e.shape)} {e.dtype}")
    elif e.numel() > 1 and e.stride() != g.stride():
        return f"output {i}: strides {g.stride()} where TorchScript has {e.stride()}"
    elif not (e.is_floating_point() or e.is_complex()) and not torch.equal(e, g):
        return f"output {i}: values differ"
    return None


def same_non_finite(e: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``g`` has NaN and infinity exactly where ``e`` has them."""
    finite = torch.isfinite(e)
    return torch.equal(finite, torch.isfinite(g)) \
        and torch.equal(e[~finite].nan_to_num(), g[~finite].nan_to_num())


def _non_finite_mismatch(e: torch.Tensor, g: torch.Tensor, rtol: float) -> str | None:
    if not same_non_finite(e, g):
        return "NaN or infinity where TorchScript has none, or the other way"
    finite = torch.isfinite(e)
    if not finite.any():
        return None
    scale = e[finite].abs().max().item()
    worst = (e[finite] - g[finite]).abs().max().item()
    if worst > max(rtol * scale, ATOL):
        return f"differs by {worst:.3g}, over {rtol:g} of its largest {scale:.3g}"
    return None
