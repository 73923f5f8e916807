"""The torch-private surfaces ltc_cache stands on, pinned: where a torch
upgrade breaks first, by name, rather than as a wrong result or a silent
fall back to the slow path.

One section per surface; each surface has one module in the package that
alone touches it (tests/common/test_layers.py holds the others to that),
written against torch 2.13:

- LTC's bindings and lazy internals: ltc_cache/graph/lazy_bindings.py
- AOTAutograd's internals: ltc_cache/compile_backend/aot_autograd.py
- AOTInductor: ltc_cache/graph/fused/aoti.py, and its pick of a vector ISA with the CPU
  probes it reads: ltc_cache/graph/fused/cpu_isa.py
- FX and ATen operators (op classes, pytree, decompositions, FX's code
  generators): ltc_cache/fx_ops.py
- Dynamo's precompile and package, its settings, counters and errors:
  ltc_cache/dynamo_package.py
- Dynamo's guards: ltc_cache/program/guards.py

Every private name the fence (tests/common/test_layers.py, ``SURFACES``)
gives an owner is pinned by name below (:func:`test_torch_still_has`); the
sections pin what the owners rely on of each.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import os
import pickle
import shutil
import threading
from pathlib import Path

import pytest
import torch
from test_layers import SURFACES


def _resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names, imported as far as it is a
    module; fails naming the first part this torch lacks."""
    parts = dotted.split(".")
    found: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        prefix = ".".join(parts[:i + 1])
        try:
            found = importlib.import_module(prefix)
            continue
        except ImportError:
            pass
        if not hasattr(found, part):
            pytest.fail(f"this torch has no {prefix} (wanted for {dotted})")
        found = getattr(found, part)
    return found


PINNED = sorted({(name, s.owner) for s in SURFACES for name in s.torch_modules})


@pytest.mark.parametrize(("name", "owner"), PINNED, ids=[name for name, _ in PINNED])
def test_torch_still_has(name, owner):
    """Each private torch name an owner module touches, by name: a torch
    that moves one fails here, naming it (and ``owner``, the module to
    change), before anything runs."""
    assert _resolve(name) is not None, f"{name} is None ({owner} uses it)"

# -- LTC: ltc_cache/graph/lazy_bindings.py ------------------------------------------------------


def test_ltc_has_the_bindings_lazy_bindings_calls():
    """Every private LTC function lazy_bindings.py calls, by name."""
    import torch._lazy
    import torch._lazy.computation
    import torch._lazy.debug
    import torch._lazy.extract_compiled_graph
    import torch._lazy.metrics
    import torch._lazy.ts_backend

    for name in ("_get_force_fallback", "_get_symbolic_shape_mode",
                 "_get_default_device_type"):
        assert callable(getattr(torch._C._lazy, name)), name
    assert callable(torch._lazy.ts_backend.init)
    assert callable(torch._lazy.get_tensor_id) and callable(torch._lazy.sync_multi)
    assert list(inspect.signature(torch._lazy.sync_multi).parameters) == ["tensors", "devices"]
    assert list(inspect.signature(torch._lazy.debug.dump_ir).parameters) == [
        "tensors", "ir_format"]
    assert callable(torch._lazy.computation.get_tensors_ts_device_data_node)
    assert callable(torch._lazy.computation.get_graph_hash)
    assert callable(torch._lazy.metrics.reset)
    assert callable(torch._lazy.extract_compiled_graph.force_lazy_device)
    assert callable(torch._lazy.extract_compiled_graph.get_fallback_ops)
    assert callable(torch._sync) and callable(torch._is_functional_tensor)


def test_ltc_reports_a_fallback_as_lazy_bindings_reads_it():
    """A trace refuses a graph by the ops LTC's counters say fell back to
    eager (``"aten::op=count"``), and reads a traced graph's IR, inputs and
    hash: what a trace of one op gives."""
    from ltc_cache.graph import lazy_bindings as ltc
    from ltc_cache.graph.extract import init_lazy_backend

    init_lazy_backend()
    assert ltc.backend_registered()
    x = torch.arange(6.0).reshape(2, 3).to("lazy")
    ltc.reset_metrics()
    y = torch.sign(x) + 1  # sign has no TorchScript lowering: a fallback
    ltc.sync_multi([y])
    fallbacks = ltc.fallback_ops()
    ltc.reset_metrics()
    assert any(op.startswith("aten::sign") and "=" in op for op in fallbacks), fallbacks
    z = x * 2
    assert "aten::mul" in ltc.dump_ir([z])
    ids, values = ltc.ts_device_data([z])
    assert len(ids) == len(values) >= 1 and isinstance(ltc.tensor_id(z), int)
    assert isinstance(ltc.graph_hash([z]), bytes)
    assert isinstance(ltc.force_fallback(), str)
    assert isinstance(ltc.symbolic_shape_mode(), bool)


