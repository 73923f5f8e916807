"""Issue 35: a program whose first call changes what its guards read
(transformers' ``config.problem_type``), code digests that followed the
hash seed, and ``ltc_cache.compile(DDP(model))``; cold then warm in child
processes (docs/torch/dynamo.md#one-layout-several-programs,
docs/torch/dynamo.md#frozenset-repr-follows-the-hash-seed and
docs/torch/distributed.md#ddp-forward-has-nothing-to-compile)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CHILDREN, child_env, free_port, on_import_path

from ltc_cache.entries.entry import decode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.store import ReadOnlyDiskStore

# A module that sets an attribute of its config on its first call and reads
# it, as GPT2ForSequenceClassification sets config.problem_type. The config's
# class has its __setattr__ wrapped as huggingface_hub's @strict wraps
# transformers' configs: the program checks the wrapped one, held in a
# closure, by its class, one of whose methods holds a set literal (a
# frozenset among its code's constants).
MODELS = '''\
import torch


def strict(cls):
    original = cls.__setattr__

    def __strict_setattr__(self, name, value):
        original(self, name, value)

    cls.__setattr__ = __strict_setattr__
    return cls


@strict
class Config:
    def __init__(self):
        self.problem_type = None

    def __setattr__(self, name, value):
        if name in {"problem_type", "num_labels", "id2label", "label2id", "pad_token_id",
                    "torch_dtype"} and value == "regression":
            raise ValueError(value)
        super().__setattr__(name, value)


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16)])
        self.config = Config()

    def forward(self, x):
        if self.config.problem_type is None:
            self.config.problem_type = "single_label_classification"
        y = self.layers[0](x)
        if self.config.problem_type == "single_label_classification":
            return torch.relu(y)
        return y


def build():
    torch.manual_seed(0)
    return Classifier()
'''


def program_keys(directory: Path) -> list[str]:
    store = ReadOnlyDiskStore(directory)
    try:
        return [k for k in list(store.keys())
                if is_entry_key(k) and decode(store.peek(k)).kind == "program"]
    finally:
        store.close()


def child(script: str, *args: str, hash_seed: str | None = None,
          models: Path | None = None) -> dict:
    """``tests/children/<script>``'s report; ``models``: a directory of
    modules the child imports (on its PYTHONPATH)."""
    env = child_env(PYTHONHASHSEED=hash_seed) if hash_seed else child_env()
    if models is not None:
        env = on_import_path(env, models)
    proc = subprocess.run([sys.executable, str(CHILDREN / script), *args], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def signing_key(tmp_path, cache_dir, monkeypatch) -> Path:
    """The per-user signing key under the test's own config directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return cache_dir


# --- code digests ----------------------------------------------------------------


DIGEST = '''\
from ltc_cache.entries.keys import code_digest


def f(x):
    return x in {"single_label_classification", "multi_label_classification", "regression"}


print(code_digest(f.__code__))
'''


def test_a_code_digest_is_the_same_under_every_hash_seed():
    """A set literal compiles to a frozenset constant, whose repr follows
    the strings' hashes, which PYTHONHASHSEED sets per process
    (docs/torch/dynamo.md#frozenset-repr-follows-the-hash-seed)."""
    digests = set()
    for seed in ("1", "2", "3"):
        proc = subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True,
                              env=child_env(PYTHONHASHSEED=seed), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests.add(proc.stdout.strip())
    assert len(digests) == 1, digests


def test_constants_other_than_sets_are_digested_as_before():
    """Digests of code without a frozenset constant did not change (no
    stored entry keyed by one goes stale)."""
    from ltc_cache.entries.keys import constant_text

    for value in (None, 1, 2.5, "a", ("x", 1), b"b", (("y",),)):
        assert constant_text(value) == f"{type(value).__name__}:{value!r}"
    assert constant_text(frozenset({"b", "a"})) == "frozenset:[str:'a',str:'b']"
    assert constant_text(("k", frozenset({2, 1}))) == "tuple:(str:'k',frozenset:[int:1,int:2])"


# --- a layout that needs two programs ----------------------------------------------


@pytest.mark.slow  # two child processes
def test_a_program_whose_first_call_changes_its_guards_loads_warm(signing_key, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "progmodels.py").write_text(MODELS)
    calls = ["--call", "2x16:float32"] * 3
    cold = child("program.py", str(models), *calls, hash_seed="1", models=models)
    # The first call's program (problem_type None) and the next calls'.
    assert cold["stats"].get("program_captures", 0) == 2, cold
    assert len(program_keys(signing_key)) == 2
    for hash_seed in ("2", "3"):  # (as by default, every process hashes strings its own way)
        warm = child("program.py", str(models), *calls, hash_seed=hash_seed,
                     models=models)
        assert warm["max_error"] <= 1e-6, warm
        assert warm["outputs"] == cold["outputs"]
        assert warm["stats"].get("program_hits", 0) == 2, warm
        assert warm["stats"].get("program_captures", 0) == 0, warm
        assert warm["stats"].get("program_fallbacks", 0) == 0, warm
        assert warm["stats"]["traces"] == 0 and warm["frames_ok"] == 0, warm
    assert len(program_keys(signing_key)) == 2


