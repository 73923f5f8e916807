"""The torch-private surfaces ltc_cache stands on, pinned: where a torch
upgrade breaks first, by name, rather than as a wrong result or a silent
fall back to the slow path.

One section per surface; each surface has one module in the package that
alone touches it (tests/common/test_layers.py holds the others to that),
written against torch 2.13:

- LTC's bindings and lazy internals: ltc_cache/graph/lazy_bindings.py
- AOTAutograd's internals: ltc_cache/compile_backend/aot_autograd.py
- AOTInductor: ltc_cache/graph/fused/aoti.py
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

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
    backward never runs in the cold process (fact 43 in docs/design.md)."""
    from torch._functorch import config

    assert hasattr(config, "force_non_lazy_backward_lowering")


def test_aotautograd_internals_plans_rely_on():
    """Pins: what plan.runs_bare and joint.trainable read of AOTAutograd's
    metadata, and the one thing its autograd wrapper does that
    JointFunction repeats (``_unsafe_view`` over views of intermediates,
    fact 17 in docs/design.md). A torch that changes these fails here by
    name, not as a wrong gradient."""
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


# -- AOTInductor: ltc_cache/graph/fused/aoti.py --------------------------------------------------


def test_torch_still_has_what_the_fused_tier_uses():
    """Pinned: the C++ runner (load), AOTInductor's packaging and make_fx
    (build), and the CPU capability the key names. If torch moves one of
    these, this fails by name."""
    from ltc_cache.graph.fused import aoti, platform

    assert aoti.runner_available()
    import torch._inductor
    from torch.fx.experimental.proxy_tensor import make_fx

    assert callable(torch._inductor.aoti_compile_and_package) and callable(make_fx)
    assert {"package_path", "inductor_configs"} <= set(
        inspect.signature(torch._inductor.aoti_compile_and_package).parameters)
    assert platform.machine_isa().upper() in platform._RUNS
    assert hasattr(torch._C, "_dispatch_get_all_op_names")
