"""Loaders end to end: a tiny random Llama, saved as a Hugging Face folder and as a GGUF file,
loaded through our stack and checked against transformers' own forward pass and generation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core.engine_core import EngineCore  # noqa: E402
from engine.model.llama import rope_inv_freq  # noqa: E402
from engine.model.loader import load_model  # noqa: E402
from engine.model.loader_gguf import permute_qk  # noqa: E402
from engine.model.loader_hf import config_from_hf  # noqa: E402
from engine.model.runner import BatchEntry  # noqa: E402
from kernels.attention import AttentionMetadata  # noqa: E402
from tests import tiny_model  # noqa: E402

VOCAB = 300
BOS, EOS = 0, 1  # the tokenizer's two special tokens, in this order
TIGHT = 1e-4  # float32 against float32: only summation order differs
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CASES = {
    "untied": {"tie_word_embeddings": False},
    "tied": {"tie_word_embeddings": True},
    "llama3": {"tie_word_embeddings": False, "rope_scaling": LLAMA3_SCALING},
}
SENTENCES = tiny_model.SENTENCES
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def prompts() -> list[list[int]]:
    """Token-id prompts; the longest is past the 64 positions where llama3 scaling kicks in."""
    rng = np.random.default_rng(7)
    return [rng.integers(2, VOCAB, size=n).tolist() for n in (5, 23, 90)]


# -- building the tiny model --------------------------------------------------------------------


def train_tokenizer():
    tok = tiny_model.train_tokenizer(VOCAB)
    assert tok.get_vocab_size() == VOCAB
    assert tok.token_to_id("<s>") == BOS and tok.token_to_id("</s>") == EOS
    return tok


def build_hf_model(**overrides):
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        # wider than the default 0.02 so that greedy choices are not near-ties
        initializer_range=0.2,
        bos_token_id=BOS,
        eos_token_id=EOS,
        **overrides,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    # the norms start at exactly 1; make them random too so a mixed-up norm would show
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def hf_tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_case(request, tmp_path_factory, hf_tokenizer):
    """(folder, transformers model, case name) for each config in CASES."""
    name = request.param
    model = build_hf_model(**CASES[name])
    folder = tmp_path_factory.mktemp(f"hf-{name}")
    model.save_pretrained(str(folder), safe_serialization=True)
    hf_tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE})
    )
    return folder, model, name


# (id(model), ids) -> (model, logits); holding the model keeps its id from being reused
_HF_LOGITS: dict[tuple[int, tuple[int, ...]], tuple[object, torch.Tensor]] = {}


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits at every position (memoized: the models are never modified)."""
    key = (id(model), tuple(ids))
    if key not in _HF_LOGITS:
        _HF_LOGITS[key] = (model, model(input_ids=torch.tensor([ids])).logits[0].float())
    return _HF_LOGITS[key][1]


def engine_core(model_path: Path) -> EngineCore:
    return EngineCore(EngineConfig.from_kwargs(model=str(model_path), kv_tokens=512, max_running=4))


def engine_logits(core: EngineCore, ids: list[int]) -> torch.Tensor:
    """Logits at every position of one prompt, prefilled in one forward through the KV pool."""
    n = len(ids)
    row = core.req_table.alloc()
    slots = core.allocator.alloc(n)
    assert slots is not None
    core.req_table.write(row, 0, slots)
    meta = AttentionMetadata(
        req_to_token=core.req_table.table,
        req_rows=[row],
        prefix_lens=[0],
        extend_lens=[n],
        positions=torch.arange(n, dtype=torch.int64),
        out_slots=slots,
    )
    meta.validate()
    hidden = core.model.forward(torch.tensor(ids, dtype=torch.int64), meta, core.kv.layers)
    out = core.model.logits(hidden)
    core.allocator.free(slots)
    core.req_table.free(row)
    return out


@torch.no_grad()
def hf_greedy16(model, ids: list[int]) -> list[int]:
    """transformers' greedy continuation of 16 tokens, EOS ignored."""
    cfg = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=EOS
    )
    out = model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
        generation_config=cfg,
    )
    return out[0, len(ids) :].tolist()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


