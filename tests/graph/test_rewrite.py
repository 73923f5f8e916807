"""Rewrites of the stored IR (ltc_cache/rewrites/): view copies back to
views, captured scalars folded into constants, dead code dropped.

Each model below is run against eager on the cold call (the process that
traces) and on a hit in a second, real process, including the cases a wrong
rewrite would break: outputs that alias inputs, arguments and buffers
updated in place, a view of a weight returned, transposes feeding in-place
ops. Run as a script (``python test_rewrite.py --child NAME ...``) this file
is that second process.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from torch import fx, nn

import ltc_cache
from ltc_cache.entries.entry import decode
from ltc_cache.entries.layout import Source
from ltc_cache.graph.extract import Extraction
from ltc_cache.graph.graph_keys import compute_key, module_tensors
from ltc_cache.graph.rewrites import (
    drop_dead_code,
    linears,
    parse_traced,
    rewrite,
    views_for_copies,
)
from ltc_cache.store import DiskStore

# ---------------------------------------------------------------- models


class Mlp(nn.Module):
    """Linear layers (transposed weights), captured scalars: alpha, beta."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 6)
        self.w = nn.Parameter(torch.randn(6, 6))
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y = x + self.fc2(h)
        z = torch.addmm(self.b, y, self.w.t(), beta=0.5, alpha=1 / 3)
        return torch.add(z, y, alpha=2.5) * 0.1


class WeightView(nn.Module):
    """A view of a weight returned, and the weight transposed for a matmul."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        return self.w.t(), x @ self.w, self.w.view(-1)


class ArgAliases(nn.Module):
    """Outputs that alias the argument in eager, and the argument itself."""

    def forward(self, x):
        return x.view(-1), x.t(), x[1:], x.unsqueeze(0), x, x.permute(1, 0) + 1


class InplaceArg(nn.Module):
    """Arguments updated in place, one of them returned as is."""

    def forward(self, x, y):
        x.add_(y, alpha=2.0)
        y.mul_(0.5)
        return x * 2, y


class TransposeInplace(nn.Module):
    """Transposes feeding in-place ops: the update goes through the view."""

    def forward(self, x, y):
        t = x.t()
        t.mul_(2.0)
        y.t().add_(x)
        return t, x + 1, y.t()


class Accumulate(nn.Module):
    """A buffer updated in place from a transpose, then read as views. A leaf
    of the FX trace (see :class:`LeafTracer`): symbolic tracing of these
    lines in place would record a stale copy of the buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4, 4))

    def forward(self, x):
        self.running.mul_(0.5).add_(x.t())
        return self.running.t() @ x, self.running.view(-1)


class BufferUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.acc = Accumulate()

    def forward(self, x):
        y, flat = self.acc(x)
        return y, flat, self.acc.running


class LeafTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, Accumulate) or super().is_leaf_module(m, qualname)


class IntermediateViews(nn.Module):
    """Views of an intermediate result returned beside it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h.t(), h.reshape(-1), h, h.unsqueeze(1).expand(4, 3, 4)


class Contiguous(nn.Module):
    """``.contiguous()``, which LTC drops: the outputs are contiguous and
    share no memory in eager, and a caller may ``view`` them."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h, h.t().contiguous(), h.t().contiguous() * 2, h.t().contiguous().view(-1)


class Attention(nn.Module):
    """Select, expand, permute, transpose and squeeze feeding matmuls."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2)  # unbind falls back
        scores = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
        out = (scores @ v).transpose(1, 2).reshape(b, s, 8)
        return out.squeeze(0), out[:, 0].unsqueeze(-1).expand(b, 8, 3)


class Linears(nn.Module):
    """Products with transposed weights, as ``linear`` replays them: with and
    without a bias, on a 3-d input, a weight also read as a value and also
    returned as a view, and an argument updated in place that a product
    reads before and after the update."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.nobias = nn.Linear(5, 3, bias=False)
        self.w = nn.Parameter(torch.randn(3, 5))

    def forward(self, x, y):
        h = self.fc(x)
        z = self.nobias(h)
        s = h @ self.w.t() + self.w.sum()
        before = self.fc(y)
        y.mul_(2.0)
        after = self.fc(y)
        return z, s, self.fc.weight.t(), before, after, y


class Powers(nn.Module):
    """RMSNorm's square, a root, and a cube of a mask:
    exponents LTC captures as 0-dim tensors."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x, n):
        variance = x.pow(2).mean(-1, keepdim=True)
        normed = self.weight * (x * torch.rsqrt(variance + 1e-6))
        return normed, (x.abs() + 1).pow(0.5), (n > 0).float().pow(3)


class Positions(nn.Module):
    """Position ids from ``arange`` (LTC: into a stored ``out`` tensor),
    embedded and added before a Linear; the ids returned, scaled."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.pos = nn.Embedding(16, 4)

    def forward(self, x):
        ids = torch.arange(2, 2 + x.shape[1])
        return self.fc(x + self.pos(ids)), (ids * 2).float()