# -- AOTAutograd: ltc_cache/compile_backend/aot_autograd.py --------------------------------------


def test_aotautograd_has_what_aot_autograd_py_calls():
    """The entry points, the tracing context and the modes the backend uses."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import TracingContext, tracing
    from torch._subclasses import FakeTensor
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _disable_current_modes

    assert callable(aot_autograd) and callable(make_boxed_func) and callable(tracing)
    assert callable(TracingContext.try_get) and callable(_disable_current_modes)
    assert hasattr(TracingContext(FakeTensorMode()), "fw_metadata")
    assert issubclass(FakeTensor, torch.Tensor)
    assert callable(torch.compiler._compile_session_context)


def test_aotautograd_can_compile_a_backward_with_its_forward():
    """The private switch backend training plans rely on for graphs whose
    backward never runs in the cold process
    (docs/torch/aot-autograd.md#backward-compiled-on-first-backward)."""
    from torch._functorch import config

    assert hasattr(config, "force_non_lazy_backward_lowering")


def test_aotautograd_internals_plans_rely_on():
    """Pins: what plan.runs_bare and joint.trainable read of AOTAutograd's
    metadata, and the one thing its autograd wrapper does that
    JointFunction repeats (``_unsafe_view`` over views of intermediates,
    docs/torch/aot-autograd.md#views-of-intermediates-hidden-from-autograd). A torch that changes
    these fails here by name, not as a wrong gradient."""
    # Dynamo first, as every import of AOTAutograd in torch comes after it:
    # runtime_wrappers imported first in a process meets a cycle through Dynamo.
    import torch._dynamo  # noqa: F401
    from torch._functorch._aot_autograd import runtime_wrappers, schemas

    names = {t.name for t in schemas.OutputType}
    assert {"non_alias", "unsafe_view_alias"} <= names
    fields = {f.name for f in dataclasses.fields(schemas.ViewAndMutationMeta)}
    assert {"input_info", "output_info", "num_intermediate_bases", "tokens",
            "num_symints_saved_for_bw", "num_backward_tokens"} <= fields
    post_init = inspect.getsource(schemas.ViewAndMutationMeta.__post_init__)
    assert "self.is_rng_op_functionalized" in post_init
    assert "self.num_outputs_rng_offset" in post_init
    epilogue = inspect.getsource(runtime_wrappers._AutogradForwardEpilogue)
    assert "unsafe_view_out_indices" in epilogue and "_unsafe_view(" in epilogue
    # The inference wrapper leaves such outputs as they are.
    assert runtime_wrappers._HANDLER_MAP[schemas.OutputType.unsafe_view_alias] is \
        runtime_wrappers.NoopAliasHandler


def test_aot_keeps_a_buffer_update_in_the_training_graph():
    """Pins the private rule the training plans of BatchNorm rely on: with
    ``keep_inference_input_mutations``, a data-only update of an input that
    needs no gradient is ``MUTATED_IN_GRAPH`` in a training graph too. If
    torch changes it, such graphs get no plan (AOTAutograd on every warm
    start) and the CNN test of tests/compile_backend/test_batchnorm_training.py
    fails on its warm AOTAutograd count."""
    from torch._functorch._aot_autograd.functional_utils import (
        _check_if_mutation_can_be_in_graph,
    )

    flags = dict(keep_input_mutations=True, mutates_data=True, mutates_metadata=False,
                 mutations_hidden_from_autograd=False,
                 mutations_under_no_grad_or_inference_mode=False,
                 mutates_storage_metadata=False, mutation_inductor_storage_resize=False)
    assert _check_if_mutation_can_be_in_graph(**flags, requires_grad=False)
    assert not _check_if_mutation_can_be_in_graph(**flags, requires_grad=True)


def test_aot_autograd_makes_fake_tensors_as_a_guard_state_does():
    """What fake_tensor_maker wraps: a fake tensor of a meta tensor, its
    device, type and raw dispatch keys, all in one fake mode."""
    from torch._subclasses.fake_tensor import FakeTensor

    from ltc_cache.compile_backend.aot_autograd import fake_mode, fake_tensor_maker

    make = fake_tensor_maker()
    meta = torch.empty(2, 3, device="meta")
    raw = torch._C._dispatch_keys(torch.empty(1)).raw_repr()
    a, b = (make(meta, torch.device("cpu"), torch.Tensor, raw) for _ in range(2))
    assert isinstance(a, FakeTensor) and a.shape == (2, 3) and a.device.type == "cpu"
    assert a.fake_mode is b.fake_mode
    assert fake_mode() is not None


# -- FX and ATen operators: ltc_cache/fx_ops.py ------------------------------------------------


def test_fx_ops_does_what_its_callers_rely_on():
    """What fx_ops.py hands on, as its callers use it: op classes a node's
    target is checked against, pytree's walk, the dispatcher's op list,
    decompositions, the random-op wrappers, FX's boxed code generator and
    lazy graph module, and a reparametrised module."""
    from ltc_cache import fx_ops

    add = torch.ops.aten.add.Tensor
    assert isinstance(add, fx_ops.OpOverload)
    assert isinstance(torch.ops.aten.add, fx_ops.OpOverloadPacket)
    assert fx_ops.tree_leaves(([1, (2,)], {"a": 3})) == [1, 2, 3]
    assert fx_ops.tree_map(lambda v: v * 2, [1, (2,)]) == [2, (4,)]
    assert "aten::add.Tensor" in fx_ops.aten_op_names()
    with fx_ops.python_dispatcher_disabled():
        pass
    hardtanh = torch.ops.aten.hardtanh.default
    assert hardtanh in fx_ops.decompositions_of([hardtanh])
    for name in ("run_and_save_rng_state", "run_with_rng_state"):
        assert isinstance(fx_ops.rng_wrapper(name), fx_ops.HigherOrderOperator), name
    assert fx_ops.boxed_code_generator() is not None
    from torch.fx._lazy_graph_module import _LazyGraphModule

    assert fx_ops.lazy_module_class() is _LazyGraphModule
    linear = torch.nn.Linear(2, 2)
    zero = {"weight": torch.zeros(2, 2), "bias": torch.ones(2)}
    with fx_ops.reparametrized(linear, zero):
        assert torch.equal(linear(torch.ones(1, 2)), torch.ones(1, 2))
    assert isinstance(linear.bias, torch.nn.Parameter)  # its own again


# -- AOTInductor: ltc_cache/graph/fused/aoti.py --------------------------------------------------


def test_torch_still_has_what_the_fused_tier_uses():
    """Pinned: the C++ runner (load), AOTInductor's compile and make_fx
    (build), and the CPU capability the key names. If torch moves one of
    these, this fails by name."""
    from ltc_cache.graph.fused import aoti, platform

    assert aoti.runner_available()
    import torch._inductor
    from torch.fx.experimental.proxy_tensor import make_fx

    assert callable(torch._inductor.aot_compile) and callable(make_fx)
    # The input checks aoti._no_input_checks leaves out of a wrapper: the
    # method that writes them, the function run_impl calls, and the switch
    # other checks read, which the replacement defines as Inductor does.
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    written = inspect.getsource(CppWrapperCpu.generate_input_output_runtime_checks)
    assert "__check_inputs_outputs" in written and "check_input_" in written
    assert "_check_aoti_runtime_check_inputs_env" in written
    assert "__check_inputs_outputs(input_handles, output_handles)" in inspect.getsource(
        CppWrapperCpu._write_aoti_entry_point_signature)
    assert 'getenv("AOTI_RUNTIME_CHECK_INPUTS")' in written
    # The interface aoti._interface_compiled_once compiles once: the method
    # that inlines its source, and the function every g++ line goes through.
    from torch._inductor import cpp_builder

    inlines = inspect.getsource(CppWrapperCpu._write_aoti_interface_header)
    assert '"interface.cpp"' in inlines and "dynamic_linkage" in inlines
    assert "run_compile_cmd(" in inspect.getsource(cpp_builder.CppBuilder.build)
    assert list(inspect.signature(cpp_builder.run_compile_cmd).parameters) == ["cmd_line", "cwd"]
    # And the model's base class template it instantiates there, which a
    # wrapper declares: the class the wrapper defines derives from it.
    model_h = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_runtime/model.h"
    assert aoti._MODEL_DERIVED in model_h.read_text()
    assert "options" in inspect.signature(torch._inductor.aot_compile).parameters
    # The decompositions aoti._decompositions_added adds: the table the
    # export reads is select_decomp_table's, which reads one of two globals.
    from torch._inductor import compile_fx, decomposition

    picks = inspect.getsource(decomposition.select_decomp_table)
    assert "return decompositions" in picks and "fast_random_decomps()" in picks
    assert inspect.signature(compile_fx._compile_fx_main).parameters[
        "get_decomp_fn"].default is decomposition.select_decomp_table
    # The precompiled headers aoti.headers_built_after leaves for after:
    # each built through the function that builds what is missing.
    from torch._inductor import codecache

    header = inspect.getsource(codecache._precompile_header)
    assert "_worker_compile_cpp(" in header and "precompiling=True" in header
    assert list(inspect.signature(codecache._worker_compile_cpp).parameters) == [
        "lock_path", "cpp_builders"]
    assert hasattr(cpp_builder.CppBuilder, "get_target_file_path")
    # The ISA check aoti.check_isas_beside starts ahead: cached, and what the pick reads.
    from torch._inductor import cpu_vec_isa

    assert hasattr(cpu_vec_isa.valid_vec_isa_list, "cache_info")
    assert "valid_vec_isa_list()" in inspect.getsource(cpu_vec_isa.pick_vec_isa)
    assert platform.machine_isa() == platform.machine_isa().upper()
    assert aoti.cxx11_abi() in (True, False)
    assert hasattr(torch._C, "_dispatch_get_all_op_names")


def test_a_script_made_from_a_graph_is_traced_by_the_export_once_told_it_is_not_exporting():
    """Pinned: what aoti.scripts_called_in_export relies on. While torch
    says it is exporting, calling a TorchScript function made from a graph
    (as a replay's is) fails an internal assert; told it is not, the
    function runs as TorchScript, its ops dispatched to whatever traces."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ltc_cache.graph.fused import aoti

    graph = torch._C.parse_ir("""
        graph(%x : Tensor):
          %y : Tensor = aten::relu(%x)
          return (%y)""")
    script = torch._C._create_function_from_graph("pinned", graph)
    assert not hasattr(script, "_torchdynamo_inline")
    assert aoti.exports_call_scripts()
    x = torch.randn(3)
    exporting = torch.compiler._is_exporting_flag
    torch.compiler._is_exporting_flag = True
    try:
        with pytest.raises(RuntimeError, match="_torchdynamo_inline"):
            script(x)
        with aoti.scripts_called_in_export():
            assert not torch.compiler.is_exporting()
            traced = make_fx(script, tracing_mode="fake")(x)
        assert torch.compiler.is_exporting()
    finally:
        torch.compiler._is_exporting_flag = exporting
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [
        torch.ops.aten.relu.default]


def test_inductor_picks_the_isa_cpu_isa_predicts(monkeypatch):
    """ltc_cache/graph/fused/cpu_isa.py mirrors Inductor's pick of a vector
    ISA (a fused key names it before any Inductor import): the x86 ISAs and
    their names, widest first, and the pick among them for every CPU kind
    and ATEN_CPU_CAPABILITY; and on this machine, Inductor's real pick
    (compile checks and all), by default and as an AVX2 machine. Also the
    probes it reads, which are Inductor's own."""
    import warnings

    from helpers import CPU_KINDS
    from torch._inductor import cpu_vec_isa as vec

    from ltc_cache.graph.fused import cpu_isa

    for probe in ("avx2", "avx512", "vnni", "avx512_bf16", "amx_tile", "amx_fp16"):
        assert isinstance(getattr(torch.cpu, f"_is_{probe}_supported")(), bool)
    x86 = [isa for isa in vec.supported_vec_isa_list
           if isinstance(isa, vec.VecAVX2 | vec.VecAVX512)]
    assert [str(isa) for isa in x86] == [" ".join(isa) for isa in cpu_isa._INDUCTOR_ISAS]
    for features in CPU_KINDS.values():
        monkeypatch.setattr(cpu_isa, "_probed", lambda features=features: features)
        valid = [isa for isa in x86 if set(str(isa).split()) <= features]
        for capability in (None, "default", "avx2", "avx512", "AVX2", "sve256"):
            if capability is None:
                monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
            else:
                monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "ignoring invalid value"
                picked = (vec.get_isa_from_cpu_capability(capability, valid, vec.invalid_vec_isa)
                          if valid else vec.invalid_vec_isa)
            assert cpu_isa.inductor_isa() == cpu_isa.isa_words(str(picked)), (features, capability)
    monkeypatch.undo()
    if cpu_isa.x86_machine() and shutil.which(os.environ.get("CXX") or "g++"):
        for capability in (None, "avx2"):
            if capability is not None:
                monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
            assert cpu_isa.inductor_isa() == cpu_isa.isa_words(str(vec.pick_vec_isa()))


def test_inductor_compiles_for_the_target_the_settings_name():
    """A library is compiled for the baseline of its ISA's CPUs, not
    Inductor's ``-march=native`` (platform.inductor_settings): Inductor
    reads ``cpp.march`` for the wrapper's and the kernels' g++ lines, and
    adds the ISA's own flags beside it."""
    from torch._inductor import config, cpp_builder

    from ltc_cache.graph.fused import cpu_isa, platform

    if not cpu_isa.x86_machine():
        pytest.skip("the fused tier builds on x86-64 only")
    march = platform.inductor_settings()["cpp.march"]
    assert march.startswith("x86-64")
    with config.patch({"cpp.march": march}):
        assert cpp_builder._get_cpu_arch_cflags("g++") == [f"march={march}"]
    assert cpp_builder._get_cpu_arch_cflags("g++") != [f"march={march}"]  # native, by default


# -- TorchScript IR: ltc_cache/graph/torchscript_ir.py -------------------------------------------


def test_torchscript_ir_reads_runs_and_prunes_what_entries_store():
    """Pinned: stored IR parses back (tensor constants too, where asked),
    becomes a function that runs, loses its dead nodes and pools its
    constants; schemas parse; the executor's optimisation toggles."""
    from ltc_cache.graph import torchscript_ir as ir

    text = ("graph(%p0 : Tensor, %p1 : Tensor):\n"
            "  %two : int = prim::Constant[value=2]()\n"
            "  %also_two : int = prim::Constant[value=2]()\n"
            "  %unused : Tensor = aten::mul(%p0, %two)\n"
            "  %one : int = prim::Constant[value=1]()\n"
            "  %sum : Tensor = aten::add(%p0, %p1, %one)\n"
            "  return (%sum)\n")
    graph = ir.parse_ir(text)
    assert isinstance(graph, ir.Graph) and all(isinstance(n, ir.Node) for n in graph.nodes())
    assert all(isinstance(v, ir.Value) for v in graph.inputs())
    assert isinstance(next(graph.inputs()).type(), ir.TensorType)
    ir.remove_dead_code(graph)
    assert [n.kind() for n in graph.nodes()] == ["prim::Constant", "aten::add"]
    fn = ir.function_from_graph("pinned", ir.parse_ir(text))
    a, b = torch.ones(2), torch.full((2,), 2.0)
    assert torch.equal(fn(a, b), a + b)
    constant = ("graph(%p0 : Tensor):\n"
                "  %c : Long(requires_grad=0, device=cpu) = prim::Constant[value={2}]()\n"
                "  %one : int = prim::Constant[value=1]()\n"
                "  %r : Tensor = aten::add(%p0, %c, %one)\n  return (%r)\n")
    (node, *_) = ir.parse_ir(constant, tensor_constants=True).nodes()
    assert node.output().toIValue().item() == 2
    schema = ir.parse_schema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) "
                             "-> Tensor")
    assert [a.name for a in schema.arguments] == ["self", "other", "alpha"]
    assert isinstance(ir.ListType.ofInts(), ir.JitType)
    assert isinstance(ir.ListType(ir.BoolType.get()).getElementType(), ir.BoolType)
    before = ir.executor_optimize()
    try:
        ir.set_executor_optimize(not before)
        assert ir.executor_optimize() is (not before)
    finally:
        ir.set_executor_optimize(before)


