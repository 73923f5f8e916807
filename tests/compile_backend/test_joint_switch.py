"""A cold process's training steps run through the plan's JointFunction
once the plan is made (ltc_cache/compile_backend/joint_switch.py), with eager's losses and
gradients: from the first step, since the backward is compiled with the
forward; where AOTAutograd compiles it lazily, the first step runs through
AOTAutograd's own wrapper."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from ltc_cache import CacheConfig, GraphCache, LtcBackend

pytestmark = pytest.mark.usefixtures("dynamo_reset")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.gelu(self.fc1(x))
        return self.fc2(h), h.sum(-1)  # two outputs, both differentiable


def _backward_nodes(loss: torch.Tensor) -> set[str]:
    """The names of every node of ``loss``'s autograd graph."""
    seen, todo, names = set(), [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


@pytest.mark.parametrize("backward", ["with the forward", "lazily"])
def test_cold_training_switches_to_the_joint_function_with_eager_results(cache_dir, monkeypatch,
                                                                          backward):
    if backward == "lazily":  # as on a torch without the switch
        from ltc_cache.compile_backend import aot_autograd

        monkeypatch.setattr(aot_autograd, "backward_compiled_with_forward",
                            lambda wanted: contextlib.nullcontext())
    torch.manual_seed(0)
    reference, x = Net(), torch.randn(8, 16)
    models = {"eager": copy.deepcopy(reference), "compiled": copy.deepcopy(reference)}
    runs = {"eager": models["eager"],
            "compiled": torch.compile(models["compiled"],
                                      backend=LtcBackend(GraphCache(CacheConfig.from_env())))}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    nodes: list[set[str]] = []
    for _ in range(4):
        losses = {}
        for label, run in runs.items():
            optimizers[label].zero_grad()
            out, side = run(x)
            loss = out.pow(2).mean() + side.mean()
            if label == "compiled":
                nodes.append(_backward_nodes(loss))
            loss.backward()
            optimizers[label].step()
            losses[label] = loss.item()
        torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-5, atol=1e-6)
        for p, q in zip(models["compiled"].parameters(), models["eager"].parameters(),
                        strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    joint_from = 0 if backward == "with the forward" else 1
    for first in nodes[:joint_from]:
        assert "CompiledFunctionBackward" in first and "_JointBackward" not in first
    for later in nodes[joint_from:]:
        assert "_JointBackward" in later and "CompiledFunctionBackward" not in later