class LastPositions(nn.Module):
    """A language model's head on its last positions (``generate`` asks for
    ``hidden[:, -1:]``): slice bounds LTC writes as negative tensor
    constants."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 6)

    def forward(self, x):
        return self.head(x[:, -1:]), x[:, -3:-1] * 2


MODELS: dict[str, tuple[Callable[[], nn.Module], list[tuple[int, ...]]]] = {
    "mlp": (Mlp, [(5, 6)]),
    "weight_view": (WeightView, [(3, 6)]),
    "arg_aliases": (ArgAliases, [(3, 4)]),
    "inplace_arg": (InplaceArg, [(3, 4), (3, 4)]),
    "transpose_inplace": (TransposeInplace, [(3, 4), (4, 3)]),
    "buffer_update": (BufferUpdate, [(4, 4)]),
    "intermediate_views": (IntermediateViews, [(4, 4)]),
    "contiguous": (Contiguous, [(3, 4)]),
    "attention": (Attention, [(1, 5, 8)]),
    "linears": (Linears, [(2, 3, 4), (6, 4)]),
    "powers": (Powers, [(2, 3, 8), (4,)]),
    "positions": (Positions, [(2, 5, 4)]),
    "last_positions": (LastPositions, [(2, 7, 4)]),
}


def build(name: str) -> tuple[fx.GraphModule, list[tuple[int, ...]]]:
    factory, shapes = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    return fx.GraphModule(model, LeafTracer().trace(model)), shapes


def inputs(shapes: list[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in shapes]


def storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def check_against_eager(name: str) -> dict:
    """Extract ``name`` through the cache and compare three calls with eager:
    outputs, arguments and buffers after each call. Between calls, every
    output the graph computed is overwritten, which must not reach the
    weights, buffers or stored constants of the next call. Returns what the
    entry and the calls looked like, for the test to assert on."""
    gm, shapes = build(name)
    eager = copy.deepcopy(gm)
    with torch.no_grad():
        compiled = ltc_cache.extract_compiled_graph(gm, inputs(shapes, seed=1))
        consts = [s.ref for s in compiled.entry.inputs if s.kind == "const"]
        for call in range(3):
            eager_args = inputs(shapes, seed=10 + call)
            args = [a.clone() for a in eager_args]
            expected = eager(*eager_args)
            expected = list(expected) if isinstance(expected, tuple) else [expected]
            actual = compiled(*args)
            assert len(actual) == len(expected)
            for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, i=i, c=call: f"call {c} output {i}: {m}")
            for i, (a, e) in enumerate(zip(args, eager_args, strict=True)):
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, i=i, c=call: f"call {c} argument {i}: {m}")
            for (n, e), a in zip(eager.state_dict().items(), gm.state_dict().values(),
                                 strict=True):
                torch.testing.assert_close(a, e, msg=lambda m, n=n, c=call: f"call {c} {n}: {m}")
            # An output is the model's own tensor (an argument or buffer the
            # model returned as is), or memory no one else holds.
            owned = [*args, *module_tensors(gm).values()]
            computed = [o for o in actual if not any(o is t for t in owned)]
            assert not storages(computed) & storages([*owned, *consts]), \
                f"call {call}: an output shares memory with an input, weight or constant"
            assert len(storages(computed)) == len(computed), \
                f"call {call}: computed outputs share memory"
            for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
                if e.is_contiguous():  # else the copies made it contiguous: either will do
                    assert a.is_contiguous(), f"call {call} output {i} is not contiguous"
            for out in computed:
                if torch._debug_has_internal_overlap(out) == 0:  # not an expanded view
                    out.add_(1000.0)
    return {"ir": compiled.entry.ir, "inputs": [s.kind for s in compiled.entry.inputs]}


# ------------------------------------------------------ the second process


def child(names: list[str]) -> None:
    failures = {}
    for name in names:
        try:
            check_against_eager(name)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"stats": ltc_cache.stats(), "failures": failures}))


def run_child(names: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *names], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------- tests


@pytest.mark.slow  # every model, and a hit in another process
def test_every_model_matches_eager_cold_and_on_a_hit_in_another_process(cache_dir):
    results = {name: check_against_eager(name) for name in MODELS}
    assert ltc_cache.stats()["traces"] == len(MODELS)
    assert ltc_cache.stats()["errors"] == 0

    report = run_child(list(MODELS))
    assert report["failures"] == {}
    assert report["stats"]["hits"] == len(MODELS)
    assert report["stats"]["traces"] == 0

    # The rewrites did happen on the graphs where they are safe ...
    mlp = results["mlp"]["ir"]
    assert "_copy" not in mlp and "ScalarImplicit" not in mlp
    assert "aten::t(" in mlp
    # alpha, beta and 2.5 folded; ``* 0.1`` multiplies by a 0-dim tensor input.
    assert results["mlp"]["inputs"].count("const") == 1
    attention = results["attention"]["ir"]
    assert "aten::permute(" in attention and "permute_copy" not in attention
    # ... but a view the graph returns stays a copy (of a weight, an argument
    # or an intermediate), and what is computed from a view is made
    # contiguous, as the copy left it.
    intermediate = results["intermediate_views"]["ir"]
    assert "aten::linear(" in intermediate  # the weight, read by addmm through a view
    assert "aten::t_copy(" in intermediate and "aten::expand_copy(" in intermediate
    assert "aten::contiguous(" in results["contiguous"]["ir"]
    weight_view = results["weight_view"]["ir"]
    assert "aten::t_copy(" in weight_view and "aten::view_copy(" in weight_view
    arg_aliases = results["arg_aliases"]["ir"]
    for copy_op in ("view_copy", "t_copy", "slice_copy", "unsqueeze_copy"):
        assert f"aten::{copy_op}(" in arg_aliases
    assert "aten::permute(" in arg_aliases  # read by an add, not returned
    # Every product with a transposed weight is a linear; the transposed
    # weight the graph returns stays a copy.
    products = results["linears"]["ir"]
    assert products.count("aten::linear(") == 5
    assert "aten::mm(" not in products and "aten::addmm(" not in products
    assert products.count("aten::t_copy(") == 1
    # Every power of a captured exponent takes the number, as eager's does.
    # The position ids allocate, so the graph writes no memory and its
    # weight is read through a view.
    positions = results["positions"]["ir"]
    assert "aten::linear(" in positions and "aten::t_copy(" not in positions
    assert [n.schema() for n in torch._C.parse_ir(positions).nodes()
            if n.kind() == "aten::arange"] == [
        "aten::arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? "
        "dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"]
    pow_schemas = [n.schema() for n in torch._C.parse_ir(results["powers"]["ir"]).nodes()
                   if n.kind() == "aten::pow"]
    assert len(pow_schemas) == 3 and all("Scalar exponent" in s for s in pow_schemas)


def test_powers_of_a_stored_exponent_take_the_number_and_equal_eager():
    ir = """graph(%x : Tensor, %two : Tensor, %half : Tensor, %n : Tensor, %three : Tensor,
                  %flag : Tensor, %e : Tensor):
      %a : Tensor = aten::pow(%x, %two)
      %b : Tensor = aten::pow(%x, %half)
      %c : Tensor = aten::pow(%n, %three)
      %d : Tensor = aten::pow(%x, %flag)
      %f : Tensor = aten::pow(%x, %e)
      return (%a, %b, %c, %d, %f)"""
    two, half = torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)
    three, flag = torch.tensor(3), torch.tensor(True)
    layout = [Source("arg", 0), Source("const", two), Source("const", half), Source("arg", 1),
              Source("const", three), Source("const", flag), Source("arg", 2)]
    out = rewrite(_extraction(ir, layout))
    graph = torch._C.parse_ir(out.ir)
    schemas = [n.schema() for n in graph.nodes() if n.kind() == "aten::pow"]
    # Three numbers now; a bool exponent and an argument stay tensors.
    assert sum("Scalar exponent" in s for s in schemas) == 3
    assert sum("Tensor exponent" in s for s in schemas) == 2
    assert [s.kind for s in out.inputs] == ["arg", "arg", "const", "arg"]

    x, n, e = torch.rand(4, 8) + 0.1, torch.arange(5), torch.tensor(1.5)
    actual = _function(out.ir)(x, n, flag, e)
    # What eager computes for x.pow(2), x.pow(0.5), n.pow(3), bit for bit.
    for got, want in zip(actual[:3], (x.pow(2), x.pow(0.5), n.pow(3)), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    expected = _function(ir)(x, two, half, n, three, flag, e)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0)


_GELU_CHAIN = """graph(%x : Tensor, %three : Tensor, %kappa : Tensor, %beta : Tensor,
                   %one : Tensor, %half : Tensor):
      %alpha : int = prim::Constant[value=1]()
      %cube : Tensor = aten::pow(%x, %three)
      %scaled : Tensor = aten::mul(%cube, %kappa)
      %inner : Tensor = aten::add(%x, %scaled, %alpha)
      %arg : Tensor = aten::mul(%inner, %beta)
      %t : Tensor = aten::tanh(%arg)
      %plus : Tensor = aten::add(%t, %one, %alpha)
      %halved : Tensor = aten::mul(%x, %half)
      %out : Tensor = aten::mul(%halved, %plus)
      return (%out{extra})"""


def _gelu_layout() -> list[Source]:
    def const(value: float) -> Source:
        return Source("const", torch.tensor(value, dtype=torch.float64))

    return [Source("arg", 0), const(3.0), const(0.044715), const(math.sqrt(2 / math.pi)),
            const(1.0), const(0.5)]


def test_gpt2s_tanh_gelu_chain_becomes_one_gelu_within_rounding():
    out = rewrite(_extraction(_GELU_CHAIN.format(extra=""), _gelu_layout()))
    kinds = [n.kind() for n in torch._C.parse_ir(out.ir).nodes()]
    assert "aten::gelu" in kinds and "aten::tanh" not in kinds and "aten::pow" not in kinds
    assert [s.kind for s in out.inputs] == ["arg"]  # the constants went with the chain
    x = torch.randn(2, 128, 64) * 3
    want = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))
    torch.testing.assert_close(_function(out.ir)(x)[0], want, rtol=1e-6, atol=1e-6)


def test_a_gelu_chain_whose_tanh_is_read_elsewhere_stays():
    """A training forward saves the chain's intermediates for the backward:
    a gelu beside the chain would only add work."""
    ir = _GELU_CHAIN.format(extra=", %t")
    out = rewrite(_extraction(ir, _gelu_layout()))
    kinds = [n.kind() for n in torch._C.parse_ir(out.ir).nodes()]
    assert "aten::gelu" not in kinds and "aten::tanh" in kinds


def test_a_chain_with_other_constants_is_no_gelu():
    layout = _gelu_layout()
    layout[2] = Source("const", torch.tensor(0.05, dtype=torch.float64))
    out = rewrite(_extraction(_GELU_CHAIN.format(extra=""), layout))
    assert "aten::gelu" not in out.ir


def test_ltcs_silu_backward_chain_becomes_the_fused_op_with_eagers_values(cache_dir):
    """LTC lowers ``silu_backward`` (Llama's backward) to six elementwise ops
    over a tensor of ones; the stored graph holds the one fused op again,
    computing eager's values bit for bit."""

    class SiluBackward(torch.nn.Module):
        def forward(self, grad, x):
            return torch.ops.aten.silu_backward(grad, x)

    gm = fx.symbolic_trace(SiluBackward())
    grad, x = torch.randn(2, 64, 96), torch.randn(2, 64, 96) * 4
    compiled = ltc_cache.extract_compiled_graph(gm, [grad, x])
    kinds = [n.kind() for n in torch._C.parse_ir(compiled.entry.ir).nodes()]
    assert kinds.count("aten::silu_backward") == 1 and "aten::sigmoid" not in kinds, kinds
    assert all(s.kind == "arg" for s in compiled.entry.inputs)  # the ones went too
    for _ in range(2):
        grad, x = torch.randn(2, 64, 96), torch.randn(2, 64, 96) * 4
        assert torch.equal(compiled(grad, x)[0], gm(grad, x))


_SILU_CHAIN = """graph(%g : Tensor, %x : Tensor, %one : Tensor, %ones : Tensor):
      %alpha : int = prim::Constant[value=1]()
      %shape : int[] = prim::Constant[value=[4, 8]]()
      %false : bool = prim::Constant[value=0]()
      %none : NoneType = prim::Constant()
      %s : Tensor = aten::sigmoid(%x)
      %e : Tensor = aten::expand(%ones, %shape, %false)
      %c : Tensor = aten::clone(%e, %none)
      %d : Tensor = aten::sub(%c, %s, %alpha)
      %m : Tensor = aten::mul(%x, %d)
      %a : Tensor = aten::add(%m, %one, %alpha)
      %f : Tensor = aten::mul(%s, %a)
      %out : Tensor = aten::mul(%g, %f)
      return (%out{extra})"""


def _silu_layout(ones: float = 1.0) -> list[Source]:
    return [Source("arg", 0), Source("arg", 1), Source("const", torch.tensor(1)),
            Source("const", torch.tensor(ones))]


@pytest.mark.parametrize("extra, ones", [(", %d", 1.0), (", %a", 1.0), ("", 2.0)],
                         ids=["1 - s read elsewhere", "1 + x(1 - s) read elsewhere",
                              "twos, not ones"])
def test_a_silu_backward_chain_read_elsewhere_or_of_other_numbers_stays(extra, ones):
    out = rewrite(_extraction(_SILU_CHAIN.format(extra=extra), _silu_layout(ones)))
    assert "aten::silu_backward" not in out.ir and "aten::sigmoid" in out.ir
    g, x = torch.randn(4, 8), torch.randn(4, 8)
    ones_tensor = torch.full((4, 8), ones)
    want = g * (torch.sigmoid(x) * (1 + x * (ones_tensor - torch.sigmoid(x))))
    constants = [s.ref for s in out.inputs if s.kind == "const"]
    torch.testing.assert_close(_function(out.ir)(g, x, *constants)[0], want)


def test_the_stored_entry_holds_the_rewritten_ir(cache_dir):
    gm, shapes = build("mlp")
    example = inputs(shapes, seed=1)
    with torch.no_grad():
        ltc_cache.extract_compiled_graph(gm, example)
    key = compute_key(gm, example).digest
    entry = decode(DiskStore(cache_dir).get(key), expected_key=key)
    assert "t_copy" not in entry.ir and "ScalarImplicit" not in entry.ir
    assert len(entry.inputs) == len(list(torch._C.parse_ir(entry.ir).inputs()))
    assert entry.meta["node_count"] == sum(1 for _ in torch._C.parse_ir(entry.ir).nodes())


def _function(ir: str):
    graph = torch._C.parse_ir(ir)
    graph.makeMultiOutputIntoTuple()
    return torch._C._create_function_from_graph("f", graph)


def _extraction(ir: str, inputs: list[Source]) -> Extraction:
    return Extraction(ir, tuple(inputs), (Source("out", 0),), (), "")


def test_a_graph_that_writes_memory_keeps_its_copies():
    ir = """graph(%x : Tensor, %y : Tensor):
      %a : Tensor = aten::t_copy(%x)
      %one : int = prim::Constant[value=1]()
      %b : Tensor = aten::add_(%y, %a, %one)
      %c : Tensor = aten::mm(%a, %b)
      return (%c)"""
    graph = torch._C.parse_ir(ir)
    assert views_for_copies(graph) == 0
    assert "aten::t_copy" in str(graph)


def test_a_view_stays_a_copy_before_an_op_that_reads_strides():
    ir = """graph(%x : Tensor):
      %s : int[] = prim::Constant[value=[4, 3]]()
      %a : Tensor = aten::t_copy(%x)
      %b : Tensor = aten::_unsafe_view(%a, %s)
      %c : Tensor = aten::t_copy(%x)
      %d : Tensor = aten::relu(%c)
      return (%b, %d)"""
    graph = torch._C.parse_ir(ir)
    assert views_for_copies(graph) == 1
    text = str(graph)
    assert text.count("aten::t_copy") == 1 and text.count("aten::t(") == 1
    x = torch.randn(3, 4)
    expected = _function(ir)(x)
    actual = _function(text)(x)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)