# --- Dynamo's precompile and package: ltc_cache/dynamo_package.py -------------


def test_what_the_single_graph_route_reaches_into():
    """Dynamo's AOT precompile, as ltc_cache.program.single_graph and
    program_graph use it (through dynamo_package)."""
    from torch._dynamo import aot_compile, convert_frame, package
    from torch._dynamo.aot_compile_types import SerializableCallable
    from torch.fx._graph_pickler import GraphPickler

    from ltc_cache.program import program_graph

    assert callable(getattr(torch.compile(lambda x: x, backend="eager", fullgraph=True),
                            "aot_compile", None))
    fn = aot_compile.AOTCompiledFunction
    for name in ("serialize", "deserialize", "prepare_f_locals"):
        assert callable(getattr(fn, name)), name
    assert {"external_data"} <= set(inspect.signature(fn.serialize).parameters)
    assert {"f_globals", "external_closure_data"} <= set(
        inspect.signature(fn.deserialize).parameters)
    assert {"guard_manager", "runtime_env", "compiled_fn", "backend_id", "source_info"} <= {
        f.name for f in dataclasses.fields(aot_compile.CompileArtifacts)}
    assert {"external_refs", "import_sources", "used_globals"} <= {
        f.name for f in dataclasses.fields(convert_frame.GraphRuntimeEnv)}
    assert callable(package.SourceInfo.add_code)
    assert callable(convert_frame.get_traced_fn)
    assert callable(GraphPickler.dumps) and callable(GraphPickler.loads)
    assert issubclass(program_graph.LtcProgramGraph, SerializableCallable)


