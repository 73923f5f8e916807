"""The models of PyTorch's Dynamo benchmark suites, built from tiny configs.

``benchmarks/dynamo/huggingface`` lists transformers model classes; the
timm list is approximated by the vision models ``transformers`` has. Each
builder returns ``(model, kwargs)``: the model with random weights from the
caller's seed, its dropouts set to 0 (training compared with eager must
draw no masks), and keyword inputs for one forward. No downloads.

``build(name)`` builds one; ``SUITE`` maps every name to its builder;
``names(family)`` lists them by family ("hf", "vision"; "timm": timm's own
models, zoo/timm_models.py, built only where asked for by name or family).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zoo.timm_models import TIMM

VOCAB = 128
BATCH, SEQ = 2, 8
IMAGE = 32

# Sizes every text config gets (names differ between families; each
# builder maps them): 2 layers, hidden 32, 2 heads, intermediate 64.
_TEXT = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
         "intermediate_size": 64, "vocab_size": VOCAB, "max_position_embeddings": 64}


def _ids(generator_seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ),
                         generator=torch.Generator().manual_seed(generator_seed))


def _pixels(size: int = IMAGE, channels: int = 3) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=torch.Generator().manual_seed(3))


def _no_dropout(config) -> None:
    """Every float setting named like a dropout probability becomes 0."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("drop" in key or key == "layerdrop"):
            setattr(config, key, 0.0)


def _make(config_name: str, model_name: str, inputs: Callable[[], dict], **settings):
    def builder():
        import transformers

        config = getattr(transformers, config_name)(**settings)
        _no_dropout(config)
        model = getattr(transformers, model_name)(config)
        return model, inputs()
    builder.model_class = model_name  # type: ignore[attr-defined]
    return builder


def _text(**extra) -> Callable[[], dict]:
    return lambda: {"input_ids": _ids(), **{k: v() for k, v in extra.items()}}


def _seq2seq() -> dict:
    return {"input_ids": _ids(), "decoder_input_ids": _ids(11)}


def _image(size: int = IMAGE) -> Callable[[], dict]:
    return lambda: {"pixel_values": _pixels(size)}


def _bbox() -> torch.Tensor:
    corners = torch.randint(0, 500, (BATCH, SEQ, 2), generator=torch.Generator().manual_seed(5))
    return torch.cat([corners, corners + 10], dim=-1)


_BART = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
         "vocab_size": VOCAB, "max_position_embeddings": 64, "pad_token_id": 1,
         "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
_T5 = {"num_layers": 2, "num_decoder_layers": 2, "d_model": 32, "d_kv": 16, "num_heads": 2,
       "d_ff": 64, "vocab_size": VOCAB, "decoder_start_token_id": 0}
_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": VOCAB, "n_positions": 64,
         "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
_LLAMA = {**_TEXT, "num_key_value_heads": 2, "head_dim": 16}
_VIT = {"image_size": IMAGE, "patch_size": 8, "num_hidden_layers": 2, "hidden_size": 32,
        "num_attention_heads": 2, "intermediate_size": 64}

