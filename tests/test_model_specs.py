"""Parameter counts against published totals, and config.json parsing."""
import json

import pytest

from partita.errors import PartitaError
from partita.spec.hf_config import parse_hf_config
from partita.spec.load import load_model, preset_names

# (preset, published total params, published active params or None, tolerance). The
# published figures are the papers' rounded headline numbers (e.g. LLaMA's "65.2B" for
# 65.29e9 parameters), so the tolerance is the rounding of the figure, not the model:
# exact counts are checked by hand below for a dense, an MoE and a GPT-2 model.
PUBLISHED = [
    ("llama-7b", 6.7e9, None, 0.01), ("llama-13b", 13.0e9, None, 0.01), ("llama-65b", 65.2e9, None, 0.01),
    ("llama2-7b", 6.74e9, None, 0.01), ("llama2-13b", 13.0e9, None, 0.01), ("llama2-70b", 69.0e9, None, 0.01),
    ("llama3-8b", 8.03e9, None, 0.005), ("llama3-70b", 70.6e9, None, 0.005), ("llama3-405b", 405.9e9, None, 0.005),
    ("gpt3-175b", 174.6e9, None, 0.01), ("qwen2.5-72b", 72.7e9, None, 0.01),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01), ("mixtral-8x22b", 140.6e9, 39.1e9, 0.01),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.02), ("deepseek-v3", 671e9, 37e9, 0.02),
]


@pytest.mark.parametrize("name,total,active,tol", PUBLISHED)
def test_published_parameter_counts(name, total, active, tol):
    m = load_model(name)
    assert m.total_params() == pytest.approx(total, rel=tol)
    if active:
        assert m.active_params() == pytest.approx(active, rel=tol)


def test_llama3_8b_by_hand():
    # embedding + output 2*128256*4096; per layer: q,o 4096^2 each, k,v 4096*1024 each,
    # MLP 3*4096*14336, 2 norms; final norm
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    expected = 2 * 128256 * 4096 + 32 * per_layer + 4096
    assert load_model("llama3-8b").total_params() == expected


def test_mixtral_8x7b_by_hand():
    # untied embedding + output 2*32000*4096; per layer: q,o 4096^2 each, k,v 4096*1024
    # each (8 KV heads of 128), router 4096*8, 8 experts of 3*4096*14336 (2 active per
    # token), 2 norms; final norm
    h = 4096
    shared = 2 * h * h + 2 * h * 1024 + h * 8 + 2 * h
    m = load_model("mixtral-8x7b")
    assert m.total_params() == 2 * 32000 * h + 32 * (shared + 8 * 3 * h * 14336) + h
    assert m.active_params() == 2 * 32000 * h + 32 * (shared + 2 * 3 * h * 14336) + h


def test_gpt2_small_by_hand():
    # tied word embedding 50257*768 + learned positions 1024*768; per layer: 2 LayerNorms
    # (weight + bias), c_attn 768x2304 + bias, attention c_proj 768x768 + bias, c_fc
    # 768x3072 + bias, MLP c_proj 3072x768 + bias; final LayerNorm (= 124,439,808, the
    # count Hugging Face reports for gpt2)
    d = 768
    per_layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    gpt2 = parse_hf_config({"model_type": "gpt2", "n_embd": d, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                            "n_positions": 1024})
    assert gpt2.total_params() == 50257 * d + 1024 * d + 12 * per_layer + 2 * d == 124_439_808


def test_every_preset_loads_and_counts():
    for name in preset_names():
        m = load_model(name)
        assert m.total_params() >= m.active_params() > 0


def test_model_flops_per_token_is_6n_plus_attention():
    m = load_model("llama3-8b")
    n_matmul = m.total_params() - m.embedding_params() - (2 * m.layers + 1) * m.hidden
    attn = 3 * 32 * 2 * (2049 / 2) * 32 * (128 + 128)
    assert m.model_flops_per_token(2048) == pytest.approx(6 * n_matmul + attn)


HF_CONFIGS = {
    "llama": ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}, "llama3-8b"),
    "mixtral": ({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
                 "num_experts_per_tok": 2}, "mixtral-8x7b"),
    "deepseek_v3": ({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
                     "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                     "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                     "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                     "qk_nope_head_dim": 128, "v_head_dim": 128}, "deepseek-v3"),
    "qwen3_moe": ({"model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
                   "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                   "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8}, "qwen3-235b-a22b"),
}


@pytest.mark.parametrize("kind", sorted(HF_CONFIGS))
def test_hf_config_matches_preset(kind, tmp_path):
    cfg, preset = HF_CONFIGS[kind]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert m.total_params() == load_model(preset).total_params()
    assert m.active_params() == load_model(preset).active_params()


def test_gpt2_and_bloom_and_neox_parse():
    gpt2 = parse_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                            "n_positions": 1024})
    assert gpt2.total_params() == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small
    bloom = parse_hf_config({"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "n_head": 112,
                             "vocab_size": 250880})
    assert bloom.total_params() == pytest.approx(176.2e9, rel=0.01)  # BLOOM-176B
    neox = parse_hf_config({"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
                            "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432})
    assert neox.total_params() == pytest.approx(20.55e9, rel=0.01)  # GPT-NeoX-20B


def test_malformed_config_names_the_field(tmp_path):
    path = tmp_path / "config.json"
    good = dict(HF_CONFIGS["llama"][0])
    path.write_text(json.dumps({**good, "hidden_size": "big"}))
    with pytest.raises(PartitaError, match="'hidden_size' must be a positive integer"):
        load_model(str(path))
    del good["num_attention_heads"]
    path.write_text(json.dumps(good))
    with pytest.raises(PartitaError, match="missing field 'num_attention_heads'"):
        load_model(str(path))
    path.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(PartitaError, match="not supported"):
        load_model(str(path))
    path.write_text("{not json")
    with pytest.raises(PartitaError, match="not valid JSON"):
        load_model(str(path))


def test_unknown_model_lists_close_names():
    with pytest.raises(PartitaError, match="llama3-8b"):
        load_model("llama3-8")
