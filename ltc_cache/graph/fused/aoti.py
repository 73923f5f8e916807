"""Every use ltc_cache makes of AOTInductor's private surface.

A fused library is compiled by ``torch._inductor.aot_compile`` (one
``*.wrapper.so`` and its ``*.wrapper_metadata.json``, in Inductor's cache
directory), and loaded through the C++ runner
``torch._C._aoti.AOTIModelContainerRunnerCpu``, which runs it on a list of
tensors without importing Inductor (``torch._inductor.package`` costs over
a second). All of it is torch-private. This module is the one place in the
package that touches ``torch._inductor``, ``torch._C._aoti`` and the ABI
torch was built with (``torch._C._GLIBCXX_USE_CXX11_ABI``)
(``tests/common/test_layers.py`` holds every other module to that), so that
a torch upgrade that moves them breaks here, and
``tests/common/test_torch_private.py`` (its AOTInductor section) is where it
breaks first, by name.

Written against torch 2.13.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import shlex
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import UnexpectedPackage

__all__ = ["check_isas_beside", "compile_library", "cpu_runner", "cxx11_abi",
           "exports_call_scripts", "headers_built_after", "prepare_compiles",
           "runner_available", "scripts_called_in_export"]

# Held while Inductor's C++ wrapper code generator is patched
# (_no_input_checks, _interface_compiled_once, _unbuilt_headers_left_out).
_PATCH = threading.RLock()
# Inductor's precompiled headers that compiles in headers_built_after's
# block left out: (lock path, builders) as Inductor builds them.
_unbuilt_headers: list[tuple[str, tuple[Any, ...]]] | None = None
_CHECKS_OFF = """
static bool _check_aoti_runtime_check_inputs_env() {
    const static char* env_var_value = getenv("AOTI_RUNTIME_CHECK_INPUTS");
    const static bool result = env_var_value != nullptr && env_var_value[0] != '0';
    return result;
}

AOTI_NOINLINE static void __check_inputs_outputs(
    AtenTensorHandle* input_handles, AtenTensorHandle* output_handles) {}
