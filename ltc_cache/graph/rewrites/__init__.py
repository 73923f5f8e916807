"""Rewrites of a traced graph's IR, applied once at trace time, before the
entry is stored, so that every process that loads the entry gains.

LTC's TorchScript backend lowers every view op to a copy (``t_copy``,
``view_copy`` ...), so each call copies every weight it transposes, and it
passes each captured scalar (``addmm``'s alpha and beta, ``add``'s alpha) as
a 0-dim tensor graph input that an ``aten::ScalarImplicit`` node unwraps at
every call. Three small rewrites remove that work:

- :func:`functional_aranges`: ``arange`` into a stored ``out`` tensor (how
  LTC writes a position index) becomes the ``arange`` that allocates, so
  that the graph writes no memory and the next rewrite may run;
- :func:`views_for_copies`: a view copy becomes the view it copies, where no
  op in the graph writes to memory, the view is only read by ops that read
  values (not strides), and no output shares memory or changes layout;
- :func:`fold_scalars`: ``ScalarImplicit`` of a stored 0-dim constant (or
  of a tensor constant in the IR) becomes an IR constant, and the constant
  input goes from the layout;
- :func:`scalar_exponents`: ``pow`` of a stored 0-dim exponent becomes
  ``pow`` of a number, the overload eager runs for ``x.pow(2)`` and ten
  times faster (RMSNorm's square);
- :func:`tanh_gelus`: GELU's tanh approximation written out as eight
  elementwise ops (GPT-2's) becomes ATen's one-pass ``gelu``;
- :func:`silu_backwards`: the chain of six ops LTC lowers ``silu_backward``
  to (Llama's backward) becomes that one fused op again;
- :func:`drop_dead_code`: nodes and graph inputs nothing reads.

One shortens the graph, which a warm start pays for by the node
(:func:`linears`: a product with a transposed weight, ``addmm(b, x,
w.t())`` or ``mm(x, w.t())``, becomes the ``linear`` that runs exactly
that product, one node where there were two), and one makes the stored
text mean what LTC built (:func:`bool_list_constants`).

Each works on a parsed graph and the input layout in place; :func:`rewrite`
applies them to an :class:`~ltc_cache.graph.extract.Extraction` and keeps the
traced IR where anything fails, since a rewrite is an optimisation only.

A module per family: ``views``, ``scalars`` (with the bool lists),
``fusions`` and ``matmuls``, over the IR helpers they share (``ir``);
dead code is removed here (:func:`drop_dead_code`). TorchScript's IR API
is reached through :mod:`ltc_cache.graph.torchscript_ir`. Their log is
``ltc_cache.rewrite``.
"""

from __future__ import annotations

import dataclasses
import logging

from ...diagnostics import warn_once
from ...entries.layout import Source
from ...errors import RewriteRefused
from ..extract import Extraction
from ..torchscript_ir import Graph, parse_ir, remove_dead_code
from .fusions import silu_backwards, tanh_gelus
from .ir import parse_traced
from .matmuls import linears
from .scalars import bool_list_constants, fold_scalars, scalar_exponents
from .views import VIEW_OF_COPY, functional_aranges, views_for_copies

__all__ = ["VIEW_OF_COPY", "bool_list_constants", "drop_dead_code", "fold_scalars",
           "functional_aranges", "linears", "parse_traced", "rewrite", "scalar_exponents",
           "silu_backwards", "tanh_gelus", "views_for_copies"]

logger = logging.getLogger("ltc_cache.rewrite")


def rewrite(extraction: Extraction) -> Extraction:
    """``extraction`` with its IR rewritten by every rewrite of this package and its
    input layout to match; the extraction unchanged where a rewrite fails or
    its result does not parse again."""
    if not extraction.ir:
        return extraction
    try:
        graph = parse_traced(extraction.ir)
        inputs = list(extraction.inputs)
        if len(inputs) != len(list(graph.inputs())):
            raise RewriteRefused(f"{len(inputs)} inputs laid out for a graph of "
                             f"{len(list(graph.inputs()))}")
        aranges = functional_aranges(graph, inputs)
        views = views_for_copies(graph)
        scalars = fold_scalars(graph, inputs)
        bool_lists = bool_list_constants(graph)
        products = linears(graph)
        powers = scalar_exponents(graph, inputs)
        gelus = tanh_gelus(graph, inputs)
        silus = silu_backwards(graph, inputs)
        dead = drop_dead_code(graph, inputs)
        ir = str(graph)
        # What the cache stores must parse in a new process, as replay parses.
        parse_ir(ir)
    except Exception as exc:  # best effort: the traced IR is correct as it is
        warn_once("rewrite", f"cannot rewrite a traced graph ({type(exc).__name__}: {exc}); "
                  "storing it as traced")
        return extraction
    logger.debug("made %d aranges allocate, rewrote %d view copies, folded %d scalars, "
                 "rebuilt %d bool lists, made %d linears, %d scalar powers, %d tanh GELUs and "
                 "%d SiLU backwards, dropped %d dead nodes/inputs", aranges, views, scalars,
                 bool_lists, products, powers, gelus, silus, dead)
    return dataclasses.replace(extraction, ir=ir, inputs=tuple(inputs))


def drop_dead_code(graph: Graph, inputs: list[Source]) -> int:
    """Remove nodes whose results nothing reads, merge equal constants, and
    remove graph inputs nothing reads with their entries in ``inputs``;
    returns how many nodes and inputs went."""
    before = sum(1 for _ in graph.nodes())
    remove_dead_code(graph)
    removed = before - sum(1 for _ in graph.nodes())
    params = list(graph.inputs())
    for i in reversed(range(len(inputs))):
        if not params[i].uses():
            graph.eraseInput(i)
            del inputs[i]
            removed += 1
    return removed