HF: dict[str, Callable] = {
    "AlbertForMaskedLM": _make("AlbertConfig", "AlbertForMaskedLM", _text(), **_TEXT,
                               embedding_size=16),
    "AlbertForQuestionAnswering": _make("AlbertConfig", "AlbertForQuestionAnswering", _text(),
                                        **_TEXT, embedding_size=16),
    "AllenaiLongformerBase": _make("LongformerConfig", "LongformerModel", _text(), **_TEXT,
                                   attention_window=4),
    "BartForCausalLM": _make("BartConfig", "BartForCausalLM", _text(), **_BART),
    "BartForConditionalGeneration": _make("BartConfig", "BartForConditionalGeneration",
                                          _seq2seq, **_BART),
    "BertForMaskedLM": _make("BertConfig", "BertForMaskedLM", _text(), **_TEXT),
    "BertForQuestionAnswering": _make("BertConfig", "BertForQuestionAnswering", _text(), **_TEXT),
    "BlenderbotForCausalLM": _make("BlenderbotConfig", "BlenderbotForCausalLM", _text(), **_BART),
    "BlenderbotForConditionalGeneration": _make(
        "BlenderbotConfig", "BlenderbotForConditionalGeneration", _seq2seq, **_BART),
    "BlenderbotSmallForCausalLM": _make("BlenderbotSmallConfig", "BlenderbotSmallForCausalLM",
                                        _text(), **_BART),
    "BlenderbotSmallForConditionalGeneration": _make(
        "BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", _seq2seq, **_BART),
    "CamemBert": _make("CamembertConfig", "CamembertForMaskedLM", _text(), **_TEXT,
                       pad_token_id=1),
    "DebertaV2ForMaskedLM": _make("DebertaV2Config", "DebertaV2ForMaskedLM", _text(), **_TEXT),
    "DebertaV2ForQuestionAnswering": _make("DebertaV2Config", "DebertaV2ForQuestionAnswering",
                                           _text(), **_TEXT),
    "DistilBertForMaskedLM": _make("DistilBertConfig", "DistilBertForMaskedLM", _text(),
                                   n_layers=2, dim=32, n_heads=2, hidden_dim=64,
                                   vocab_size=VOCAB, max_position_embeddings=64),
    "DistilBertForQuestionAnswering": _make("DistilBertConfig", "DistilBertForQuestionAnswering",
                                            _text(), n_layers=2, dim=32, n_heads=2,
                                            hidden_dim=64, vocab_size=VOCAB,
                                            max_position_embeddings=64),
    "DistillGPT2": _make("GPT2Config", "GPT2LMHeadModel", _text(), **_GPT2),
    "ElectraForCausalLM": _make("ElectraConfig", "ElectraForCausalLM", _text(), **_TEXT,
                                embedding_size=16, is_decoder=True),
    "ElectraForQuestionAnswering": _make("ElectraConfig", "ElectraForQuestionAnswering", _text(),
                                         **_TEXT, embedding_size=16),
    "GPT2ForSequenceClassification": _make("GPT2Config", "GPT2ForSequenceClassification",
                                           _text(), **_GPT2, num_labels=3),
    "GPTJForCausalLM": _make("GPTJConfig", "GPTJForCausalLM", _text(), **_GPT2, rotary_dim=8),
    "GPTJForQuestionAnswering": _make("GPTJConfig", "GPTJForQuestionAnswering", _text(),
                                      **_GPT2, rotary_dim=8),
    "GPTNeoForCausalLM": _make("GPTNeoConfig", "GPTNeoForCausalLM", _text(), num_layers=2,
                               hidden_size=32, num_heads=2, vocab_size=VOCAB,
                               max_position_embeddings=64, attention_types=[[["global",
                                                                               "local"], 1]],
                               window_size=4),
    "GPTNeoForSequenceClassification": _make(
        "GPTNeoConfig", "GPTNeoForSequenceClassification", _text(), num_layers=2,
        hidden_size=32, num_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=4, pad_token_id=0),
    "GoogleFnet": _make("FNetConfig", "FNetForMaskedLM", _text(), **_TEXT),
    "LayoutLMForMaskedLM": _make("LayoutLMConfig", "LayoutLMForMaskedLM", _text(bbox=_bbox),
                                 **_TEXT),
    "LayoutLMForSequenceClassification": _make(
        "LayoutLMConfig", "LayoutLMForSequenceClassification", _text(bbox=_bbox), **_TEXT),
    "M2M100ForConditionalGeneration": _make("M2M100Config", "M2M100ForConditionalGeneration",
                                            _seq2seq, **_BART),
    "MBartForCausalLM": _make("MBartConfig", "MBartForCausalLM", _text(), **_BART),
    "MBartForConditionalGeneration": _make("MBartConfig", "MBartForConditionalGeneration",
                                           _seq2seq, **_BART),
    "MT5ForConditionalGeneration": _make("MT5Config", "MT5ForConditionalGeneration", _seq2seq,
                                         **_T5),
    "MegatronBertForCausalLM": _make("MegatronBertConfig", "MegatronBertForCausalLM", _text(),
                                     **_TEXT, is_decoder=True),
    "MegatronBertForQuestionAnswering": _make(
        "MegatronBertConfig", "MegatronBertForQuestionAnswering", _text(), **_TEXT),
    "MobileBertForMaskedLM": _make("MobileBertConfig", "MobileBertForMaskedLM", _text(),
                                   **{**_TEXT, "hidden_size": 64}, embedding_size=16,
                                   intra_bottleneck_size=32, num_feedforward_networks=2),
    "MobileBertForQuestionAnswering": _make(
        "MobileBertConfig", "MobileBertForQuestionAnswering", _text(),
        **{**_TEXT, "hidden_size": 64}, embedding_size=16, intra_bottleneck_size=32,
        num_feedforward_networks=2),
    "OPTForCausalLM": _make("OPTConfig", "OPTForCausalLM", _text(), num_hidden_layers=2,
                            hidden_size=32, num_attention_heads=2, ffn_dim=64,
                            vocab_size=VOCAB, max_position_embeddings=64,
                            word_embed_proj_dim=32),
    "PLBartForCausalLM": _make("PLBartConfig", "PLBartForCausalLM", _text(), **_BART),
    "PLBartForConditionalGeneration": _make("PLBartConfig", "PLBartForConditionalGeneration",
                                            _seq2seq, **_BART),
    "PegasusForCausalLM": _make("PegasusConfig", "PegasusForCausalLM", _text(), **_BART),
    "PegasusForConditionalGeneration": _make("PegasusConfig", "PegasusForConditionalGeneration",
                                             _seq2seq, **_BART),
    "RobertaForCausalLM": _make("RobertaConfig", "RobertaForCausalLM", _text(), **_TEXT,
                                is_decoder=True, pad_token_id=1),
    "RobertaForQuestionAnswering": _make("RobertaConfig", "RobertaForQuestionAnswering", _text(),
                                         **_TEXT, pad_token_id=1),
    "T5ForConditionalGeneration": _make("T5Config", "T5ForConditionalGeneration", _seq2seq,
                                        **_T5),
    "T5Small": _make("T5Config", "T5Model", _seq2seq, **_T5),
    "TrOCRForCausalLM": _make("TrOCRConfig", "TrOCRForCausalLM", _text(), decoder_layers=2,
                              d_model=32, decoder_attention_heads=2, decoder_ffn_dim=64,
                              vocab_size=VOCAB, max_position_embeddings=64),
    "XGLMForCausalLM": _make("XGLMConfig", "XGLMForCausalLM", _text(), num_layers=2, d_model=32,
                             attention_heads=2, ffn_dim=64, vocab_size=VOCAB,
                             max_position_embeddings=64),
    "XLNetLMHeadModel": _make("XLNetConfig", "XLNetLMHeadModel", _text(), n_layer=2, d_model=32,
                              n_head=2, d_inner=64, vocab_size=VOCAB),
    "YituTechConvBert": _make("ConvBertConfig", "ConvBertForMaskedLM", _text(), **_TEXT,
                              embedding_size=32),
    "Llama": _make("LlamaConfig", "LlamaForCausalLM", _text(), **_LLAMA),
    "Gemma-2": _make("Gemma2Config", "Gemma2ForCausalLM", _text(), **_LLAMA),
    "Gemma-3": _make("Gemma3TextConfig", "Gemma3ForCausalLM", _text(), **_LLAMA),
    "Qwen3": _make("Qwen3Config", "Qwen3ForCausalLM", _text(), **_LLAMA),
    "Mistral": _make("MistralConfig", "MistralForCausalLM", _text(), **_LLAMA),
}