def test_what_the_capture_patches_in_dynamos_side_effects():
    """restored_attributes_allowed (ltc_cache.program.capture) patches
    nothing, silently, where this torch lacks a piece it relies on."""
    from ltc_cache import dynamo_package

    assert dynamo_package.side_effect_pieces() is not None


def test_what_the_frames_rely_on(dynamo_reset):
    """Fails loudly when torch changes what ltc_cache.program.frames relies on."""
    from torch._C._dynamo.eval_frame import (
        _debug_get_cache_entry_list,
        _FrameAction,
        set_code_exec_strategy,
    )
    from torch._dynamo import bytecode_transformation, convert_frame, output_graph, package
    from torch._dynamo.types import ConvertFrameReturn

    from ltc_cache import dynamo_package

    package_class = package.CompilePackage
    assert dynamo_package.CompilePackage is package_class
    assert list(inspect.signature(package_class.__init__).parameters) == [
        "self", "fn", "dynamo", "ignore_inlined_sources"]
    for name in ("add_guarded_code", "add_inlined_source", "code_context", "_add_user_function",
                 "_add_function", "install", "cache_entry", "cached_backends"):
        assert hasattr(package_class, name), name

    def f(x):
        return x + 1

    made = package_class(f)
    for name in ("_codes", "_current_entry", "_resume_codes"):
        assert hasattr(made, name), name
    assert list(inspect.signature(package.load_guard_manager).parameters) == [
        "guards_state", "target_code", "runtime_global_scope"]
    # install() builds each frame's guard manager through the module global.
    assert "load_guard_manager" in package_class.install.__code__.co_names
    assert {f.name for f in dataclasses.fields(package._DynamoCodeCacheEntry)} >= {
        "python_code", "python_module", "function_names", "guarded_codes", "import_sources",
        "backend_ids", "code_source", "install_to_global", "bypassed"}
    assert callable(package.SerializedCode.from_code_object)
    assert "package" in inspect.signature(torch._dynamo.eval_frame._optimize).parameters
    # The backend wrapper the frames swap for a plain one while optimize() runs.
    assert "get_compiler_fn" in torch._dynamo.eval_frame._optimize.__code__.co_names
    # Resume functions and the builtins dict are named from this counter.
    assert "_unique_id_counter" in bytecode_transformation.unique_id.__code__.co_names
    assert next(bytecode_transformation._unique_id_counter) >= 0
    assert int(_FrameAction.SKIP) == dynamo_package.SKIP
    assert callable(set_code_exec_strategy) and callable(_debug_get_cache_entry_list)
    assert {"frame_exec_strategy", "apply_to_code", "guarded_code"} <= set(
        ConvertFrameReturn.__dataclass_fields__)
    assert callable(convert_frame.ConvertFrame.__call__)
    assert list(inspect.signature(output_graph.OutputGraph.install_global_unsafe).parameters) \
        == ["self", "name", "value"]
    assert hasattr(torch._C._dynamo.guards.RootGuardManager, "add_lambda_guard")


