"""``generate()`` of language models through ltc_cache (issue 20).

The regression of the first cold ``generate()`` (a negative slice bound
read back positive, fact 19 in docs/design.md) and of a region that falls
back to eager on inputs laid out otherwise than traced (fact 20); cold then
warm generation in fresh child processes (``tests/generate_child.py``).
"""

from __future__ import annotations

import pytest
import torch
from torch import fx

from ltc_cache.dynamo import _eager


def _region_traced_on_a_transposed_input() -> fx.GraphModule:
    """A region as AOTAutograd makes it after CPU flash attention: a
    ``view`` that merges two dimensions, valid only in the traced layout."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(1, 7, 4, 16, device="meta").transpose(1, 2)
    t = graph.call_function(torch.ops.aten.transpose.int, (x, 1, 2))
    v = graph.call_function(torch.ops.aten.view.default, (t, [1, 7, 64]))
    graph.output((v,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_region_falling_back_to_eager_gets_its_inputs_in_the_traced_layout():
    region = _region_traced_on_a_transposed_input()
    x = torch.randn(1, 4, 7, 16)  # contiguous, as an LTC replay returns it
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        region(x)  # as the region's eager fallback ran before
    (out,) = _eager(region)(x)
    torch.testing.assert_close(out, x.transpose(1, 2).reshape(1, 7, 64), rtol=0, atol=0)
    assert x.is_contiguous()  # the argument itself is left as it was