# -- Hugging Face folder --------------------------------------------------------------------------


def test_hf_config_is_read(hf_case) -> None:
    folder, model, name = hf_case
    cfg = load_model(str(folder)).config
    assert cfg.architecture == "llama"
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers) == (4, 2, 16, 2)
    assert cfg.tie_word_embeddings is (name == "tied")
    assert cfg.rms_eps == pytest.approx(1e-6)
    if name == "llama3":
        assert cfg.rope_scaling is not None
        assert cfg.rope_scaling["rope_type"] == "llama3"
        assert cfg.rope_scaling["factor"] == 8.0
        assert cfg.rope_scaling["original_max_position_embeddings"] == 64
    else:
        assert cfg.rope_scaling is None


def test_hf_config_reads_both_rope_spellings() -> None:
    """transformers 5 writes ``rope_parameters`` (theta inside); 4.x wrote ``rope_theta`` and
    ``rope_scaling`` at the top level. Both must give the same frequencies."""
    base = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
    }
    new = config_from_hf({**base, "rope_parameters": {**LLAMA3_SCALING, "rope_theta": 5e5}})
    old = config_from_hf({**base, "rope_theta": 5e5, "rope_scaling": dict(LLAMA3_SCALING)})
    assert new.rope_theta == old.rope_theta == 5e5
    torch.testing.assert_close(rope_inv_freq(new), rope_inv_freq(old), rtol=0, atol=0)
    plain = config_from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert plain.rope_scaling is None and plain.rope_theta == 5e5


def test_hf_full_sequence_logits_match_transformers(hf_case) -> None:
    folder, model, name = hf_case
    core = engine_core(folder)
    for ids in prompts():
        ours = engine_logits(core, ids)
        ref = hf_logits(model, ids)
        assert max_diff(ours, ref) < TIGHT, f"{name}: prompt of {len(ids)} tokens"
    core.allocator.check()
    assert core.allocator.used_size() == 0


def test_hf_chunked_and_batched_prefill_match_transformers(hf_case) -> None:
    """Through the runner: one prompt prefilled in three chunks (each chunk attends to the
    cached prefix), batched with a second prompt in the middle forward."""
    folder, model, name = hf_case
    core = engine_core(folder)
    short, _, long = prompts()
    ref_long, ref_short = hf_logits(model, long), hf_logits(model, short)
    row_long, row_short = core.req_table.alloc(), core.req_table.alloc()
    cuts = [0, 30, 70, len(long)]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        slots = core.allocator.alloc(b - a)
        core.req_table.write(row_long, a, slots)
        batch = [BatchEntry(row_long, a, long[a:b], slots)]
        if i == 1:
            s = core.allocator.alloc(len(short))
            core.req_table.write(row_short, 0, s)
            batch.append(BatchEntry(row_short, 0, short, s))
        logits = core.runner.forward(batch)
        assert max_diff(logits[0], ref_long[b - 1]) < TIGHT, f"{name}: chunk ending at {b}"
        if i == 1:
            assert max_diff(logits[1], ref_short[-1]) < TIGHT, f"{name}: batched short prompt"


def test_hf_greedy_generation_matches_transformers(hf_case) -> None:
    folder, model, name = hf_case
    llm = LLM(model=str(folder), kv_tokens=512, max_running=4)
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=16)
    outs = llm.generate(prompts(), params)
    for ids, out in zip(prompts(), outs):
        ref = hf_greedy16(model, ids)
        assert len(ref) == 16, "transformers stopped early; the comparison needs 16 tokens"
        assert out.finish_reason == "length"
        assert out.token_ids == ref, f"{name}: prompt of {len(ids)} tokens"