def test_what_the_stand_in_relies_on():
    """Fails by name when torch changes what CompiledModule and the capture
    lean on."""
    from torch._dynamo.eval_frame import OptimizedModule

    # CompiledModule sets what OptimizedModule's methods read, without its __init__.
    assert "_orig_mod" in OptimizedModule._opt_mod_attributes
    assert isinstance(OptimizedModule.__dict__["training"], property)
    for name in ("__getattr__", "__setattr__", "__reduce__"):
        assert name in OptimizedModule.__dict__, name
    # The capture skips once-only log calls through this setting.
    assert isinstance(torch._dynamo.config.ignore_logging_functions, set)


def test_what_torch_does_that_threads_rely_on():
    """docs/torch/dynamo.md#fx-tracing-flag-is-process-wide and
    docs/torch/dynamo.md#dynamo-captures-once-per-missing-thread: Dynamo's compile lock is a
    reentrant lock ltc_cache can share (ltc_cache/threads.py takes it from ``convert_frame`` itself:
    a layer below program/); FX's "tracing" mark is process-wide and a compile session hides it from
    Dynamo; Dynamo's settings are per thread (so patching one around a call needs no care
    for other threads)."""
    import torch.fx._symbolic_trace as fx_trace
    from torch._dynamo import convert_frame

    from ltc_cache.threads import compile_lock

    assert compile_lock() is convert_frame.compile_lock
    with compile_lock(), compile_lock():  # reentrant
        pass
    before = fx_trace._is_fx_tracing_flag
    fx_trace._is_fx_tracing_flag = True
    try:
        assert fx_trace.is_fx_symbolic_tracing()
        with torch.compiler._compile_session_context():
            assert not fx_trace.is_fx_symbolic_tracing()
    finally:
        fx_trace._is_fx_tracing_flag = before
    seen = []
    with torch._dynamo.config.patch(optimize_ddp=False):
        other = threading.Thread(target=lambda: seen.append(torch._dynamo.config.optimize_ddp))
        other.start()
        other.join()
        assert torch._dynamo.config.optimize_ddp is False
    assert seen == [True]