def _ghostnet():
    """GhostNet-style (not in transformers): ghost modules (a primary 1x1
    convolution and a cheap depthwise one over its output, concatenated),
    squeeze-excite with a hard-sigmoid gate, ReLU and hard-swish, BatchNorm,
    from plain torch modules."""
    from torch import nn

    def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
                act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)

    class Ghost(nn.Module):
        def __init__(self, cin: int, cout: int, relu: bool) -> None:
            super().__init__()
            self.out = cout
            init = (cout + 1) // 2
            act = nn.ReLU if relu else None
            self.primary = conv_bn(cin, init, 1, act=act)
            self.cheap = conv_bn(init, init, 3, groups=init, act=act)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.primary(x)
            return torch.cat([x, self.cheap(x)], dim=1)[:, :self.out]

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.reduce = nn.Conv2d(channels, max(channels // 4, 4), 1)
            self.expand = nn.Conv2d(max(channels // 4, 4), channels, 1)
            self.gate = nn.Hardsigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True))))
            return x * self.gate(scale)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, cout: int, stride: int, se: bool) -> None:
            super().__init__()
            self.ghost1 = Ghost(cin, mid, relu=True)
            self.down = conv_bn(mid, mid, 3, stride, groups=mid, act=None) if stride > 1 \
                else nn.Identity()
            self.se = SqueezeExcite(mid) if se else nn.Identity()
            self.ghost2 = Ghost(mid, cout, relu=False)
            self.shortcut = nn.Identity() if cin == cout and stride == 1 else nn.Sequential(
                conv_bn(cin, cin, 3, stride, groups=cin, act=None), conv_bn(cin, cout, 1,
                                                                             act=None))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ghost2(self.se(self.down(self.ghost1(x)))) + self.shortcut(x)

    class GhostNet(nn.Module):
        def __init__(self, classes: int = 4) -> None:
            super().__init__()
            self.stem = conv_bn(3, 8, 3, 2)
            self.blocks = nn.Sequential(Bottleneck(8, 8, 8, 1, se=False),
                                        Bottleneck(8, 24, 12, 2, se=True),
                                        Bottleneck(12, 36, 12, 1, se=True))
            self.head = conv_bn(12, 32, 1, act=nn.Hardswish)
            self.classifier = nn.Linear(32, classes)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            x = self.head(self.blocks(self.stem(pixel_values)))
            return self.classifier(torch.flatten(x.mean((2, 3)), 1))

    return GhostNet(), _image()()


VISION: dict[str, Callable] = {
    "ResNet": _make("ResNetConfig", "ResNetForImageClassification", _image(),
                    embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4),
    "ConvNeXt": _make("ConvNextConfig", "ConvNextForImageClassification", _image(),
                      hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=4),
    "ConvNeXtV2": _make("ConvNextV2Config", "ConvNextV2ForImageClassification", _image(),
                        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=4),
    "MobileNetV2": _make("MobileNetV2Config", "MobileNetV2ForImageClassification", _image(),
                         depth_multiplier=0.25, image_size=IMAGE, num_labels=4),
    "EfficientNet": _make("EfficientNetConfig", "EfficientNetForImageClassification", _image(),
                          width_coefficient=0.1, depth_coefficient=0.1, image_size=IMAGE,
                          hidden_dim=128, num_labels=4),
    "RegNet": _make("RegNetConfig", "RegNetForImageClassification", _image(),
                    embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8,
                    num_labels=4),
    "ViT": _make("ViTConfig", "ViTForImageClassification", _image(), **_VIT, num_labels=4),
    "DeiT": _make("DeiTConfig", "DeiTForImageClassification", _image(), **_VIT, num_labels=4),
    "BEiT": _make("BeitConfig", "BeitForImageClassification", _image(), **_VIT, num_labels=4),
    "Dinov2": _make("Dinov2Config", "Dinov2Model", _image(), **_VIT),
    "Swin": _make("SwinConfig", "SwinForImageClassification", _image(), image_size=IMAGE,
                  patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=3,
                  num_labels=4),
    "LeViT": _make("LevitConfig", "LevitForImageClassification", _image(64), image_size=64,
                   hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3], depths=[1, 1, 1],
                   key_dim=[8, 8, 8], num_labels=4),
    "MobileViT": _make("MobileViTConfig", "MobileViTForImageClassification", _image(),
                       image_size=IMAGE, hidden_sizes=[16, 24, 32],
                       neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48], num_labels=4),
    "GhostNet": _ghostnet,
}

# Not in the suite's list, for the tests: BERT at hidden 128, where its
# transposed weights reach the partitioner's view threshold and are saved
# for the backward as views (docs/torch/aot-autograd.md#saved-transposed-weight-is-a-view).
EXTRA: dict[str, Callable] = {
    "BertForMaskedLM-h128": _make("BertConfig", "BertForMaskedLM", _text(),
                                  **{**_TEXT, "hidden_size": 128, "intermediate_size": 256,
                                     "num_attention_heads": 4}),
}

SUITE: dict[str, Callable] = {**HF, **VISION}


def names(family: str | None = None) -> list[str]:
    if family == "hf":
        return list(HF)
    if family == "vision":
        return list(VISION)
    if family == "timm":
        return list(TIMM)
    return list(SUITE)


def build(name: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model called ``name`` (random weights from torch's seed) and its inputs."""
    return (SUITE.get(name) or EXTRA.get(name) or TIMM[name])()


def at_length(model: torch.nn.Module, inputs: dict[str, Any], length: int,
              seed: int) -> dict[str, Any] | None:
    """A batch like ``inputs`` with sequences of ``length``, padded as
    transformers' collators pad: the first sequence a third shorter
    (attention mask 0, the pad token). None for a model whose inputs are
    not token ids alone (images, encoder-decoder pairs, boxes)."""
    if set(inputs) != {"input_ids"}:
        return None
    pad = getattr(model.config, "pad_token_id", None) or 0
    ids = torch.randint(3, VOCAB, (BATCH, length),
                        generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, length - length // 3:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}


def main_output(out) -> torch.Tensor:
    """The tensor a benchmark's loss is taken of: logits, else the last
    hidden state, else the first tensor of the output."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state", "start_logits"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return next(v for v in (out.values() if hasattr(out, "values") else out)
                if isinstance(v, torch.Tensor))


def loss_of(out) -> torch.Tensor:
    return (main_output(out).float() ** 2).mean()
