"""Pins of the private torch surfaces ltc_cache uses, a section per surface,
each naming the one module of the package through which that surface is
used. Written against torch 2.13.0: each test fails by name when torch
changes a piece its module relies on, so a torch upgrade breaks here first
(then read the module the section names)."""

from __future__ import annotations

import dataclasses
import inspect
import io
import pickle
import threading

import torch

# --- Dynamo's precompile and package: ltc_cache/program/dynamo_package.py -------------


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
    from ltc_cache.program import dynamo_package

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

    from ltc_cache.program import dynamo_package

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
    """Facts 55 and 57 in docs/design.md: Dynamo's compile lock is a
    reentrant lock ltc_cache can share (ltc_cache/threads.py takes it from
    ``convert_frame`` itself: a layer below program/); FX's "tracing" mark
    is process-wide and a compile session hides it from Dynamo; Dynamo's
    settings are per thread (so patching one around a call needs no care
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
    load_costs.one_fake_mode replaces while a program loads (fact 48 in
    docs/design.md): Dynamo pickles each guarded tensor as a call of it,
    which made a fake mode (and walked the stack) per tensor. Under
    one_fake_mode the tensors come back as before, sharing one mode."""
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