@pytest.mark.parametrize("how", ["linear", "mm", "packed"])
def test_hf_greedy_generation_matches_transformers_either_way(hf_case, how, monkeypatch) -> None:
    """Each way a float32 product can run (``engine.model.orient``, measured per CPU at load),
    fixed at every size: the tokens are transformers' either way."""
    monkeypatch.setenv("ATTEST_ORIENT", how)
    folder, model, name = hf_case
    llm = LLM(model=str(folder), kv_tokens=512, max_running=4)
    assert llm.core.model.orient.takes_mm(1) == (how == "mm")
    assert llm.core.model.orient.takes_packed(1) == (how == "packed")
    outs = llm.generate(prompts(), SamplingParams(temperature=0, ignore_eos=True, max_tokens=16))
    for ids, out in zip(prompts(), outs):
        assert out.token_ids == hf_greedy16(model, ids), f"{name} {how}: {len(ids)} tokens"


@pytest.mark.parametrize("hf_case", ["llama3"], indirect=True)
def test_llama3_scaling_is_what_makes_the_long_prompt_match(hf_case) -> None:
    """Guards the llama3 case against passing vacuously: with plain RoPE frequencies the same
    weights give clearly different logits on the long prompt."""
    folder, model, name = hf_case
    core = engine_core(folder)
    long = prompts()[-1]
    ref = hf_logits(model, long)
    assert max_diff(engine_logits(core, long), ref) < TIGHT
    core.model.inv_freq = rope_inv_freq(replace(core.model_config, rope_scaling=None))
    assert max_diff(engine_logits(core, long), ref) > 1e-2


# -- GGUF file ------------------------------------------------------------------------------------

_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's names, Q and K rows permuted as its converter does."""
    cfg = model.config
    sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output_norm.weight": sd["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        for hf_name, gg_name in _GGUF_LAYER_NAMES.items():
            w = sd[f"model.layers.{i}.{hf_name}.weight"]
            if gg_name == "attn_q":
                w = permute_qk(w, cfg.num_attention_heads)
            elif gg_name == "attn_k":
                w = permute_qk(w, cfg.num_key_value_heads)
            out[f"blk.{i}.{gg_name}.weight"] = w
    return out


def gguf_qtype(name: str, arr: np.ndarray, mode: str) -> GGMLQuantizationType:
    """mode "f32": everything F32. mode "q8_0": the norms and the embedding F32, every other
    matrix Q8_0."""
    if mode == "f32" or arr.ndim == 1 or name == "token_embd.weight":
        return GGMLQuantizationType.F32
    return GGMLQuantizationType.Q8_0