"""

# What a wrapper holds in place of AOTInductor's interface (_interface_compiled_once).
_INTERFACE_DECLARED = """
#include <torch/csrc/inductor/aoti_runtime/interface.h>
#include <torch/csrc/inductor/aoti_runtime/model_container.h>
"""
# The model's base class (aoti_runtime/model_base.h: a template of a few
# thousand lines, std::regex and all) is instantiated in the interface
# object, which a wrapper declares (_interface_compiled_once); where
# AOTInductor's model.h derives the model from it as this relies on.
_MODEL_DERIVED = "class AOTInductorModel : public AOTInductorModelBase<AOTInductorModel>"
_BASE_DECLARED = """
namespace torch::aot_inductor {
extern template class AOTInductorModelBase<AOTInductorModel>;
}
"""
_BASE_INSTANTIATED = """
namespace torch::aot_inductor {
template class AOTInductorModelBase<AOTInductorModel>;
}
"""


def cxx11_abi() -> bool:
    """Whether this torch was built with the C++11 ABI of libstdc++: a
    library compiled against it links with the same."""
    return bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def runner_available() -> bool:
    """Whether this torch has the C++ runner."""
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti,
                                                   "AOTIModelContainerRunnerCpu")


def cpu_runner(path: str) -> Any:
    """The C++ runner of the shared library at ``path`` (one model
    container: a runner serves one call at a time). Raises RuntimeError
    where it does not load."""
    return torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1)


def compile_library(graph: torch.fx.GraphModule, inputs: Sequence[torch.Tensor],
                    settings: Mapping[str, Any],
                    decompositions: Mapping[Any, Any] | None = None) -> tuple[bytes, str]:
    """The shared library AOTInductor compiles ``graph`` (of tensors to a
    tuple of tensors: :func:`.aten_graph.one_call`) into, for inputs
    laid out as ``inputs``, with Inductor ``settings`` and
    ``decompositions`` besides Inductor's, and the vector ISA it compiled
    it for. Raises :class:`UnexpectedPackage` where the
    compile makes more than one library, and whatever the compile raises.

    Through ``torch._inductor.aot_compile`` on the graph as it is, not
    ``aoti_compile_and_package`` on a ``torch.export`` of it: the export
    traces the graph again (0.4-2.5 s of a plan's part) for what a graph
    of tensors already is."""
    import json

    import torch._inductor

    options = {**settings, "aot_inductor.package": True}
    with torch.no_grad(), _no_input_checks(), _interface_compiled_once(), \
            _unbuilt_headers_left_out(), _decompositions_added(decompositions or {}):
        files = torch._inductor.aot_compile(graph, tuple(inputs), options=options)
    paths = [Path(f) for f in files if isinstance(f, str)]
    libraries = [p for p in paths if p.suffix == ".so"]
    blobs = [p for p in paths if p.suffix in (".bin", ".blob")] + \
        [f for f in files if not isinstance(f, str)]
    if len(libraries) != 1 or not libraries[0].name.endswith(".wrapper.so") or blobs:
        raise UnexpectedPackage(f"AOTInductor compiled {[str(p) for p in libraries]} and "
                                f"{len(blobs)} constant file(s), not one library")
    library = libraries[0].read_bytes()
    meta = libraries[0].with_name(libraries[0].name.removesuffix(".so") + "_metadata.json")
    isa = json.loads(meta.read_text()).get("AOTI_CPU_ISA", "") if meta.exists() else ""
    return library, str(isa)


def exports_call_scripts() -> bool:
    """Whether AOTInductor's export can trace a TorchScript function made
    from a graph (:func:`scripts_called_in_export`)."""
    import torch.compiler

    return hasattr(torch.compiler, "_is_exporting_flag")


@contextlib.contextmanager
def scripts_called_in_export() -> Iterator[None]:
    """TorchScript functions called in the block run as TorchScript, within
    AOTInductor's export too. While torch says it is exporting
    (``torch.compiler.is_exporting()``), its caller of a TorchScript
    function calls the Python function it was scripted from
    (``_torchdynamo_inline``) instead, which a replay's function, made
    from a graph, has none of (an internal assert); in the block torch says
    it is not, and the export traces the ops the function dispatches all
    the same."""
    import torch.compiler

    exporting = torch.compiler._is_exporting_flag
    torch.compiler._is_exporting_flag = False
    try:
        yield
    finally:
        torch.compiler._is_exporting_flag = exporting


@contextlib.contextmanager
def _decompositions_added(table: Mapping[Any, Any]) -> Iterator[None]:
    """Inductor's decompositions, and ``table``'s over them, in the block:
    those its export applies as it traces (Inductor reads them from
    ``select_decomp_table``, whichever of its two tables that picks)."""
    if not table:
        yield
        return
    from torch._inductor import decomposition

    fast = {**decomposition.fast_random_decomps(), **table}
    with _replaced(decomposition, "fast_random_decomps", lambda: fast), \
            _replaced(decomposition, "decompositions", {**decomposition.decompositions, **table}):
        yield


@contextlib.contextmanager
def _no_input_checks() -> Iterator[None]:
    """Inductor's C++ wrapper without the checks of each input's dtype,
    sizes, strides and device that it writes into every library: one
    function of about 70 lines an input, which run only where
    ``AOTI_RUNTIME_CHECK_INPUTS`` is set, and which g++ spends 1.6 of a
    small GPT's forward plan's 6.3 s compiling at -O0 (97 inputs). A
    library's inputs are checked by its key and its caller
    (:mod:`.runner`), never by them. The wrapper still calls the empty
    ``__check_inputs_outputs``, and the switch the wrapper's other checks
    read is defined as Inductor defines it. Where this torch's generator
    has no such method, it is left as it is."""
    from torch._inductor.codegen import cpp_wrapper_cpu

    wrapper = cpp_wrapper_cpu.CppWrapperCpu
    if not hasattr(wrapper, "generate_input_output_runtime_checks"):
        yield
        return

    def checks_off(self: Any) -> None:
        self.prefix.splice_aot(_CHECKS_OFF)

    with _replaced(wrapper, "generate_input_output_runtime_checks", checks_off):
        yield


@contextlib.contextmanager
def _interface_compiled_once() -> Iterator[None]:
    """AOTInductor's interface (``aoti_runtime/interface.cpp``, the C
    functions a runner calls, about 650 lines that every wrapper inlines
    the same) compiled once per compile line and linked into each library,
    instead of compiled again in every wrapper: 2.4 s of each wrapper's
    compile. So is the model's base class template, which each wrapper
    otherwise instantiates whole: a small GPT's plan wrappers compiled in
    1.7 s instead of 3.8 s (4 s instead of 5.65 s before the precompiled
    header is built), their objects a quarter of the size. The object is
    kept beside Inductor's own compiled code (its cache directory, as
    trusted as the precompiled header the wrapper includes), keyed by the
    wrapper's compile line with the wrapper's paths taken out, the source
    it compiles and the compiler. Where this torch's generator or build
    lacks what this relies on, the wrapper is left as it is."""
    from torch._inductor import config, cpp_builder
    from torch._inductor.codegen import cpp_wrapper_cpu
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    wrapper = cpp_wrapper_cpu.CppWrapperCpu
    source = Path(cpp_wrapper_cpu.__file__).parent / "aoti_runtime" / "interface.cpp"
    if not (hasattr(wrapper, "_write_aoti_interface_header") and source.is_file()
            and hasattr(cpp_builder, "run_compile_cmd")):
        yield
        return
    run = cpp_builder.run_compile_cmd
    header = wrapper._write_aoti_interface_header
    built: list[concurrent.futures.Future[str]] = []
    model_h = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_runtime/model.h"
    base = model_h.is_file() and _MODEL_DERIVED in model_h.read_text()
    declared = _INTERFACE_DECLARED + (_BASE_DECLARED if base else "")
    interface = source.read_text() + (_BASE_INSTANTIATED if base else "")

    def declared_only(self: Any) -> None:
        if not config.aot_inductor.dynamic_linkage:
            return header(self)
        self.header.splice(declared)
        return None

    def compile_line(cmd_line: str, cwd: str) -> None:
        words = shlex.split(cmd_line)
        if "-c" in words and any(w.endswith(".wrapper.cpp") for w in words):
            # Where the object is not made yet, it is made beside the
            # wrapper's compile, not before it; a compile waiting for
            # another's to make it compiles its wrapper meanwhile.
            built[:] = [beside.submit(_interface_object, words, interface,
                                      Path(cache_dir()), run, cwd)]
        elif "-shared" in words and any(w.endswith(".wrapper.o") for w in words):
            if not built:
                raise UnexpectedPackage("a wrapper linked that was not compiled here")
            at = next(i for i, w in enumerate(words) if w.endswith(".wrapper.o"))
            cmd_line = shlex.join([*words[:at + 1], built[0].result(), *words[at + 1:]])
        run(cmd_line, cwd)

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ltc_cache-aoti") \
            as beside, _replaced(wrapper, "_write_aoti_interface_header", declared_only), \
            _replaced(cpp_builder, "run_compile_cmd", compile_line):
        yield


def prepare_compiles() -> None:
    """Import what a compile runs: Inductor's lowering, code generators and
    builder (seconds). Starts no thread: the process may fork after (the
    worker's compile processes do, and share what it imported)."""
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor import cpp_builder, cpu_vec_isa  # noqa: F401
    from torch._inductor.codegen import cpp_wrapper_cpu  # noqa: F401


def check_isas_beside() -> None:
    """Start Inductor's check of the vector ISAs this compiler builds for
    and this CPU runs (a g++ build and a load of a small library a
    candidate ISA, kept in Inductor's cache directory: 2.3-3.5 s on an AVX2
    machine, one build more for each of AVX-512's and AMX's ISAs on a CPU
    that has them) in a thread, so that the first library's lowering does
    not wait for it to start: the lowering takes its result from Inductor's
    cache, or waits on Inductor's lock for the build under way (another
    compile process's)."""
    from torch._inductor import cpu_vec_isa

    def check() -> None:
        with contextlib.suppress(Exception):  # the lowering checks again, and says
            cpu_vec_isa.valid_vec_isa_list()

    threading.Thread(target=check, name="ltc_cache-isa-check", daemon=True).start()


@contextlib.contextmanager
def headers_built_after() -> Iterator[None]:
    """Libraries compiled in the block do not wait for Inductor's
    precompiled headers to be built: one for the wrapper, one for the
    kernels, kept once a machine and compiler in the temporary directory
    (whatever ``TORCHINDUCTOR_CACHE_DIR`` says). Where they are built
    already, they are used; where not, the compile includes the headers
    themselves, and the precompiled ones are built as the block ends, for
    the compiles after it. On a machine's first run, building both took
    10.4 s of a small GPT's two libraries' compile, and saves 3.4 s a
    library once built (docs/torch/aot-inductor.md#precompiled-headers)."""
    global _unbuilt_headers
    _unbuilt_headers = left = []
    try:
        yield
    finally:
        _unbuilt_headers = None
    if left:  # the block ended as it should
        from torch._inductor import codecache

        for lock_path, builders in left:
            codecache._worker_compile_cpp(lock_path, builders)


@contextlib.contextmanager
def _unbuilt_headers_left_out() -> Iterator[None]:
    """Inside :func:`headers_built_after`'s block, Inductor's build of a
    precompiled header not built yet is recorded instead of run; the
    header it would have precompiled is included as it is (g++ reads
    ``-include x.h`` without ``x.h.gch`` as a plain include)."""
    from torch._inductor import codecache

    left = _unbuilt_headers
    if left is None or not hasattr(codecache, "_worker_compile_cpp"):
        yield
        return
    build = codecache._worker_compile_cpp

    def unless_a_header(lock_path: str, builders: Sequence[Any]) -> None:
        targets = [b.get_target_file_path() for b in builders]
        unbuilt = [t for t in targets if not os.path.exists(t)]
        if unbuilt and all(t.endswith((".gch", ".pch")) for t in unbuilt):
            left.append((lock_path, tuple(builders)))
            return
        build(lock_path, builders)

    with _replaced(codecache, "_worker_compile_cpp", unless_a_header):
        yield


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block (Inductor's, patched
    while a library compiles), under :data:`_PATCH`, and what it was after."""
    from unittest import mock

    with _PATCH, mock.patch.object(owner, name, value):
        yield


def _interface_object(wrapper_line: list[str], source: str, directory: Path,
                      run: Any, cwd: str) -> str:
    """The object of the C++ ``source`` compiled with ``wrapper_line`` (the
    wrapper's own compile line), from ``directory`` where it was compiled
    before, else compiled there now (written under a name of its own, then
    renamed: compiles beside it may make the same object)."""
    out = wrapper_line.index("-o")
    flags = [w for w in wrapper_line[:out] + wrapper_line[out + 2:]
             if not w.endswith(".wrapper.cpp")]
    compiler = shutil.which(flags[0]) or flags[0]
    seen = os.stat(compiler)
    key = hashlib.sha256("\0".join([*flags, source, compiler, str(seen.st_size),
                                     str(seen.st_mtime_ns)]).encode()).hexdigest()[:32]
    folder = directory / "ltc_cache_interface"
    target = folder / f"{key}.o"
    if target.is_file():
        return target.as_posix()
    import filelock

    folder.mkdir(parents=True, exist_ok=True)
    # One compile makes it; the compiles beside it wait for it (each
    # making its own took twice the time on a 2-core machine).
    with filelock.FileLock(str(folder / f"{key}.lock")):
        if not target.is_file():
            code = folder / f"{key}.cpp"
            code.write_text(source)
            partial = folder / f"{key}.{os.getpid()}.{threading.get_ident()}.o"
            line = [code.as_posix() if w.endswith(".wrapper.cpp") else w for w in wrapper_line]
            line[out + 1] = partial.as_posix()
            run(shlex.join(line), cwd)
            os.replace(partial, target)
    return target.as_posix()
