"""Which vector instructions a fused library needs, and whether this CPU has them.

Inductor vectorises a library for the ISA its ``pick_vec_isa`` finds on the
compiling machine, and AOTInductor records that ISA in the package as
``str(pick_vec_isa()).upper()``: a space-separated list of feature words,
"AVX2", "AVX512", "AVX512 AVX512_VNNI" (Cascade Lake, Ice Lake, Zen 4) or
"AVX512 AVX512_VNNI AMX_TILE" (Sapphire Rapids and later). Its AVX-512 and
AMX code may also use AVX-512 BF16 and AMX FP16 where the compiling CPU had
them, which the string does not say. So a library *needs* every word of
its ISA plus those two where they applied (:func:`library_needs`), and it
runs on a CPU that has every feature it needs (:func:`missing_features`).
A word this module does not know (ARM's ASIMD or SVE256, s390x's ZVECTOR,
one a later torch adds) is never guessed at: the library is refused.

This CPU's features come from torch's own probes (``torch.cpu._is_*``, the
ones Inductor's pick reads, so the two agree), which import nothing of
Inductor; processes that never import torch (``ltc-cache ls`` and
``stats``) read the kernel's flags in ``/proc/cpuinfo`` instead. Both are
capped by ``ATEN_CPU_CAPABILITY`` as torch and Inductor cap themselves:
``avx2`` makes an AVX-512 machine act, for the fused tier too, as an AVX2
one.

Pinned by tests/common/test_torch_private.py (its AOTInductor section):
written against torch 2.13.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable

from ...errors import BadArgument

__all__ = ["FEATURES", "cpu_features", "inductor_isa", "isa_runs_here", "isa_words",
           "library_needs", "machine_isa", "missing_features", "parse_cpu", "unknown_words",
           "x86_machine"]

# Every feature a library can need, in the order a listing names them.
FEATURES = ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_fp16")

# The ISAs Inductor picks among on x86-64 (cpu_vec_isa.supported_vec_isa_list),
# widest first: it takes the first whose every word this CPU has.
_INDUCTOR_ISAS = (("avx512", "avx512_vnni", "amx_tile"), ("avx512", "avx512_vnni"),
                  ("avx512",), ("avx2",))

# What an ISA string may say that needs no feature: no vector ISA at all.
_NO_VECTORS = frozenset({"", "default", "invalid_vec_isa"})

# ATEN_CPU_CAPABILITY -> the features a process may use under it (as
# Inductor's get_isa_from_cpu_capability reads it: lower case only, any
# other value ignored).
_CAPPED = {"default": frozenset(), "avx2": frozenset({"avx2"})}

# The kernel's flags (/proc/cpuinfo) that make each feature.
_KERNEL_FLAGS = {
    "avx2": ("avx2",),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avx512_vnni": ("avx512_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "amx_tile": ("amx_tile",),
    "amx_fp16": ("amx_fp16",),
}


def x86_machine() -> bool:
    """Whether this is an x86-64 machine: the only one whose ISA words this
    module knows."""
    return platform.machine() in ("x86_64", "AMD64")


def _torch_probes() -> frozenset[str]:
    import torch

    probes = {
        "avx2": torch.cpu._is_avx2_supported,
        "avx512": torch.cpu._is_avx512_supported,
        "avx512_vnni": torch.cpu._is_vnni_supported,
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
        "amx_tile": torch.cpu._is_amx_tile_supported,
        "amx_fp16": torch.cpu._is_amx_fp16_supported,
    }
    return frozenset(name for name, probe in probes.items() if probe())


def _kernel_flags() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return frozenset(name for name, needed in _KERNEL_FLAGS.items()
                                     if flags.issuperset(needed))
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def _probed() -> frozenset[str]:
    if not x86_machine():
        return frozenset()
    # torch's probes where torch is loaded (the loader's and the builder's
    # case): what Inductor reads. The kernel's flags elsewhere, so that a
    # listing never imports torch.
    import sys

    if "torch" in sys.modules:
        features = _torch_probes()
    else:
        kernel = _kernel_flags()
        features = kernel if kernel is not None else _torch_probes()
    # Inductor counts VNNI only beside AVX-512 (x86_isa_checker).
    return features if "avx512" in features else features - {"avx512_vnni", "avx512_bf16"}


def cpu_features() -> frozenset[str]:
    """The vector features this process may use: the CPU's, capped by
    ``ATEN_CPU_CAPABILITY``."""
    features = _probed()
    cap = _CAPPED.get(os.environ.get("ATEN_CPU_CAPABILITY", ""))
    return features if cap is None else features & cap


def inductor_isa(features: frozenset[str] | None = None) -> tuple[str, ...]:
    """The ISA Inductor's ``pick_vec_isa`` takes on a CPU of ``features``
    (this process's by default), as its words; () for none."""
    features = cpu_features() if features is None else features
    return next((isa for isa in _INDUCTOR_ISAS if features.issuperset(isa)), ())


def isa_words(isa: str) -> tuple[str, ...]:
    """The feature words of an ISA string as Inductor writes it, lower case."""
    return tuple(word for word in isa.lower().split() if word not in _NO_VECTORS)


def library_needs(isa: str, features: frozenset[str] | None = None) -> str:
    """What a library that Inductor compiled for ``isa`` on a CPU of
    ``features`` (this process's by default) needs, upper case as the
    package writes its ISA: the ISA's words, and AVX-512 BF16 and AMX FP16
    where that CPU had them and the ISA lets Inductor use them."""
    features = cpu_features() if features is None else features
    words = list(isa_words(isa))
    if "avx512" in words and "avx512_bf16" in features:
        words.append("avx512_bf16")
    if "amx_tile" in words and "amx_fp16" in features:
        words.append("amx_fp16")
    return " ".join(_ordered(words)).upper()


def machine_isa() -> str:
    """What a library compiled in this process needs, as its entry records
    it: ``AVX2``, ``AVX512 AVX512_VNNI AVX512_BF16 AMX_TILE``, ..."""
    return library_needs(" ".join(inductor_isa()))


def _ordered(words: Iterable[str]) -> list[str]:
    words = set(words)
    return [w for w in FEATURES if w in words] + sorted(words - set(FEATURES))


def unknown_words(isa: str) -> list[str]:
    """The words of ``isa`` this module does not know, upper case."""
    return [w.upper() for w in isa_words(isa) if w not in FEATURES]


def missing_features(isa: str, features: frozenset[str] | None = None) -> list[str]:
    """What a CPU of ``features`` (this process's by default) lacks of
    what a library of ``isa`` needs, upper case; a word this module does
    not know is always missing. [] where the library runs there."""
    features = cpu_features() if features is None else features
    return [w.upper() for w in _ordered(isa_words(isa)) if w not in features]


def parse_cpu(text: str) -> frozenset[str]:
    """The features of a CPU a person names: ``here`` (this one), or
    feature words (``avx2``, ``avx512 avx512_vnni``, comma- or
    space-separated, any case), each with the features every CPU that has
    it has too (AVX-512 CPUs have AVX2, AMX ones AVX-512 VNNI). Raises
    ValueError for a word this module does not know."""
    words = set(text.lower().replace(",", " ").split())
    if words == {"here"}:
        return cpu_features()
    unknown = sorted(words - set(FEATURES))
    if unknown or not words:
        raise BadArgument(f"not a CPU: {text!r} (give 'here', or features among "
                         f"{', '.join(FEATURES)})")
    if words & {"amx_tile", "amx_fp16"}:
        words |= {"avx512", "avx512_vnni", "amx_tile"}
    if any(w.startswith("avx512") for w in words):
        words |= {"avx2", "avx512"}
    return frozenset(words)


def isa_runs_here(isa: str) -> bool:
    """Whether a library that needs ``isa`` (as its entry records it) runs
    on this CPU."""
    return not missing_features(isa)