def test_returned_views_share_no_memory_and_outputs_keep_their_layout():
    ir = """graph(%x : Tensor):
      %one : int = prim::Constant[value=1]()
      %zero : int = prim::Constant[value=0]()
      %a : Tensor = aten::transpose_copy(%x, %one, %zero)
      %b : Tensor = aten::relu(%x)
      %c : Tensor = aten::t_copy(%b)
      %d : Tensor = aten::t_copy(%x)
      %e : Tensor = aten::relu(%d)
      %f : Tensor = aten::t_copy(%b)
      %g : Tensor = aten::mm(%f, %b)
      return (%a, %c, %e, %g)"""
    graph = torch._C.parse_ir(ir)
    # %d and %f, read inside; %c, returned, views %b, which the graph
    # computed and no other output shares; %a, returned, views the input.
    assert views_for_copies(graph) == 3
    text = str(graph)
    assert "aten::transpose_copy" in text and "aten::t_copy" not in text
    assert text.count("aten::contiguous") == 2  # %c and %e follow a view's layout, %g not
    x = torch.randn(3, 3)
    expected = _function(ir)(x)
    actual = _function(text)(x)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)
        assert a.is_contiguous()
    assert len(storages(actual)) == 4


def test_a_returned_view_of_a_computed_tensor_copies_only_where_its_layout_needs():
    """A backward's weight gradient, ``t(t(mm))``, and a ``view`` to the
    same shape come back with no copy; views of an input, a slice, and two
    outputs viewing one tensor stay copies: no output shares memory with an
    input or with another output."""
    ir = """graph(%x : Tensor, %w : Tensor):
      %zero : int = prim::Constant[value=0]()
      %one : int = prim::Constant[value=1]()
      %shape : int[] = prim::Constant[value=[4, 4]]()
      %m : Tensor = aten::mm(%x, %w)
      %t : Tensor = aten::t_copy(%m)
      %grad : Tensor = aten::t_copy(%t)
      %r : Tensor = aten::relu(%x)
      %same : Tensor = aten::view_copy(%r, %shape)
      %wt : Tensor = aten::t_copy(%w)
      %s : Tensor = aten::sigmoid(%x)
      %first : Tensor = aten::slice_copy(%s, %zero, %zero, %one, %one)
      %n : Tensor = aten::neg(%x)
      %n1 : Tensor = aten::t_copy(%n)
      %n2 : Tensor = aten::view_copy(%n, %shape)
      return (%grad, %same, %wt, %first, %n1, %n2)"""
    graph = torch._C.parse_ir(ir)
    assert views_for_copies(graph) == 3  # %t (read by %grad), %grad and %same
    text = str(graph)
    assert text.count("aten::t_copy") == 2 and "aten::slice_copy" in text  # %wt, %n1, %first
    assert text.count("aten::view_copy") == 1  # %n2
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    expected = _function(ir)(x, w)
    actual = _function(text)(x, w)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
        assert a.is_contiguous()
        assert a._base is None  # no view to autograd: changing it in place is allowed
    assert len(storages(actual)) == len(actual)
    assert not storages(actual) & storages([x, w])


