"""What ``ltc_cache.compile(module)`` returns stands in for the module where
training loops look at it: its forward's signature and docstring, its
attributes and methods, its parameter, buffer and submodule names, its
state_dict, and how accelerate and transformers recognise and unwrap a
compiled model. Tiny transformers models, nothing called but where said.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch

import ltc_cache
from ltc_cache.program.compiled_module import CompiledModule

transformers = pytest.importorskip("transformers")


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def bert_classifier() -> torch.nn.Module:
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=96,
                                     max_position_embeddings=32, num_labels=3)
    return transformers.BertForSequenceClassification(config)


@pytest.fixture(params=[gpt2, bert_classifier], ids=["gpt2", "bert"])
def pair(request):
    torch.manual_seed(0)
    model = request.param()
    return model, ltc_cache.compile(model)


def test_forward_shows_the_modules_signature_and_docstring(pair):
    from transformers.utils.generic import can_return_loss, find_labels

    model, compiled = pair
    assert inspect.signature(compiled.forward) == inspect.signature(model.forward)
    assert "input_ids" in inspect.signature(compiled.forward).parameters
    assert compiled.forward.__doc__ == model.forward.__doc__
    # What Trainer reads from the class: the label names, whether it returns a loss.
    assert find_labels(type(compiled)) == find_labels(type(model)) == ["labels"]
    assert can_return_loss(type(compiled)) == can_return_loss(type(model))
    assert type(compiled).__name__ == type(model).__name__
    assert compiled._get_name() == model._get_name()
    assert isinstance(compiled, CompiledModule) and isinstance(compiled, ltc_cache.CompiledModule)
    assert not isinstance(compiled, type(model))  # a stand-in, not the class


def test_a_forward_set_on_the_instance_shows_its_signature():
    model = torch.nn.Linear(4, 4)

    def forward(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Scaled."""
        return torch.nn.functional.linear(x, model.weight, model.bias) * scale

    model.forward = forward
    compiled = ltc_cache.compile(model)
    assert inspect.signature(compiled.forward) == inspect.signature(forward)
    assert compiled.forward.__doc__ == "Scaled."


@pytest.mark.filterwarnings("ignore:.*gradient_checkpointing:FutureWarning")
def test_attributes_and_methods_reach_the_module(pair, tmp_path):
    model, compiled = pair
    assert compiled.config is model.config
    assert compiled.device == model.device
    assert compiled.supports_gradient_checkpointing
    compiled.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    compiled.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    compiled.some_flag = 3  # set on the module, as torch.compile's wrapper does
    assert model.some_flag == 3 and compiled.some_flag == 3
    compiled.eval()
    assert not model.training and not compiled.training
    model.train()
    assert compiled.training
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = compiled.no_such_attribute

    compiled.save_pretrained(tmp_path / "saved")
    loaded = type(model).from_pretrained(tmp_path / "saved")
    for (name, a), (other, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                                     strict=True):
        assert name == other and torch.equal(a, b), name


def test_names_are_the_modules_own(pair):
    model, compiled = pair
    for method in ("named_parameters", "named_buffers", "named_modules"):
        got = [(n, id(v)) for n, v in getattr(compiled, method)()]
        assert got == [(n, id(v)) for n, v in getattr(model, method)()], method
        assert not any("_orig_mod" in n for n, _ in got), method
    assert [n for n, _ in compiled.named_parameters(prefix="m")] == \
        [n for n, _ in model.named_parameters(prefix="m")]
    assert all(a is b for a, b in zip(compiled.parameters(), model.parameters(), strict=True))
    assert all(a is b for a, b in zip(compiled.buffers(), model.buffers(), strict=True))
    assert next(iter(compiled.modules())) is model
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert not any("_orig_mod" in n for n in compiled.state_dict())
    # Names the two sets share line up, as optimizers' groups and checkpoint tools expect.
    params = dict(compiled.named_parameters())
    state = compiled.state_dict()
    assert all(torch.equal(params[n], state[n]) for n in params)
    name = next(iter(params))
    assert compiled.get_parameter(name) is params[name]
    submodule = name.rsplit(".", 1)[0]
    assert compiled.get_submodule(submodule) is model.get_submodule(submodule)


def test_a_saved_state_dict_loads_into_the_plain_model_and_back(pair, tmp_path):
    model, compiled = pair
    path = tmp_path / "state.pt"
    torch.save(compiled.state_dict(), path)
    torch.manual_seed(1)
    plain = copy.deepcopy(model)
    for p in plain.parameters():
        torch.nn.init.normal_(p)
    plain.load_state_dict(torch.load(path))  # strict: the same names
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    # and a plain model's state_dict into the compiled one
    for p in plain.parameters():
        torch.nn.init.normal_(p)
    torch.save(plain.state_dict(), path)
    compiled.load_state_dict(torch.load(path))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_accelerate_and_transformers_see_a_compiled_model_and_unwrap_it(pair):
    from accelerate.utils import extract_model_from_parallel, is_compiled_module
    from transformers.modeling_utils import unwrap_model

    model, compiled = pair
    assert is_compiled_module(compiled) and not is_compiled_module(model)
    assert compiled._orig_mod is model
    # Trainer saves through this: the plain model, whose save_pretrained it calls.
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    assert extract_model_from_parallel(compiled) is compiled
    assert unwrap_model(compiled) is compiled
    compiled._orig_mod = model  # what extract_model_from_parallel does, re-wrapping
    with pytest.raises(AttributeError, match="cannot be replaced"):
        compiled._orig_mod = copy.deepcopy(model)
    assert ltc_cache.compile(compiled) is compiled


