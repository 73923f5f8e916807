"""Training plans: AOTAutograd's forward and backward graphs and the little
runtime metadata that joins them, stored as data so that a warm training
start runs no AOTAutograd trace.

AOTAutograd turns a Dynamo graph that needs gradients into a forward graph
(user outputs, then the tensors saved for backward) and a backward graph
(saved tensors, then one tangent per differentiable output; a gradient, or
None, per input), and wraps them in an ``autograd.Function`` whose behaviour
its ``ViewAndMutationMeta`` describes. Where that wrapper adds nothing but
the split of the forward's outputs and ``_unsafe_view`` over views of
intermediates (:func:`trainable`: no input mutated, no other output
aliasing, no tensor subclass, no saved symbolic sizes, no effect tokens, no
functionalized RNG), what it needs is a few counts and flags:
:class:`JointLayout`. The plan entry (kind ``plan``) holds the forward graph
where an inference plan holds its graph, the backward graph beside it and
the layout, all msgpack data; :class:`JointFunction` is the wrapper rebuilt
from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import fx

from ..entries.entry import Entry
from ..errors import EntryError, LayoutChanged, PlanError
from .boxed import boxed
from .partition import Partitioned
from .plan import partitioned_from_wire, runs_bare

__all__ = ["JointFunction", "JointLayout", "joint_graphs", "joint_layout", "trainable"]

_unsafe_view = torch.ops.aten._unsafe_view.default


@dataclass(frozen=True)
class JointLayout:
    """How the forward's outputs split and which feed the backward.

    - ``outputs``: the user outputs, first among the forward's outputs;
    - ``saved``: then the tensors saved for backward with a version check,
      and ``saved_unchecked`` without one (stashed on ``ctx`` in eager);
    - ``requires_grad``: per user output, whether it is differentiable;
    - ``tangents``: indices of the user outputs whose gradients the
      backward graph takes, in its order, after the saved tensors;
    - ``tangent_strides``: the stride each tangent was traced with (a
      gradient of another layout is copied into it, as AOTAutograd does);
    - ``unsafe_views``: indices of the user outputs that are views of one
      of the graph's intermediates (``OutputType.unsafe_view_alias``: a
      ``linear`` on a 3-d input ends in ``_unsafe_view``, as a language
      model's head does). They are handed back through ``_unsafe_view``, as
      AOTAutograd does (docs/torch/aot-autograd.md#views-of-intermediates-hidden-from-autograd), so
      that autograd never takes one for a view (an in-place change of it is then allowed, as in
      eager): a region returns fresh tensors, but an eager op of the
      partitioned graph may return a view.
    - ``aliases``: the user outputs that are views of another user output
      (``OutputType.alias_of_intermediate_base_is_user_output``: DINOv2's
      pooled output is ``last_hidden_state[:, 0]``), each as ``[index,
      base, size, stride, storage offset, requires_grad, base stride]``
      as traced. Like AOTAutograd's wrapper, the autograd node leaves them
      out, and each is taken again as a view of its base's output
      (docs/torch/aot-autograd.md#output-viewing-output-gets-no-tangent), so that gradients reach
      the base through it.
    """

    outputs: int
    saved: int
    saved_unchecked: int
    requires_grad: tuple[bool, ...]
    tangents: tuple[int, ...]
    tangent_strides: tuple[tuple[int, ...], ...]
    unsafe_views: tuple[int, ...]
    aliases: tuple[tuple[Any, ...], ...] = ()

    def to_wire(self) -> dict[str, Any]:
        wire = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if not self.aliases:  # most plans have none: left out, read back as none
            del wire["aliases"]
        return wire

    @classmethod
    def from_wire(cls, obj: Any) -> JointLayout:
        names = [f.name for f in fields(cls)]
        if isinstance(obj, dict) and "aliases" not in obj:
            obj = {**obj, "aliases": []}
        if not isinstance(obj, dict) or sorted(obj) != sorted(names):
            raise EntryError("plan: joint layout of the wrong shape")
        try:
            layout = cls(
                outputs=int(obj["outputs"]), saved=int(obj["saved"]),
                saved_unchecked=int(obj["saved_unchecked"]),
                requires_grad=tuple(bool(b) for b in obj["requires_grad"]),
                tangents=tuple(int(i) for i in obj["tangents"]),
                tangent_strides=tuple(tuple(int(s) for s in st)
                                      for st in obj["tangent_strides"]),
                unsafe_views=tuple(int(i) for i in obj["unsafe_views"]),
                aliases=tuple(_alias_from_wire(a) for a in obj["aliases"]))
        except (TypeError, ValueError):
            raise EntryError("plan: joint layout of the wrong shape") from None
        if len(layout.requires_grad) != layout.outputs \
                or len(layout.tangent_strides) != len(layout.tangents) \
                or any(not 0 <= i < layout.outputs
                       for i in (*layout.tangents, *layout.unsafe_views,
                                 *(a[k] for a in layout.aliases for k in (0, 1)))) \
                or min(layout.outputs, layout.saved, layout.saved_unchecked) < 0:
            raise EntryError("plan: joint layout out of range")
        return layout


def _alias_from_wire(obj: Any) -> tuple[Any, ...]:
    index, base, size, stride, offset, requires_grad, base_stride = obj
    return (int(index), int(base), tuple(int(d) for d in size), tuple(int(d) for d in stride),
            int(offset), bool(requires_grad), tuple(int(d) for d in base_stride))


# What AOTAutograd's wrapper does for these output types, _Joint does too:
# nothing for the first, ``_unsafe_view`` for the second, a view of another
# output for the third (JointLayout.aliases).
_ALIAS_OF_OUTPUT = "alias_of_intermediate_base_is_user_output"
_JOINT_OUTPUT_TYPES = frozenset({"non_alias", "unsafe_view_alias", _ALIAS_OF_OUTPUT})


def trainable(metadata: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd's autograd wrapper of this graph does nothing
    :class:`JointFunction` does not (``metadata``: its ``ViewAndMutationMeta``
    after partitioning). Inputs the forward graph updates itself need no
    wrapper: BatchNorm's running statistics are a ``copy_`` into the buffer
    at the graph's end (``keep_inference_input_mutations`` keeps such
    updates of inputs that need no gradient in the training graph too;
    docs/torch/aot-autograd.md#buffer-updates-stay-in-training-graph)."""
    return (
        runs_bare(metadata, example_inputs, output_types=_JOINT_OUTPUT_TYPES,
                  mutations_in_graph=True)
        and not metadata.num_mutated_inp_runtime_indices
        and all(issubclass(o.raw_type, torch.Tensor) for o in metadata.output_info)
        and metadata.num_symints_saved_for_bw == 0
        and not (metadata.num_opaque_objects_saved_for_bw or 0)
        and not metadata.num_backward_tokens
        and not metadata.indices_of_inputs_that_requires_grad_with_mutations_in_bw
        and all(_views_a_plain_output(metadata, o) for o in metadata.output_info
                if o.output_type.name == _ALIAS_OF_OUTPUT)
    )


def _views_a_plain_output(metadata: Any, info: Any) -> bool:
    """An alias of another user output that is itself no alias (and no
    mutated input comes first among the forward's returns)."""
    base = info.base_idx
    return (not metadata.num_mutated_inp_runtime_indices and base is not None
            and 0 <= base < len(metadata.output_info)
            and metadata.output_info[base].output_type.name in ("non_alias", "unsafe_view_alias"))


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [node for node in gm.graph.nodes if node.op == "placeholder"]


def _outputs(gm: fx.GraphModule) -> Sequence[Any]:
    (out,) = [node for node in gm.graph.nodes if node.op == "output"]
    return out.args[0]


def _check(forward: fx.GraphModule, backward: fx.GraphModule, layout: JointLayout) -> None:
    """The layout matches the graphs: every count the runtime relies on."""
    saved = layout.saved + layout.saved_unchecked
    if len(_outputs(forward)) != layout.outputs + saved:
        raise EntryError("plan: forward outputs do not match the joint layout")
    if len(_placeholders(backward)) != saved + len(layout.tangents):
        raise EntryError("plan: backward inputs do not match the joint layout")
    if len(_outputs(backward)) != len(_placeholders(forward)):
        raise EntryError("plan: backward outputs do not match the forward inputs")


def joint_layout(forward: fx.GraphModule, backward: fx.GraphModule,
                 metadata: Any) -> JointLayout:
    """The layout a training plan stores beside its forward graph (``plan``)
    and backward graph (``backward``). Raises :class:`PlanError` for graphs a
    plan cannot hold."""
    outputs = metadata.num_outputs
    unchecked = metadata.num_tensors_saved_with_no_vc_check or 0
    saved = len(_outputs(forward)) - outputs - unchecked
    # AOTAutograd's backward takes no tangent for a view of another output.
    tangents = tuple(i for i, info in enumerate(metadata.output_info)
                     if info.requires_grad_for_backward
                     and info.output_type.name != _ALIAS_OF_OUTPUT)
    tangent_nodes = _placeholders(backward)[saved + unchecked:]
    strides = []
    for node in tangent_nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise PlanError("a tangent with no tensor value")
        strides.append(tuple(int(s) for s in val.stride()))
    layout = JointLayout(outputs=outputs, saved=saved, saved_unchecked=unchecked,
                         requires_grad=tuple(bool(o.requires_grad) for o in metadata.output_info),
                         tangents=tangents, tangent_strides=tuple(strides),
                         unsafe_views=tuple(i for i, info in enumerate(metadata.output_info)
                                            if info.output_type.name == "unsafe_view_alias"),
                         aliases=_aliases(forward, metadata))
    try:
        _check(forward, backward, layout)
    except EntryError as exc:
        raise PlanError(str(exc)) from None
    return layout


def _aliases(forward: fx.GraphModule, metadata: Any) -> tuple[tuple[Any, ...], ...]:
    """JointLayout.aliases: each view of another output as traced."""
    outs = _outputs(forward)
    aliases = []
    for index, info in enumerate(metadata.output_info):
        if info.output_type.name != _ALIAS_OF_OUTPUT:
            continue
        view, base = (getattr(outs[i], "meta", {}).get("val") for i in (index, info.base_idx))
        if not isinstance(view, torch.Tensor) or not isinstance(base, torch.Tensor):
            raise PlanError("a view of an output with no traced value")
        aliases.append((index, info.base_idx, tuple(view.shape), tuple(view.stride()),
                        int(view.storage_offset()), bool(info.requires_grad),
                        tuple(base.stride())))
    return tuple(aliases)


def joint_graphs(entry: Entry) -> tuple[Partitioned, Partitioned, JointLayout]:
    """The partitioned forward and backward graphs and the layout of a
    training plan; raises EntryError for a bad one."""
    forward = partitioned_from_wire(entry.payload.get("plan"), values=False)
    backward = partitioned_from_wire(entry.payload.get("backward"), values=False)
    layout = JointLayout.from_wire(entry.payload.get("joint"))
    _check(forward.module, backward.module, layout)
    return forward, backward, layout


def _detached_views(tensors: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(t.detach() if isinstance(t, torch.Tensor) and t._is_view() else t
                 for t in tensors)


class _Joint(torch.autograd.Function):
    """The autograd node of one call: forward, saving what backward reads."""

    @staticmethod
    def forward(ctx: Any, joint: JointFunction, *args: torch.Tensor) -> tuple[Any, ...]:
        layout = joint.layout
        outs = joint.forward(*args)
        user = list(outs[:layout.outputs])
        for i in layout.unsafe_views:
            user[i] = _unsafe_view(user[i], user[i].shape)
        for alias in layout.aliases:  # taken again from its base by JointFunction
            user[alias[0]] = None
        checked_end = layout.outputs + layout.saved
        # Saved views are detached, as AOTAutograd's wrapper detaches them
        # (``_AutogradSavedState.save_from_forward``): a transposed weight
        # saved as a view (docs/torch/aot-autograd.md#saved-transposed-weight-is-a-view) otherwise
        # comes back from ``ctx.saved_tensors`` requiring grad, and the backward's
        # regions were asked for under another key than the cold process
        # stored (docs/torch/aot-autograd.md#saved-views-are-detached).
        ctx.save_for_backward(*_detached_views(outs[layout.outputs:checked_end]))
        ctx.unchecked = _detached_views(outs[checked_end:])
        ctx.joint = joint
        ctx.mark_non_differentiable(*(t for t, grad in zip(user, layout.requires_grad,
                                                            strict=True)
                                      if not grad and t is not None))
        return tuple(user)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        joint: JointFunction = ctx.joint
        layout = joint.layout
        tangents = []
        for index, stride in zip(layout.tangents, layout.tangent_strides, strict=True):
            grad = grads[index]
            if grad.stride() != stride:  # the layout the backward was traced with
                grad = torch.empty_strided(grad.shape, stride, dtype=grad.dtype,
                                           device=grad.device).copy_(grad)
            tangents.append(grad)
        inputs = [*ctx.saved_tensors, *ctx.unchecked, *tangents]
        # The list is the only holder of what the forward saved (unless the
        # graph is kept for another backward): the boxed backward frees
        # each input after its last use, as eager's autograd frees a node's.
        del ctx.unchecked, tangents
        ctx.maybe_clear_saved_tensors()
        return (None, *joint.boxed_backward(inputs))


class JointFunction:
    """AOTAutograd's training wrapper, rebuilt from a plan: ``forward`` and
    ``backward`` are the (partitioned) graphs, called on flat tensors."""

    __slots__ = ("backward", "boxed_backward", "forward", "layout")

    def __init__(self, forward: Callable[..., Any], backward: Callable[..., Any],
                 layout: JointLayout) -> None:
        self.forward = forward
        self.backward = backward
        self.boxed_backward = boxed(backward)
        self.layout = layout

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        outs = _Joint.apply(self, *args)
        if not self.layout.aliases:
            return outs
        outs = list(outs)
        for index, base, size, stride, offset, requires_grad, base_stride in self.layout.aliases:
            source = outs[base]
            if source.stride() != base_stride:  # the view would read other elements
                raise LayoutChanged(f"output {base} is laid out otherwise than traced "
                                   f"({source.stride()} against {base_stride})")
            view = source.as_strided(size, stride, offset)
            outs[index] = view if requires_grad else view.detach()
        return tuple(outs)
