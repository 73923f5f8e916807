"""FSDP2 (``fully_shard``) training stored as programs: FSDP's hooks and
each sharded module's call stay eager around its forward compiled
(docs/torch/distributed.md#fsdp2-hooks-are-dynamo-disabled,
docs/torch/distributed.md#no-resume-after-break-in-a-loop,
docs/torch/distributed.md#sharded-program-guards-mro-by-index and
docs/torch/distributed.md#sharding-the-stand-in-fails). Ranks run as child processes on gloo,
CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CHILDREN, child_env, free_port


def _fake_sharded(module):
    """``module`` of an ``FSDP<class>`` as ``fully_shard`` makes one (no
    state, no process group: enough to route and to pick the units)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    module.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return module


def test_units_are_the_weight_holding_modules_with_no_sharded_module_below():
    import torch

    import ltc_cache
    from ltc_cache.program.fully_sharded import CompiledFullyShardedModule, compiled_units

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.blocks = torch.nn.ModuleList(
                _fake_sharded(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
                for _ in range(2))
            self.act = torch.nn.GELU()
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, ids):
            h = self.embed(ids)
            for block in self.blocks:
                h = block(h)
            return self.norm(self.act(h))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stack = Stack()
            self.head = torch.nn.Linear(4, 2)

        def forward(self, ids):
            return self.head(self.stack(ids))

    model = Model()
    units = compiled_units(model)
    names = {module: name for name, module in model.named_modules()}
    assert [names[m] for m in units] == ["stack.embed", "stack.blocks.0", "stack.blocks.1",
                                         "stack.norm", "head"]
    compiled = ltc_cache.compile(model)
    assert isinstance(compiled, CompiledFullyShardedModule)
    assert type(compiled).__name__ == "Model"
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in model.named_parameters()]
    # A model none of whose modules is sharded is compiled whole, as before.
    assert not isinstance(ltc_cache.compile(torch.nn.Linear(2, 2)), CompiledFullyShardedModule)
    # fully_shard(stand-in) sets an FSDP class on it last: refused, naming the order.
    with pytest.raises(TypeError, match=r"then ltc_cache\.compile"):
        _fake_sharded(ltc_cache.compile(torch.nn.Linear(2, 2)))


# One process, a process group of one rank: which modules are compiled,
# training against eager FSDP2, the other order refused, and the private torch
# pieces this relies on. Prints one JSON line.
ONE_RANK = '''\
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard

import ltc_cache
from ltc_cache.program.fully_sharded import CompiledFullyShardedModule, compiled_units

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0,
                        world_size=1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x)) + x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.drop(self.embed(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h).square().mean()


def build(order):
    torch.manual_seed(0)
    net = Net()
    if order == "fsdp_of_compiled":
        for block in net.blocks:
            fully_shard(block)
        compiled = ltc_cache.compile(net)
        fully_shard(compiled)
        return compiled, net
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    return (net if order == "eager" else ltc_cache.compile(net)), net


def train(order):
    model, net = build(order)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(x)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return model, net, losses


compiled, net, losses = train("compiled_fsdp")
_, _, eager = train("eager")
try:
    build("fsdp_of_compiled")
    refused = None
except TypeError as exc:
    refused = str(exc)
block = net.blocks[0]
result = {
    "is_stand_in": isinstance(compiled, CompiledFullyShardedModule),
    "name": type(compiled).__name__,
    "units": [name for name, module in net.named_modules() if module in compiled_units(net)],
    "losses": losses, "eager": eager, "refused": refused,
    "stats": ltc_cache.stats(),
    # Private pieces: FSDP's class is FSDP<class> whose own class sits at
    # _orig_cls_mro_index of its MRO; the sharded parameters are DTensors
    # between calls.
    "mro_index": type(block).__mro__[type(block)._orig_cls_mro_index] is Block,
    "fsdp_class": isinstance(block, FSDPModule) and type(block) is not Block,
    "sharded_between_calls": type(block.linear.weight).__name__,
    "forward_restored": "forward" not in block.__dict__ and type(block).__name__ == "FSDPBlock",
}
dist.destroy_process_group()
print(json.dumps(result))
'''