def test_what_looking_again_before_a_capture_relies_on(dynamo_reset):
    """docs/torch/dynamo.md#dynamo-captures-once-per-missing-thread: Dynamo's
    ``CatchErrorsWrapper`` calls ``ConvertFrame`` under
    its compile lock with the frame, the entry the hook looked at, the
    hooks, the frame's state and ``skip``, and the hook runs a frame as it
    is, the frames it calls only from their entries, for a result with
    RUN_ONLY as its recursive action and no code; each cache entry's guard
    manager checks a frame's locals as a dict."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, _FrameAction
    from torch._dynamo import convert_frame, eval_frame

    assert list(inspect.signature(convert_frame.ConvertFrame.__call__).parameters)[:6] == [
        "self", "frame", "cache_entry", "hooks", "frame_state", "skip"]
    wrapper = inspect.getsource(convert_frame.CatchErrorsWrapper.__call__)
    assert "with compile_lock" in wrapper and "skip=1" in wrapper
    assert {"DEFAULT", "SKIP", "RUN_ONLY"} <= set(_FrameAction.__members__)
    assert callable(eval_frame.innermost_backend)

    def f(x):
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(2))
    entry, = _debug_get_cache_entry_list(f.__code__)
    assert entry.guard_manager.check({"x": torch.zeros(2)})
    assert not entry.guard_manager.check({"x": torch.zeros(3, 3)})


def test_what_serving_a_frame_relies_on(dynamo_reset):
    """ltc_cache.dynamo_package.serve_frames: a ``ConvertFrameReturn`` with
    a ``GuardedCode`` (code, guard manager, ``CompileId``, annotation) that
    Dynamo did not make is added as the frame's entry and run, with the
    frame's arguments and free variables copied by position (so the code
    has the frame's), from the frame's globals; a guard manager with one
    lambda guard on the root checks each call (ltc_cache.program.guards.checked_by)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.types import GuardedCode

    from ltc_cache.dynamo_package import serve_frames
    from ltc_cache.program.guards import checked_by

    assert [f.name for f in dataclasses.fields(GuardedCode)][:4] == [
        "code", "guard_manager", "compile_id", "trace_annotation"]
    assert str(convert_frame.CompileId(frame_id=-1, frame_compile_id=0)) == "-1/0"
    assert callable(convert_frame.orig_code_map.__setitem__)
    assert callable(convert_frame.output_codes.add)

    def wraps(fn):
        def wrapper(self, *args, **kwargs):
            return fn(self, *args, **kwargs)
        return wrapper

    class Toy(torch.nn.Module):
        @wraps
        def forward(self, x, scale=1.0):
            return x * scale

    calls = []

    def backend(gm, example_inputs):
        return gm.forward

    def taken(f_locals):
        return "scale" in f_locals["kwargs"]

    def server(code, f_locals):
        if code is not Toy.forward.__code__ or not taken(f_locals):
            return None
        return (lambda args, kwargs: calls.append((args[1:], kwargs)) or "served",
                checked_by(taken, "scale given"))

    serve_frames(lambda fn: getattr(fn, "compiler_fn", fn) is backend, server)
    toy = Toy()
    compiled = torch.compile(toy.forward, backend=backend)
    assert compiled(torch.ones(2), scale=3.0) == "served"
    assert compiled(torch.ones(2), scale=4.0) == "served"
    assert len(calls) == 2 and calls[1][1] == {"scale": 4.0}
    # The guard refuses: Dynamo captures the frame, as it would.
    torch.testing.assert_close(compiled(torch.ones(2)), torch.ones(2))
    assert len(calls) == 2