def test_scalars_fold_exactly_and_odd_ones_stay():
    ir = """graph(%x : Tensor, %third : Tensor, %n : Tensor, %offset : Tensor, %inf : Tensor,
                  %other : Tensor):
      %s1 : Scalar = aten::ScalarImplicit(%third)
      %s2 : Scalar = aten::ScalarImplicit(%n)
      %s3 : Scalar = aten::ScalarImplicit(%inf)
      %s4 : Scalar = aten::ScalarImplicit(%other)
      %a : Tensor = aten::add(%x, %x, %s1)
      %b : Tensor = aten::mul(%a, %s2)
      %c : Tensor = aten::clamp_max(%b, %s3)
      %d : Tensor = aten::sub(%c, %offset, %s4)
      return (%d)"""
    third = torch.tensor(1 / 3, dtype=torch.float64)
    layout = [Source("arg", 0), Source("const", third), Source("const", torch.tensor(7)),
              Source("const", torch.tensor(0.25)), Source("const", torch.tensor(float("inf"))),
              Source("arg", 1)]
    out = rewrite(_extraction(ir, layout))
    # 1/3 and 7 folded and their inputs gone; inf stays an input, so does
    # %offset (read as a tensor), and an argument is never folded.
    assert [s.kind for s in out.inputs] == ["arg", "const", "const", "arg"]
    assert out.ir.count("ScalarImplicit") == 2
    parsed = torch._C.parse_ir(out.ir)
    values = [n.output().toIValue() for n in parsed.nodes() if n.kind() == "prim::Constant"]
    assert 1 / 3 in values and 7 in values  # exact after printing and parsing

    x, other = torch.randn(3), torch.tensor(2.0)
    full = [x, third, torch.tensor(7), torch.tensor(0.25), torch.tensor(float("inf")), other]
    expected = _function(ir)(*full)
    bound = [x, torch.tensor(0.25), torch.tensor(float("inf")), other]
    actual = _function(out.ir)(*bound)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_a_scalar_whose_fold_would_change_the_overload_stays():
    # add(Scalar, Scalar) -> Scalar; of two ints it would be add.int, of an
    # int and a Scalar it stays add.Scalar.
    ir = """graph(%x : Tensor, %a : Tensor, %b : Tensor):
      %s1 : Scalar = aten::ScalarImplicit(%a)
      %s2 : Scalar = aten::ScalarImplicit(%b)
      %s : Scalar = aten::add(%s1, %s2)
      %y : Tensor = aten::mul(%x, %s)
      return (%y)"""
    layout = [Source("arg", 0), Source("const", torch.tensor(2)), Source("const", torch.tensor(3))]
    out = rewrite(_extraction(ir, layout))
    assert out.ir.count("ScalarImplicit") == 1
    parsed = torch._C.parse_ir(out.ir)
    assert [n.schema() for n in parsed.nodes() if n.kind() == "aten::add"] == \
        ["aten::add(Scalar a, Scalar b) -> Scalar"]
    x = torch.randn(3)
    torch.testing.assert_close(_function(out.ir)(x, torch.tensor(3))[0], x * 5)