@pytest.mark.slow  # three programs captured in a child (40 s on a loaded machine)
def test_one_rank_compiles_each_unit_and_trains_as_eager(cache_dir, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK)
    proc = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True,
                          text=True, env=child_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["is_stand_in"] and result["name"] == "Net", result
    # The modules with no sharded module below them that hold weights; the
    # model and the list above the blocks run eagerly, and so does the dropout.
    assert result["units"] == ["embed", "blocks.0", "blocks.1", "head"], result
    assert result["losses"] == pytest.approx(result["eager"], abs=1e-6), result
    # The other order: refused where fully_shard makes the stand-in FSDP's.
    assert result["refused"] and "then ltc_cache.compile(model)" in result["refused"], result
    assert result["mro_index"] and result["fsdp_class"], result
    assert result["sharded_between_calls"] == "DTensor", result
    assert result["forward_restored"], result
    stats = result["stats"]
    assert stats.get("program_fallbacks", 0) == 0 and stats["errors"] == 0, stats
    assert stats.get("program_captures", 0) >= 3, stats


def torchrun(out: Path, order: str, ranks: int = 2, *options: str) -> list[dict]:
    for old in out.glob("rank*.json"):
        old.unlink()
    command = [str(Path(sys.executable).with_name("torchrun")), f"--nproc_per_node={ranks}",
               f"--master_port={free_port()}", str(CHILDREN / "fsdp.py"), order, str(out),
               *options]
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]


@pytest.mark.slow  # two torchrun launches of two ranks each
def test_fsdp_ranks_cold_then_warm(cache_dir, tmp_path, monkeypatch):
    """GPT-2 with each block and the model ``fully_shard``-ed, then
    ``ltc_cache.compile``: a warm rank loads every program and captures,
    traces nothing; losses equal eager FSDP2's on every rank."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    out = tmp_path / "out"
    out.mkdir()
    for phase in ("cold", "warm"):
        ranks = torchrun(out, "compiled_fsdp")
        for rank in ranks:
            assert rank["losses"] == pytest.approx(rank["eager"], abs=1e-5), rank
            stats = rank["stats"]
            assert stats["errors"] == 0, rank
            assert stats.get("program_fallbacks", 0) == 0, rank["logs"]
            # No frame of FSDP's or of the model's glue goes to Dynamo.
            assert rank["frames_ok"] == 0 and rank["visited"] == [], rank["visited"]
            if phase == "cold":
                assert stats.get("program_captures", 0) > 0, rank
                continue
            # wte, wpe, the two blocks (one program), ln_f, lm_head.
            assert stats.get("program_hits", 0) == 6, rank["logs"]
            assert stats.get("program_captures", 0) == 0, rank["logs"]
            assert rank["captures"] == 0 and rank["aot_traces"] == 0, rank
            assert stats["traces"] == 0, rank
            # No graph of Dynamo's: the loaded programs' were counted as such, 6 a rank.
            assert stats.get("dynamo_graphs", 0) == 0, rank


@pytest.mark.slow  # two torchrun launches of two ranks each
def test_fsdp_ranks_with_the_key_value_cache_on_run_warm(cache_dir, tmp_path, monkeypatch):
    """The same model trained with ``use_cache`` left on: GPT-2 builds a
    ``DynamicCache`` each forward and hands it to each block, which went to
    torch.compile (a cache grows every decoding step): warm ranks loaded 4
    programs and Dynamo captured each block's frame, 2 a rank. A block
    writes only its own layer, empty in a training forward, so its program
    runs with a stand-in whose layout is the same every call
    (program/kv_cache.py): a program per block (each guards its
    ``layer_idx``), none captured warm; losses equal eager FSDP2's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    out = tmp_path / "out"
    out.mkdir()
    for phase in ("cold", "warm"):
        for rank in torchrun(out, "compiled_fsdp", 2, "--use-cache"):
            assert rank["losses"] == pytest.approx(rank["eager"], abs=1e-5), rank
            stats = rank["stats"]
            assert stats["errors"] == 0 and stats.get("program_fallbacks", 0) == 0, rank["logs"]
            assert rank["frames_ok"] == 0 and rank["visited"] == [], rank["visited"]
            if phase == "warm":
                # wte, wpe, each block's, ln_f, lm_head.
                assert stats.get("program_hits", 0) == 6, rank["logs"]
                assert stats.get("program_captures", 0) == 0 and rank["captures"] == 0, rank
                assert rank["aot_traces"] == 0 and stats["traces"] == 0, rank
