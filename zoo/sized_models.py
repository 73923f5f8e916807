"""transformers' GPT-2, BERT, Llama and T5 at a named size: ``mid`` (hidden
256, 4 layers, 4 heads, feed-forward 1024, sequence 128, batch 2), where
compute counts, or ``tiny`` (the tests' configurations: hidden 32, 2
layers, sequence 8); and ``smallgpt`` (``zoo/small_gpt.py``) at its one
size. ``build(name, size)`` returns the model in ``eval()`` and its
token ids; random weights from seed 0, no downloads."""

from __future__ import annotations

SIZES = {
    # hidden, layers, heads, feed-forward, sequence, batch
    "tiny": (32, 2, 2, 64, 8, 2),
    "mid": (256, 4, 4, 1024, 128, 2),
}
VOCAB = 1000


def build(name: str, size: str):
    import torch
    import transformers

    if name == "smallgpt":  # one size of its own
        from zoo.small_gpt import small_gpt

        return small_gpt()
    transformers.logging.set_verbosity_error()
    hidden, layers, heads, ff, seq, batch = SIZES[size]
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, n_inner=ff, vocab_size=VOCAB,
            n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    elif name == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            intermediate_size=ff, vocab_size=VOCAB, max_position_embeddings=seq,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = transformers.BertModel(config)
    elif name == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            num_key_value_heads=heads, intermediate_size=ff, vocab_size=VOCAB,
            max_position_embeddings=seq)
        model = transformers.LlamaForCausalLM(config)
    elif name == "t5":
        config = transformers.T5Config(num_layers=layers, d_model=hidden,
                                       d_kv=hidden // heads, num_heads=heads, d_ff=ff,
                                       vocab_size=VOCAB, dropout_rate=0.0)
        model = transformers.T5EncoderModel(config)
    else:
        raise SystemExit(f"unknown model {name}")
    return model.eval(), (torch.randint(0, VOCAB, (batch, seq)),)