def test_dead_nodes_and_unused_inputs_go_with_their_layout():
    ir = """graph(%x : Tensor, %unused : Tensor, %w : Tensor):
      %dead : Tensor = aten::relu(%w)
      %t : (Tensor, Tensor) = prim::TupleConstruct(%dead, %x)
      %y : Tensor = aten::neg(%x)
      return (%y)"""
    graph = torch._C.parse_ir(ir)
    layout = [Source("arg", 0), Source("arg", 1), Source("attr", "w")]
    assert drop_dead_code(graph, layout) == 4
    assert layout == [Source("arg", 0)]
    assert [n.kind() for n in graph.nodes()] == ["aten::neg"]


LINEARS_IR = """graph(%x : Tensor, %w : Tensor, %b : Tensor, %b2 : Tensor, %v : Tensor):
      %one : int = prim::Constant[value=1]()
      %half : float = prim::Constant[value=0.5]()
      %wt : Tensor = aten::t(%w)
      %a : Tensor = aten::addmm(%b, %x, %wt, %one, %one)
      %c : Tensor = aten::addmm(%b2, %x, %wt, %one, %one)
      %d : Tensor = aten::mm(%x, %wt)
      %e : Tensor = aten::addmm(%b, %x, %wt, %half, %one)
      %vc : Tensor = aten::t_copy(%v)
      %f : Tensor = aten::mm(%x, %vc)
      %g : Tensor = aten::relu(%wt)
      return (%a, %c, %d, %e, %f, %g)"""


