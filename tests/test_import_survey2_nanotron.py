"""nanotron training YAMLs read as nanotron runs them (issue 33 survey, docs/import_megatron.md "Second
survey"). The YAML is trimmed from huggingface/nanotron@2411b02 examples/config_qwen.yaml; the expected
values are read by hand from that commit's src/nanotron/config/parallelism_config.py (tp_mode
REDUCE_SCATTER = sequence parallel; pp_engine absent = AllForwardAllBackward), config.py
(global_batch_size = micro_batch_size x batch_accumulation_per_replica x dp) and parallel/context.py (world =
tp x cp x dp x pp); the parameter count is summed by hand from the model_config's shapes. Before
partita/imports/nanotron.py every nanotron YAML was "not a recognised launch config"."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config

QWEN = """checkpoints:
  checkpoint_interval: 100000
data_stages:
- data:
    dataset:
      tokenizer_name: meta-llama/Llama-3.2-1B
  name: Stable Training Stage
general:
  project: debug
  seed: 42
model:
  dtype: bfloat16
  make_vocab_size_divisible_by: 1
  model_config:
    _attn_implementation: flash_attention_2
    attention_bias: false
    hidden_act: silu
    hidden_size: 2048
    intermediate_size: 11008
    is_qwen2_config: true
    max_position_embeddings: 4096
    moe_config: null
    num_attention_heads: 16
    num_hidden_layers: 36
    num_key_value_heads: 4
    rms_norm_eps: 1.0e-06
    rope_theta: 10000.0
    tie_word_embeddings: true
    vocab_size: 128256
optimizer:
  accumulate_grad_in_fp32: true
  clip_grad: 1.0
  zero_stage: 0
parallelism:
  context_parallel_size: 1
  dp: 2
  expert_parallel_size: 1
  pp: 1
  pp_engine: 1f1b
  recompute_layer: false
  tp: 2
  tp_linear_async_communication: true
  tp_mode: REDUCE_SCATTER
tokens:
  batch_accumulation_per_replica: 1
  micro_batch_size: 3
  sequence_length: 4096
  train_steps: 32000
"""


def _read(tmp_path: Path, text: str, **kw):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(str(path), **kw)


def test_layout_and_model_as_nanotron_builds_them(tmp_path):
    read = _read(tmp_path, QWEN)
    p, m = read.plan, read.model
    assert read.framework == "nanotron"
    assert (p.dp, p.tp, p.pp, p.cp, p.world_size) == (2, 2, 1, 1, 4)  # world = tp*cp*dp*pp
    assert p.sp and p.zero == 0 and p.schedule == "1f1b"  # REDUCE_SCATTER; zero_stage 0
    assert (p.mbs, p.gbs, p.seq_len, p.dtype, p.recompute) == (3, 6, 4096, "bf16", "none")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (36, 2048, 16, 4, 11008, 128256)
    assert not m.qkv_bias  # attention_bias false (nanotron models/qwen.py l.183), though HF's Qwen2 has one
    # by hand: tied embedding 128256*2048; per layer q,o 2*2048^2 + k,v 2*2048*512 + gate,up,down 3*2048*11008
    # + two RMSNorms 2*2048; final norm 2048
    layer = 2 * 2048 ** 2 + 2 * 2048 * 512 + 3 * 2048 * 11008 + 2 * 2048
    assert m.total_params() == 128256 * 2048 + 36 * layer + 2048


def test_defaults_and_accumulation(tmp_path):
    text = (QWEN.replace("  pp_engine: 1f1b\n", "").replace("  tp_mode: REDUCE_SCATTER\n", "")
            .replace("  recompute_layer: false", "  recompute_layer: true").replace("pp: 1", "pp: 2")
            .replace("batch_accumulation_per_replica: 1", "batch_accumulation_per_replica: 4")
            .replace("zero_stage: 0", "zero_stage: 1").replace("  dtype: bfloat16\n", ""))
    p = _read(tmp_path, text).plan
    assert (p.pp, p.world_size, p.schedule) == (2, 8, "gpipe")  # AllForwardAllBackward when pp_engine is absent
    assert not p.sp and p.recompute == "full" and p.zero == 1 and p.dtype == "bf16"  # ALL_REDUCE; bf16 default
    assert p.gbs == 3 * 4 * 2


@pytest.mark.parametrize("edit, kw, says", [
    (("", ""), {"devices": 8}, "--devices 8 disagrees"),
    (("expert_parallel_size: 1", "expert_parallel_size: 2"), {}, "expert_parallel_size"),
    (("zero_stage: 0", "zero_stage: 3"), {}, "ZeRO 0 and 1"),
    (("micro_batch_size: 3", "micro_batch_size: three"), {}, "tokens.micro_batch_size"),
])
def test_what_is_not_read_is_one_line(tmp_path, edit, kw, says):
    with pytest.raises(PartitaError) as e:
        _read(tmp_path, QWEN.replace(*edit) if edit[0] else QWEN, **kw)
    assert says in str(e.value) and "\n" not in str(e.value)
