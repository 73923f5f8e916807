"""Which CPUs run a fused library: every ISA name Inductor can write,
crossed with CPUs that have and lack each feature (tests/helpers.py's
CPU_KINDS), what a library compiled on each needs, ATEN_CPU_CAPABILITY's
cap, and the two readers of this CPU's features. Inductor's own pick is
pinned in tests/common/test_torch_private.py."""

from __future__ import annotations

import sys

import pytest
from helpers import CPU_KINDS
from torch._inductor import cpu_vec_isa as vec

from ltc_cache.graph.fused import cpu_isa


def _inductor_isa_names() -> list[str]:
    """Every ISA string AOTInductor can record: str() of each VecISA
    Inductor has, upper-cased as the package's metadata writes it."""
    isas = [*vec.supported_vec_isa_list, vec.VecSVE(128), vec.VecZVECTOR(), vec.VecVSX(),
            vec.invalid_vec_isa]
    subclasses, found = [vec.VecISA], set()
    while subclasses:
        cls = subclasses.pop()
        found.add(cls)
        subclasses += cls.__subclasses__()
    assert found - {vec.VecISA} <= {type(isa) for isa in isas}, "a VecISA this test misses"
    return sorted({str(isa).upper() for isa in isas} | {"", "DEFAULT"})


@pytest.fixture
def cpu(monkeypatch):
    """Make this process a CPU of the given features."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)

    def be(features):
        monkeypatch.setattr(cpu_isa, "_probed", lambda: frozenset(features))

    return be


X86_WORDS = {"AVX2", "AVX512", "AVX512_VNNI", "AMX_TILE"}


@pytest.mark.parametrize("isa", _inductor_isa_names())
@pytest.mark.parametrize("kind", list(CPU_KINDS))
def test_a_library_runs_where_the_cpu_has_every_feature_its_isa_names(isa, kind, cpu):
    cpu(CPU_KINDS[kind])
    words = set(isa.split()) - {"DEFAULT", "INVALID_VEC_ISA"}
    known = words <= X86_WORDS
    has = {w.upper() for w in CPU_KINDS[kind]}
    assert cpu_isa.isa_runs_here(isa) == (known and words <= has), (isa, kind)
    if not known:  # ARM's, s390x's, POWER's: refused by name, never guessed at
        assert cpu_isa.unknown_words(isa) == sorted(words - X86_WORDS)
        assert set(cpu_isa.missing_features(isa)) >= words - X86_WORDS


@pytest.mark.parametrize("kind", list(CPU_KINDS))
def test_a_library_compiled_on_a_cpu_runs_there_and_where_there_is_more(kind, cpu):
    """What a library compiled on each kind needs: Inductor's pick there,
    with BF16 and AMX FP16 where its code may use them; it runs on that
    kind and on every kind that has all it has, and on no other."""
    cpu(CPU_KINDS[kind])
    needs = cpu_isa.machine_isa()
    assert set(needs.lower().split()) <= CPU_KINDS[kind]
    for other, features in CPU_KINDS.items():
        cpu(features)
        runs = cpu_isa.isa_runs_here(needs)
        if features >= CPU_KINDS[kind]:
            assert runs, (kind, other)
        if not runs:
            assert cpu_isa.missing_features(needs), (kind, other)


def test_what_a_library_needs_beyond_its_isa_string():
    granite = CPU_KINDS["Granite Rapids (AMX FP16)"]
    assert cpu_isa.library_needs("AVX512 AVX512_VNNI AMX_TILE", granite) == \
        "AVX512 AVX512_VNNI AVX512_BF16 AMX_TILE AMX_FP16"
    assert cpu_isa.library_needs("AVX512", granite) == "AVX512 AVX512_BF16"
    assert cpu_isa.library_needs("AVX2", granite) == "AVX2"
    assert cpu_isa.library_needs("", granite) == ""
    assert cpu_isa.library_needs("AVX512", CPU_KINDS["Skylake-X (AVX-512)"]) == "AVX512"
    assert cpu_isa.library_needs("ASIMD", frozenset()) == "ASIMD"  # kept, refused at load


@pytest.mark.parametrize(("capability", "needs"), [
    (None, "AVX512 AVX512_VNNI AVX512_BF16 AMX_TILE"), ("avx512", None), ("avx2", "AVX2"),
    ("default", ""), ("AVX2", None), ("bogus", None)])
def test_aten_cpu_capability_caps_the_features_as_torch_and_inductor_read_it(
        capability, needs, cpu, monkeypatch):
    cpu(CPU_KINDS["Sapphire Rapids (AMX)"])
    full = cpu_isa.machine_isa()
    if capability is not None:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert cpu_isa.machine_isa() == (full if needs is None else needs)
    assert cpu_isa.isa_runs_here("AVX512") == (capability not in ("avx2", "default"))


def test_parse_cpu_names_a_fleet_machine(cpu):
    cpu({"avx2"})
    assert cpu_isa.parse_cpu("here") == {"avx2"}
    assert cpu_isa.parse_cpu("AVX512,avx512_vnni") == {"avx2", "avx512", "avx512_vnni"}
    assert cpu_isa.parse_cpu("amx_tile") >= {"avx2", "avx512", "avx512_vnni", "amx_tile"}
    for bad in ("", "neon", "avx2 sse"):
        with pytest.raises(ValueError, match="give 'here', or features among avx2"):
            cpu_isa.parse_cpu(bad)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not cpu_isa.x86_machine(),
                    reason="the kernel's flags: x86-64 Linux")
def test_the_kernels_flags_and_torchs_probes_agree_here():
    """``ls`` reads the kernel's flags, the loader torch's probes: on this
    machine they say the same."""
    assert cpu_isa._kernel_flags() == cpu_isa._torch_probes()
