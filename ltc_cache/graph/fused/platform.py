"""What makes a fused library unusable elsewhere, as the parts of its key.

A library is machine code: it runs only under the torch build it was
compiled against (its C shim ABI), it was linked by one compiler's
runtime, and Inductor vectorised it for the CPU that compiled it. Each of
those is a key part, so a library from another build, compiler or CPU is
a miss, never a crash (a library built with AVX-512 would die of SIGILL
on a CPU without it). The CPU's part names every vector feature a library
compiled here needs (:mod:`.cpu_isa`: Inductor's whole ISA, and AVX-512
BF16 or AMX FP16 where it uses them), so machines of different feature
sets keep their libraries side by side in one directory or one Redis tier;
the features a library needs are recorded with it too, and checked against
this CPU before it is loaded (:func:`isa_runs_here`).
"""

from __future__ import annotations

import functools
import os
import platform as host
import shutil
import subprocess

import torch

from ...entries.entry import Entry, source_to_wire
from ...entries.keys import CacheKey, hash_lines, key_from_parts
from ...entries.kinds import EntryKind
from .aoti import cxx11_abi, runner_available
from .cpu_isa import isa_runs_here, machine_isa, x86_machine
from .source import library_source

__all__ = ["FUSED_VERSION", "INDUCTOR_OPTIONS", "compiler_id", "compiler_version", "fusable_here",
           "fused_key", "inductor_settings", "isa_runs_here", "machine_isa", "source_key"]

# A library of the whole TorchScript graph, inputs and outputs as its
# function's, with the outputs it aliases or lays out otherwise beside it.
# 5: generated loops parallel where Inductor's own are; 4: a graph's library
# keyed by what it is compiled from (.source), and compiled for the recorded
# ISA alone (no -march=native); 3: generated loops on one thread; 2: only
# the outputs laid out otherwise are recorded (1: every output's).
FUSED_VERSION = 5

# The Inductor settings a library is compiled with; part of the key, as is
# any TORCHINDUCTOR_* variable of the compiling process that changes code.
INDUCTOR_OPTIONS: dict[str, object] = {
    "compile_threads": 1,  # one g++ at a time: the compile runs beside training
    # Generated loops are parallel as Inductor's own are (cpp.threads left at
    # its default): a loop is split across threads only where each thread
    # gets enough work, decided for the compiling process's thread count
    # (the worker inherits its client's OMP_NUM_THREADS), and the team is the
    # calling thread's at run time. Loops kept on one thread made a small
    # GPT's whole-plan library 1.3x slower than its per-region path at two
    # threads (docs/how-it-works.md#fused-libraries).
}


def inductor_settings() -> dict[str, object]:
    """:data:`INDUCTOR_OPTIONS`, and the target g++ compiles for: the
    baseline of the CPUs that have this machine's vector ISA, never
    ``-march=native``, Inductor's default. Inductor adds the ISA's own
    flags (``-mavx2 -mfma -mf16c``, or AVX-512's); with ``-march=native``
    g++ would also use whatever else this CPU has (AVX-512 on a machine
    capped to AVX2 by ``ATEN_CPU_CAPABILITY``), and a library keyed for
    AVX2 would die of SIGILL on an AVX2 CPU
    (docs/torch/aot-inductor.md#inductor-compiles-for-this-machine-by-default).
    x86-64-v2 (SSE4.2, POPCNT) is in every CPU with AVX2; a machine
    without a vector ISA gets plain x86-64."""
    march = "x86-64-v2" if machine_isa() not in ("", "DEFAULT") else "x86-64"
    return {**INDUCTOR_OPTIONS, "cpp.march": march}


# TORCHINDUCTOR_* variables that change where Inductor keeps things or what
# it logs, not the code it writes: left out of the key.
_NOT_CODE = ("CACHE", "LOG", "TRACE", "DEBUG", "COMPILE_THREADS", "WORKER", "DIR")

def fusable_here() -> bool:
    """Whether this process can use fused libraries: this torch has
    AOTInductor's CPU runner, and the CPU is an x86-64 one, whose vector
    ISA words are the ones ltc_cache knows (anywhere else a library would
    be compiled only to be refused)."""
    return runner_available() and x86_machine()


def _compiler_path() -> str | None:
    """The C++ compiler Inductor would use: ``$CXX``, else ``g++``, on PATH."""
    return shutil.which(os.environ.get("CXX") or "g++")


@functools.lru_cache(maxsize=1)
def compiler_id() -> str:
    """The C++ compiler Inductor would use (``$CXX``, else ``g++``) as the
    file it is (resolved path, size, modification time), or ``"none"``.
    A stat, not ``g++ --version`` (5 ms, a subprocess): a warm process reads
    this before it looks a library up. A compiler installed from one
    package has the same size and time on every machine."""
    path = _compiler_path()
    if path is None:
        return "none"
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return "none"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def compiler_version() -> str:
    """The compiler's own first line of ``--version``, for listings."""
    path = _compiler_path()
    if path is None:
        return "none"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.splitlines()[0] if out else "?"


def _device_text() -> str:
    # The design holds for CUDA libraries too: there the device capability
    # takes the ISA's place. The TorchScript backend runs on CUDA when
    # LTC_TS_CUDA is set at all (graph_keys.py).
    if "LTC_TS_CUDA" in os.environ and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"cuda sm_{major}{minor}"
    return f"cpu {host.machine()} {machine_isa()}"


def _options_text() -> list[str]:
    env = sorted(f"{k}={v}" for k, v in os.environ.items()
                 if k.startswith("TORCHINDUCTOR_") and not any(w in k for w in _NOT_CODE))
    return [repr(sorted(inductor_settings().items())), *env]


def source_key(entry: Entry) -> str:
    """What ``entry``'s library is the library of: a graph's content
    (:mod:`.source`: identical layers share one library), else (a plan)
    the entry's key."""
    if entry.kind == EntryKind.GRAPH:
        source = library_source(entry.ir, [source_to_wire(s) for s in entry.inputs],
                                entry.meta.get("input_specs"))
        if source is not None:
            return source
    return entry.key


def fused_key(graph_key: str) -> CacheKey:
    """The key of the fused library of ``graph_key`` (what
    its :func:`source_key`) on this machine."""
    parts = {
        "format": hash_lines([f"ltc_cache.fused:{FUSED_VERSION}"]),
        "graph": graph_key,
        "torch": hash_lines([torch.__version__, str(torch.version.git_version),
                             f"cxx11abi={cxx11_abi()}",
                             f"debug={torch.version.debug}"]),
        "compiler": hash_lines([compiler_id()]),
        "device": hash_lines([_device_text()]),
        "inductor": hash_lines(_options_text()),
    }
    return key_from_parts(parts)