def _linears_args(requires_grad: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 4), (6, 4), (6,), (5, 6), (6, 4)]  # b2 is a full matrix
    return [torch.randn(s, generator=gen).requires_grad_(requires_grad) for s in shapes]


def test_products_with_a_transposed_weight_become_linears_bit_for_bit():
    graph = torch._C.parse_ir(LINEARS_IR)
    # %a, %c (a matrix bias) and %d; not %e (beta 0.5) nor %f (a t_copy).
    assert linears(graph) == 3
    kinds = [n.kind() for n in graph.nodes()]
    assert kinds.count("aten::linear") == 3 and kinds.count("aten::addmm") == 1
    assert kinds.count("aten::mm") == 1 and kinds.count("aten::t") == 1  # still read by relu
    text = str(graph)
    args = _linears_args()
    with torch.no_grad():
        expected = _function(LINEARS_IR)(*_linears_args())
        actual = _function(text)(*args)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
    assert len(storages(actual)) == len(actual) and not storages(actual) & storages(args)

    # Under autograd, gradients too, up to the order in which the engine sums
    # the contributions of the products (the transpose is no longer shared).
    grads = []
    for ir in (LINEARS_IR, text):
        args = _linears_args(requires_grad=True)
        outs = _function(ir)(*args)
        torch.autograd.backward([o.sum() * (i + 1) for i, o in enumerate(outs)])
        grads.append([a.grad for a in args])
    for a, e in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_a_linear_reads_the_weight_where_the_product_did():
    # A graph that writes the weight between its transpose and the product:
    # the view sees the write, and so must the linear that replaces it.
    ir = """graph(%x : Tensor, %w : Tensor, %b : Tensor):
      %one : int = prim::Constant[value=1]()
      %two : float = prim::Constant[value=2.]()
      %wt : Tensor = aten::t(%w)
      %early : Tensor = aten::mm(%x, %wt)
      %w2 : Tensor = aten::mul_(%w, %two)
      %late : Tensor = aten::addmm(%b, %x, %wt, %one, %one)
      return (%early, %late)"""
    graph = torch._C.parse_ir(ir)
    assert linears(graph) == 2
    args = [torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)]
    copies = [a.clone() for a in args]
    early, late = _function(str(graph))(*args)
    x, w, b = copies
    torch.testing.assert_close(early, x @ w.t(), rtol=0, atol=0)
    torch.testing.assert_close(late, torch.addmm(b, x, (w * 2).t()), rtol=0, atol=0)
    torch.testing.assert_close(args[1], w * 2, rtol=0, atol=0)