def test_what_the_programs_read_of_dynamos_settings_counters_and_errors():
    """Dynamo's settings the programs change (``optimize_ddp``,
    ``ignore_logging_functions``), its graph-break counters, the errors they
    tell apart, torch's structured trace, and the graph pickler a program's
    graph is stored with: all through dynamo_package.py."""
    from torch._dynamo import config, exc

    from ltc_cache import dynamo_package as dp

    assert isinstance(dp.ddp_optimizer_on(), bool)
    with dp.ddp_optimizer_off():
        assert config.optimize_ddp is False and not dp.ddp_optimizer_on()
    marker = object()
    with dp.logging_functions_ignored({marker}):
        assert marker in config.ignore_logging_functions
    assert marker not in config.ignore_logging_functions
    for group in ("unimplemented", "graph_break"):
        assert isinstance(dict(dp.graph_break_counts(group)), dict)
    for name in ("PackageError", "RestartAnalysis", "Unsupported", "UserError"):
        assert issubclass(getattr(exc, name), Exception), name
        assert getattr(dp, name) is getattr(exc, name), name
    assert {"metadata_fn", "payload_fn", "expect_trace_id"} <= set(
        inspect.signature(torch._logging.trace_structured).parameters)
    dp.trace_artifact("ltc_cache_test", "payload")
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from ltc_cache.compile_backend.aot_autograd import fake_mode

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    again = dp.unpickle_graph(dp.pickle_graph(gm), fake_mode(shape_env=ShapeEnv()))
    assert [n.op for n in again.graph.nodes] == [n.op for n in gm.graph.nodes]


