"""A tiny random Llama written as a Hugging Face folder, without transformers: for integration
tests of the engine in-process (scheduler, memory), where the numbers need not mean anything.
transformers can load the folder as it is (lm-eval's hf model compares against it)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 320
BOS, EOS = 0, 1
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model reads a tiny text, and then it writes another one.",
    "Tokens are the units the engine counts; the scheduler hands them out in batches.",
]


def train_tokenizer(vocab: int = VOCAB):
    """A byte-level BPE trained on a few sentences: ids 0 and 1 are <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    return tok


def make_tiny_model(
    folder: Path, seed: int = 0, layers: int = 2, max_position: int = 512, hidden: int = 64
) -> Path:
    """``hidden`` / 4 is the head size (16 by default; 128 gives 32, the least vLLM's CPU
    attention takes)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    inter, heads, kv_heads = 2 * hidden, 4, 2
    hd = hidden // heads
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    w = {
        "model.embed_tokens.weight": rnd(VOCAB, hidden),
        "model.norm.weight": 1 + rnd(hidden, scale=0.1),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": 1 + rnd(hidden, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + rnd(hidden, scale=0.1),
            p + "self_attn.q_proj.weight": rnd(heads * hd, hidden),
            p + "self_attn.k_proj.weight": rnd(kv_heads * hd, hidden),
            p + "self_attn.v_proj.weight": rnd(kv_heads * hd, hidden),
            p + "self_attn.o_proj.weight": rnd(hidden, heads * hd),
            p + "mlp.gate_proj.weight": rnd(inter, hidden),
            p + "mlp.up_proj.weight": rnd(inter, hidden),
            p + "mlp.down_proj.weight": rnd(hidden, inter),
        }
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",  # transformers reads the folder too (lm-eval's hf model)
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_position,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
    }
    (folder / "config.json").write_text(json.dumps(config))
    train_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}
        )  # tokenizer.json as it is
    )
    return folder