def test_negative_tensor_constants_keep_their_sign():
    # parse_ir reads {-1} back as tensor(1)
    # (docs/torch/torchscript-ir.md#parse-ir-drops-constant-signs); the rewrites read every tensor
    # constant as the text wrote it.
    ir = """graph(%x : Tensor):
      %a : Long(requires_grad=0, device=cpu) = prim::Constant[value={-1}]()
      %b : Double(requires_grad=0, device=cpu) = prim::Constant[value={-2.5}]()
      %c : Long(requires_grad=0, device=cpu) = prim::Constant[value={3}]()
      return (%a, %b, %c)"""
    graph = parse_traced(ir)
    values = [n.output().toIValue() for n in graph.nodes() if n.kind() == "prim::Constant"]
    assert [v.item() for v in values] == [-1, -2.5, 3]
    assert [v.dtype for v in values] == [torch.int64, torch.float64, torch.int64]


def test_negative_slice_bounds_replay_as_eager(cache_dir):
    # x[:, -1:] sliced from the second row and the replay failed: the first
    # cold generate() of every language model (issue 20).
    result = check_against_eager("last_positions")
    assert "slice" in result["ir"]
    assert ltc_cache.stats()["errors"] == 0


def test_ir_that_cannot_be_rewritten_is_stored_as_traced():
    bad = _extraction("graph(%x : Tensor):\n  return (%x)", [])  # layout of the wrong length
    with pytest.warns(RuntimeWarning, match="cannot rewrite"):
        assert rewrite(bad) is bad


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        # Import this file under its test name (its directory is the
        # script's, first on the import path), so that the classes (and with
        # them the cache keys of leaf modules) are the test's.
        import test_rewrite

        test_rewrite.child(sys.argv[2:])


def test_bool_list_constants_read_back_as_bools():
    # LTC writes native_layer_norm_backward's output_mask as a bool[]
    # constant, which the IR parser reads back as ints.
    ir = """graph(%grad : Tensor, %x : Tensor, %mean : Tensor, %rstd : Tensor, %w : Tensor,
                  %b : Tensor):
      %shape : int[] = prim::Constant[value=[4]]()
      %mask : bool[] = prim::Constant[value=[1, 0, 1]]()
      %gx : Tensor, %gw : Tensor, %gb : Tensor = aten::native_layer_norm_backward(%grad, %x, %shape, %mean, %rstd, %w, %b, %mask)
      return (%gx, %gb)"""  # noqa: E501
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    _, mean, rstd = torch.native_layer_norm(x, [4], w, b, 1e-5)
    args = [torch.randn(3, 4), x, mean, rstd, w, b]
    with pytest.raises(RuntimeError, match="BoolList"):
        _function(ir)(*args)  # as traced, the IR does not run

    out = rewrite(_extraction(ir, [Source("arg", i) for i in range(6)]))
    gx, gb = _function(out.ir)(*args)
    expected = torch.ops.aten.native_layer_norm_backward(args[0], x, [4], mean, rstd, w, b,
                                                          [True, False, True])
    torch.testing.assert_close(gx, expected[0])
    torch.testing.assert_close(gb, expected[2])


def test_replay_keeps_the_executor_switch_to_itself(cache_dir):
    """Replay turns the profiling executor's optimisation off around each call
    only: the caller's setting is back afterwards, also when the graph
    raises, and another thread never sees it change."""
    import threading

    gm, shapes = build("mlp")
    with torch.no_grad():
        compiled = ltc_cache.extract_compiled_graph(gm, inputs(shapes, seed=1))
        seen = []

        def watch(stop: threading.Event) -> None:
            while not stop.is_set():
                seen.append(torch._C._get_graph_executor_optimize())

        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(stop,))
        watcher.start()
        try:
            for _ in range(20):
                compiled(*inputs(shapes, seed=2))
                assert torch._C._get_graph_executor_optimize() is True
        finally:
            stop.set()
            watcher.join()
        assert seen and all(seen)

        with pytest.raises(RuntimeError):
            compiled(torch.randn(5, 7))  # wrong width: the graph raises
        assert torch._C._get_graph_executor_optimize() is True

        torch._C._set_graph_executor_optimize(False)
        try:
            compiled(*inputs(shapes, seed=2))
            assert torch._C._get_graph_executor_optimize() is False
        finally:
            torch._C._set_graph_executor_optimize(True)


def test_parse_ir_still_drops_the_sign_of_a_tensor_constant():
    """Pinned: parse_ir reads a one-element tensor constant ``{-4095}`` as
    4095, which ``rewrites.parse_traced`` corrects
    (docs/torch/torchscript-ir.md#parse-ir-drops-constant-signs). Should torch fix it, the
    correction changes nothing (it writes what the text says) and this test says so."""
    text = ("graph():\n"
            "  %3 : Long(requires_grad=0, device=cpu) = prim::Constant[value={-4095}]()\n"
            "  return (%3)\n")
    graph = torch._C.parse_ir(text, parse_tensor_constants=True)
    (node,) = list(graph.nodes())
    assert node.output().toIValue().item() == 4095
    (node,) = list(parse_traced(text).nodes())
    assert node.output().toIValue().item() == -4095