def test_accelerate_with_a_dynamo_backend_does_not_compile_it_again(pair):
    """TrainingArguments(torch_compile=True) reaches accelerate as a dynamo
    backend; a model compiled already is left as it is."""
    from accelerate import Accelerator

    _, compiled = pair
    prepared = Accelerator(cpu=True, dynamo_backend="inductor").prepare(compiled)
    assert prepared is compiled


def test_copies_and_pickles_compile_a_copy_of_the_module(pair):
    model, compiled = pair
    for copied in (copy.deepcopy(compiled), pickle.loads(pickle.dumps(compiled))):
        assert type(copied) is type(compiled)
        assert copied._orig_mod is not model
        assert list(copied.state_dict()) == list(model.state_dict())
        assert all(torch.equal(a, b) for a, b in zip(copied.parameters(), model.parameters(),
                                                     strict=True))
        assert copied.__dict__["_ltc_programs"] is not compiled.__dict__["_ltc_programs"]


def test_the_stand_in_computes_as_the_module(cache_dir):
    torch.manual_seed(0)
    model = gpt2().eval()
    compiled = ltc_cache.compile(model)
    ids = torch.randint(0, 96, (2, 8))
    with torch.no_grad():
        got = compiled(input_ids=ids, labels=ids)
        want = model(input_ids=ids, labels=ids)
    assert torch.allclose(got.logits, want.logits, atol=1e-5)
    assert torch.allclose(got.loss, want.loss, atol=1e-5)
    # One program (a logging call once per process in GPT-2's loss is no graph break).
    assert ltc_cache.stats().get("program_captures") == 1
    assert ltc_cache.stats().get("program_fallbacks", 0) == 0


def test_typing_objects_and_dataclass_fields_are_described_across_processes():
    """transformers' forwards reach typing's special forms (BERT's
    classifier) and their configs' validators hold dataclass fields: a
    guard on one becomes a portable check, equal exactly for equal ones."""
    import dataclasses
    import typing

    from ltc_cache.program.describe import describe

    assert describe(typing.Optional) == describe(typing.Optional)
    assert describe(typing.Optional) != describe(typing.Union)
    assert describe(typing.List[int]) != describe(typing.List[str])  # noqa: UP006

    @dataclasses.dataclass
    class Config:
        a: int = 1
        b: str = "x"
        c: list = dataclasses.field(default_factory=list)

    fields = {f.name: f for f in dataclasses.fields(Config)}
    assert describe(fields["a"]) == describe(dataclasses.fields(Config)[0])
    assert len({repr(describe(f)) for f in fields.values()}) == 3


class _WithDtype(torch.nn.Module):
    """Holds one of torch's shared constants, as a LightningModule does (_dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.kind = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.layer(x))


class _Breaks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        torch._dynamo.graph_break()
        return y * 2


def test_a_module_holding_a_dtype_gets_a_program(cache_dir):
    torch.manual_seed(0)
    model = _WithDtype()
    x = torch.randn(2, 4)
    assert torch.allclose(ltc_cache.compile(model)(x), model(x), atol=1e-6)
    stats = ltc_cache.stats()
    assert stats.get("program_captures") == 1 and stats.get("program_fallbacks", 0) == 0, stats


def test_a_forward_wrapped_with_dynamo_ctx_falls_back_without_recursion(cache_dir):
    """Lightning replaces the module's forward with dynamo_ctx(forward); a
    call that goes to torch.compile (here dynamic=True, which no program
    serves) must compile the original forward, not the replaced one (that
    calls the programs again)."""
    torch.manual_seed(0)
    model = _Breaks()
    x = torch.randn(2, 4)
    want = model(x)
    compiled = ltc_cache.compile(model, dynamic=True)
    model.forward = compiled.dynamo_ctx(model.forward)
    assert inspect.signature(model.forward) == inspect.signature(_Breaks.forward.__get__(model))
    assert compiled.dynamo_ctx(model.layer.forward) is not None  # other methods: as they are
    assert torch.allclose(model(x), want, atol=1e-6)
    assert ltc_cache.stats().get("program_fallbacks") == 1


def test_a_loaded_program_is_no_graph_of_dynamos(cache_dir, tmp_path, monkeypatch):
    """``dynamo_graphs`` counts the graphs Dynamo captured in this process.
    A loaded program's graph, compiled by the backend on its first call
    from the cache's plan and regions, was counted too: every warm process
    showed one Dynamo graph a program loaded (GPT2ForSequenceClassification
    training: 1; FSDP2 ranks: one a unit), with no capture. Trained, a
    second stand-in over an equal module loads the first one's program."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    ltc_cache.compile(model)(x).sum().backward()
    cold = ltc_cache.stats()
    assert cold.get("program_captures") == 1 and cold.get("dynamo_graphs") == 1, cold
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    again = copy.deepcopy(model)
    got = ltc_cache.compile(again)(x)
    got.sum().backward()
    assert torch.allclose(got, model(x), atol=1e-6)
    warm = {k: v - cold.get(k, 0) for k, v in ltc_cache.stats().items()}
    assert warm.get("program_hits") == 1 and warm.get("program_captures", 0) == 0, warm
    assert warm.get("aot_traces", 0) == 0 and warm["traces"] == 0, warm
    assert warm.get("dynamo_graphs", 0) == 0, warm
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames
