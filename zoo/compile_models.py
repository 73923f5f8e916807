"""Small models for torch.compile: transformers' GPT-2, BERT, Llama, T5 at
tiny configs, and plain torch.nn ones; ``MODELS`` maps each name to its
builder, which returns ``(model, args)``. With the losses and outputs the
tests and tools compare against eager (``first_tensor``, ``loss_of``,
``train_steps``). Random weights from the caller's seed, no downloads.
``tests/children/backend_models.py`` runs them through
``backend="ltc_cache"`` in a child process.
"""

from __future__ import annotations

import torch

VOCAB = 96
BATCH, SEQ = 2, 8


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def gpt2():
    import transformers

    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config), (_ids(),)


def bert():
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    return transformers.BertModel(config), (_ids(),)


def llama():
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config), (_ids(),)


def llama_gqa():
    """Grouped-query attention: fewer key-value heads than query heads (one
    layer: the tests that train it start many processes)."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config), (_ids(),)


def gpt2_dropout():
    """GPT-2 with its dropouts on (0.1), as it trains by default (one layer:
    the tests that train it start many processes)."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
        eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), (_ids(),)


def t5():
    import transformers

    config = transformers.T5Config(num_layers=2, d_model=32, d_kv=16, num_heads=2, d_ff=64,
                                   vocab_size=VOCAB, dropout_rate=0.0)
    return transformers.T5EncoderModel(config), (_ids(),)


def transformer_encoder():
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    return (torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            (torch.randn(BATCH, SEQ, 32),))


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def cnn():
    return SmallCNN(), (torch.randn(BATCH, 3, 16, 16),)


class TokenMLP(torch.nn.Module):
    """Embedding, an MLP and a head over every position: its logits come
    from a ``linear`` on a 3-d input, which AOTAutograd returns as a view of
    an intermediate (``OutputType.unsafe_view_alias``), as a language
    model's head does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.hidden = torch.nn.Linear(32, 64)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.hidden(self.embed(ids))))


def token_mlp():
    return TokenMLP(), (_ids(),)


def mlp128():
    """128 Linear layers of width 64, each followed by a ReLU: a long graph
    of small ops."""
    layers = []
    for _ in range(128):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), (torch.randn(8, 64),)


class Net(torch.nn.Module):
    """Two Linear layers and a ReLU: the user's script of the settings tests."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Net2(Net):
    """Net with tanh for ReLU: another class, so another name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama, "llama_gqa": llama_gqa,
          "gpt2_dropout": gpt2_dropout, "t5": t5,
          "transformer_encoder": transformer_encoder, "cnn": cnn, "token_mlp": token_mlp,
          "mlp128": mlp128}


def first_tensor(out) -> torch.Tensor:
    """The main output of a model: logits, last hidden state, or the tensor."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return out[0]


def loss_of(out) -> torch.Tensor:
    value = first_tensor(out)
    return (value.float() ** 2).mean()


def train(model, args, steps: int) -> list[float]:
    return train_steps(model, args, steps, torch.optim.SGD(model.parameters(), lr=0.05))


def train_steps(model, args, steps: int, optimizer) -> list[float]:
    """``steps`` optimizer steps on the model's loss; the losses."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model(*args))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