# --- Dynamo's guards: ltc_cache/program/guards.py ---------------------------------------


def test_what_the_guard_filter_reaches_into():
    """Pins: what ltc_cache.program.guards reaches into, by name and shape."""
    from torch._dynamo import source
    from torch._dynamo.guards import CheckFunctionManager, _get_closure_vars
    from torch._dynamo.types import GuardFilterEntry

    from ltc_cache.program import guards

    assert callable(source.get_global_source_name)
    assert "L" not in _get_closure_vars()
    assert {"name", "has_value", "value", "guard_type", "derived_guard_types", "orig_guard"} <= {
        f.name for f in dataclasses.fields(GuardFilterEntry)}
    # What torch cannot serialise is what the guard filter replaces.
    assert set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES) <= set(
        guards._UNSERIALIZABLE)


def test_what_the_capture_patches_in_the_guard_state_pickler():
    """The capture keeps torch's constants in the saved guard state
    (ltc_cache.program.capture.shared_constants_saved) through these."""
    from torch._dynamo.guards import GuardsStatePickler

    from ltc_cache.program.guards import state_pickler

    assert state_pickler() is GuardsStatePickler
    assert "reducer_override" in GuardsStatePickler.__dict__
    assert "missing_values" in inspect.signature(GuardsStatePickler.__init__).parameters


def test_a_guard_states_tensors_unpickle_with_one_fake_mode():
    """Pins torch's private GuardsStatePickler._unpickle_tensor, which
    load_costs.one_fake_mode replaces while a program loads
    (docs/torch/dynamo.md#three-load-costs-paid-elsewhere): Dynamo pickles each guarded tensor as a
    call of it, which made a fake mode (and walked the stack) per tensor. Under one_fake_mode the
    tensors come back as before, sharing one mode."""
    from torch._dynamo.guards import GuardsStatePickler
    from torch._subclasses.fake_tensor import FakeTensor

    from ltc_cache.program.load_costs import one_fake_mode

    original = GuardsStatePickler.__dict__["_unpickle_tensor"]
    assert isinstance(original, classmethod)  # torch changed: see load_costs.py
    assert list(inspect.signature(original.__func__).parameters) == [
        "cls", "meta_tensor", "device", "pytype", "dispatch_keys_raw", "grad"]
    tensors = [torch.randn(2, 3), torch.zeros(4, dtype=torch.int64).t(),
               torch.nn.Parameter(torch.ones(5, 2))]
    buffer = io.BytesIO()
    GuardsStatePickler({id(t): t for t in tensors}, {}, {}, buffer).dump(tensors)

    def loaded() -> list:
        return pickle.loads(buffer.getvalue())

    with one_fake_mode():
        shared = loaded()
    assert GuardsStatePickler.__dict__["_unpickle_tensor"] is original  # put back
    alone = loaded()
    assert len({id(t.fake_mode) for t in shared}) == 1 < len({id(t.fake_mode) for t in alone})
    for got, want, real in zip(shared, alone, tensors, strict=True):
        assert isinstance(got, FakeTensor) and type(got) is type(want)
        assert (got.shape, got.stride(), got.dtype, got.device, got.requires_grad) == \
            (want.shape, want.stride(), want.dtype, want.device, want.requires_grad) == \
            (real.shape, real.stride(), real.dtype, real.device, real.requires_grad)