@pytest.mark.slow  # two child processes training a transformers model
def test_gpt2_sequence_classification_trains_warm(signing_key):
    cold = child("seqcls.py")
    warm = child("seqcls.py")
    for result in (cold, warm):
        assert result["losses"] == pytest.approx(result["eager"], abs=1e-5), result
        # AdamW moves every weight by about lr (1e-3) a step, whatever its
        # gradient's size: a gradient near 0 that differs from eager's by
        # rounding moves its weight by a part of that. A tenth of one step.
        assert result["weights_error"] <= 1e-4, result
        assert result["stats"]["errors"] == 0, result
        assert result["stats"].get("program_fallbacks", 0) == 0, result
    assert cold["stats"].get("program_captures", 0) == 2, cold
    assert warm["losses"] == cold["losses"]
    stats = warm["stats"]
    assert stats.get("program_hits", 0) == 2 and stats.get("program_captures", 0) == 0, warm
    assert warm["frames_ok"] == 0 and warm["aot_traces"] == 0 and stats["traces"] == 0, warm
    # Dynamo's graphs: one per program captured cold; none warm (a loaded
    # program's graph was counted as one of Dynamo's, 2 here).
    assert cold["stats"].get("dynamo_graphs", 0) == 2, cold
    assert stats.get("dynamo_graphs", 0) == 0, warm


# --- ltc_cache.compile(DDP(model)) -------------------------------------------------


ONE_RANK = '''\
import copy, json, sys
import torch
import torch.distributed as dist
from torch._dynamo.eval_frame import OptimizedModule
from torch.nn.parallel import DistributedDataParallel as DDP

import ltc_cache

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
eager = DDP(copy.deepcopy(model))
ddp = DDP(model)
compiled = ltc_cache.compile(ddp)
x = torch.randn(4, 8)
got, want = compiled(x), eager(x)
got.sum().backward()
want.sum().backward()
print(json.dumps({
    "type": type(compiled).__name__,
    "optimized": isinstance(compiled, (OptimizedModule, ltc_cache.CompiledModule)),
    "orig": compiled._orig_mod is ddp,
    "module": compiled.module is model and ddp.module is model,
    "names": [n for n, _ in compiled.named_parameters()] == [n for n, _ in ddp.named_parameters()],
    "state": list(compiled.state_dict()) == list(ddp.state_dict()),
    "again": ltc_cache.compile(compiled) is compiled,
    "error": float((got - want).abs().max()),
    "grad_error": max(float((p.grad - q.grad).abs().max())
                      for p, q in zip(model.parameters(), eager.module.parameters())),
    "stats": ltc_cache.stats(),
    "frames_ok": int(torch._dynamo.utils.counters["frames"]["ok"]),
}))
dist.destroy_process_group()
'''


def test_a_compiled_ddp_is_the_ddp_with_its_module_compiled_for_each_call(signing_key,
                                                                             tmp_path):
    """One rank: the stand-in is a CompiledModule over the DDP, whose
    names, ``module`` and state are the DDP's own (the DDP is as it was
    between calls), and whose call runs the module's program."""
    proc = subprocess.run([sys.executable, "-c", ONE_RANK, str(tmp_path / "rendezvous")],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(result[k] for k in ("optimized", "orig", "module", "names", "state", "again")), \
        result
    assert result["error"] <= 1e-6 and result["grad_error"] <= 1e-6, result
    # The module's program (Sequential's forward), no frame of DDP's.
    assert result["stats"].get("program_captures", 0) == 1, result
    assert result["frames_ok"] == 0, result


def torchrun(out: Path, model: str) -> list[dict]:
    for old in out.glob("rank*.json"):
        old.unlink()
    command = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node=2",
               f"--master_port={free_port()}", str(CHILDREN / "ddp.py"), "compiled_ddp",
               str(out), "--model", model]
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow  # two torchrun launches of two ranks each
@pytest.mark.parametrize("model", ["mlp", "seqcls"])
def test_compiled_ddp_ranks_run_warm_with_no_frame(model, signing_key, tmp_path):
    """DDP's forward stays eager around its module compiled
    (docs/torch/distributed.md#ddp-forward-has-nothing-to-compile): a warm rank hands Dynamo no
    frame at all, and the gradients are still all-reduced (weights equal on both ranks, and to eager
    DDP's)."""
    out = tmp_path / "out"
    out.mkdir()
    # problem_type: two programs (docs/torch/dynamo.md#one-layout-several-programs)
    programs = 2 if model == "seqcls" else 1
    for phase in ("cold", "warm"):
        ranks = torchrun(out, model)
        reference = ranks[0]["reference"]
        assert ranks[0]["weights"] == ranks[1]["weights"], phase
        assert ranks[0]["weights_error"] <= 1e-5, ranks[0]
        for rank in ranks:
            assert rank["losses"] == pytest.approx(rank["eager_ddp"], abs=1e-5), rank
            assert rank["losses"] == pytest.approx(reference, abs=1e-5), rank
            assert rank["eager_ddp_weights_error"] <= 1e-5, rank
            assert rank["stats"]["errors"] == 0, rank
            assert rank["stats"].get("program_fallbacks", 0) == 0, rank
            assert rank["frames_ok"] == 0 and rank["visited"] == [], rank
            if phase == "cold":
                assert rank["stats"].get("program_captures", 0) == programs, rank
                continue
            assert rank["stats"].get("program_hits", 0) == programs, rank
            assert rank["stats"].get("program_captures", 0) == 0, rank
            assert rank["captures"] == 0 and rank["aot_traces"] == 0, rank
            assert rank["stats"]["traces"] == 0, rank