def write_gguf_model(path: Path, model, tokenizer, mode: str) -> Path:
    cfg = model.config
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-test-llama")
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    # transformers 5 keeps theta in rope_parameters; 4.x had it as an attribute
    theta = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    w.add_rope_freq_base(float(theta["rope_theta"]))
    # tokenizer: the same byte-level BPE as tokenizer.json, in llama.cpp's 'gpt2' form
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in (BOS, EOS) else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, arr in gguf_tensors(model).items():
        qtype = gguf_qtype(name, arr, mode)
        data = gguf.quants.quantize(arr, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype.name == "F32" else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def q8_0_round_trip(model, mode: str):
    """A copy of the transformers model whose weights went through the same quantization as the
    GGUF file's (Q8_0 blocks run along columns, so it commutes with the Q/K row permutation)."""
    if mode == "f32":
        return model
    import copy

    ref = copy.deepcopy(model)
    hf_to_gguf = {
        f"model.layers.{i}.{hf}.weight": f"blk.{i}.{gg}.weight"
        for i in range(model.config.num_hidden_layers)
        for hf, gg in _GGUF_LAYER_NAMES.items()
    }
    hf_to_gguf["lm_head.weight"] = "output.weight"
    with torch.no_grad():
        for name, p in ref.named_parameters():
            gg = hf_to_gguf.get(name)
            if gg is None:
                continue
            arr = p.detach().numpy()
            qtype = gguf_qtype(gg, arr, mode)
            deq = gguf.quants.dequantize(gguf.quants.quantize(arr, qtype), qtype)
            p.copy_(torch.from_numpy(np.ascontiguousarray(deq).reshape(arr.shape)))
    return ref


@pytest.fixture(scope="module", params=["untied-f32", "untied-q8_0", "tied-f32", "tied-q8_0"])
def gguf_case(request, tmp_path_factory, hf_tokenizer):
    tie, mode = request.param.split("-")
    model = build_hf_model(**CASES[tie])
    path = write_gguf_model(
        tmp_path_factory.mktemp(f"gguf-{request.param}") / "tiny.gguf", model, hf_tokenizer, mode
    )
    return path, model, tie, mode


def test_gguf_file_holds_the_intended_types(gguf_case) -> None:
    path, _, tie, mode = gguf_case
    types = {str(t.name): t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert ("output.weight" in types) is (tie == "untied")
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert types["token_embd.weight"] == "F32"
    assert types["blk.1.attn_q.weight"] == ("Q8_0" if mode == "q8_0" else "F32")
    assert types["blk.0.ffn_down.weight"] == ("Q8_0" if mode == "q8_0" else "F32")


def test_gguf_config_and_tokenizer(gguf_case, hf_tokenizer) -> None:
    path, model, tie, _ = gguf_case
    loaded = load_model(str(path))
    assert loaded.format == "gguf"
    cfg = loaded.config
    assert cfg.tie_word_embeddings is (tie == "tied")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers) == (VOCAB, 64, 2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.rms_eps == pytest.approx(1e-6)
    tok = loaded.tokenizer
    assert (tok.bos_id, tok.eos_id) == (BOS, EOS)
    for text in [*SENTENCES, "Fox, text; dog!"]:
        assert tok.encode(text, add_special_tokens=False) == hf_tokenizer.encode(text).ids
        assert tok.decode(hf_tokenizer.encode(text).ids) == text


def test_gguf_logits_match_transformers(gguf_case) -> None:
    """F32: tight agreement with the original model proves the Q/K permutation is undone.
    Q8_0: tight agreement with the model whose weights went through the same quantization,
    and loose agreement (the quantization error) with the original."""
    path, model, tie, mode = gguf_case
    core = engine_core(path)
    quantized_ref = q8_0_round_trip(model, mode)
    for ids in prompts():
        ours = engine_logits(core, ids)
        orig = hf_logits(model, ids)
        assert max_diff(ours, hf_logits(quantized_ref, ids)) < TIGHT, f"{tie}-{mode}"
        if mode == "f32":
            assert max_diff(ours, orig) < TIGHT
        else:
            # measured: relative RMS error about 0.03 for Q8_0; a wrong Q/K layout gives 0.6-1.2
            rel = float((ours - orig).pow(2).mean().sqrt() / orig.pow(2).mean().sqrt())
            assert 0 < rel < 0.1, f"{tie}-q8_0: relative RMS logit error {rel}"
            assert max_diff(ours, orig) < 0.15 * float(orig.abs().max())


# greedy tokens are only comparable with the unquantized model
@pytest.mark.parametrize("gguf_case", ["untied-f32", "tied-f32"], indirect=True)
def test_gguf_greedy_generation_matches_transformers(gguf_case) -> None:
    path, model, tie, mode = gguf_case
    llm = LLM(model=str(path), kv_tokens=512, max_running=4)
    ids = prompts()[1]
    out = llm.generate([ids], SamplingParams(temperature=0, ignore_eos=True, max_tokens=16))[0]
    assert out.token_ids == hf_greedy16(model, ids)


def test_folder_with_a_single_gguf_loads_it(tmp_path, gguf_case) -> None:
    path, _, _, _ = gguf_case
    (tmp_path / path.name).symlink_to(path)
    loaded = load_model(str(tmp_path))
    assert loaded.format == "gguf"
    assert loaded.path == str(tmp_path / path.name)


# -- error paths ----------------------------------------------------------------------------------


def test_unsupported_hf_architecture_is_named(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64, "vocab_size": 10})
    )
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(model=str(tmp_path), kv_tokens=64)


def test_unsupported_gguf_architecture_is_named(tmp_path) -> None:
    path = tmp_path / "gpt2.gguf"
    w = GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'gpt2'"):
        load_model(str(path))


def test_missing_path_is_file_not_found(tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(str(missing))
    with pytest.raises(FileNotFoundError):
        LLM(model=str(missing), kv_tokens=64)
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing.gguf"))
