"""A nanotron training YAML (``torchrun --nproc_per_node N run_train.py --config-file x.yaml``,
huggingface/nanotron) read into a plan and a model.

The YAML is nanotron's ``Config`` dataclass tree; the fields and defaults below are those of
huggingface/nanotron@2411b02:

- ``parallelism`` (src/nanotron/config/parallelism_config.py ``ParallelismArgs``): ``dp``, ``tp``,
  ``pp`` (required), ``context_parallel_size`` 1, ``expert_parallel_size`` 1, ``recompute_layer``
  false (true: every decoder layer recomputed, recompute full), ``tp_mode`` ALL_REDUCE by default,
  REDUCE_SCATTER "activate[s] sequence parallelism" (its docstring), ``pp_engine`` absent:
  ``AllForwardAllBackwardPipelineEngine`` (all forwards, then all backwards: Partita's gpipe),
  ``1f1b``: one-forward-one-backward;
- the world size is ``tp * cp * dp * pp`` (src/nanotron/parallel/context.py l.26-28 asserts it):
  given by the YAML itself, and a ``--devices`` that differs is one line;
- ``tokens`` (config.py ``TokensArgs``): ``micro_batch_size``, ``batch_accumulation_per_replica``,
  ``sequence_length``; the global batch is ``micro_batch_size * batch_accumulation_per_replica * dp``
  (config.py ``global_batch_size``);
- ``optimizer.zero_stage``: 0, or 1 (helpers.py: ``zero_stage > 0`` builds ``ZeroDistributedOptimizer``,
  the optimizer states sharded over dp);
- ``model.dtype``: bfloat16 when absent (config.py ``ModelArgs.__post_init__``);
- ``model.model_config``: the Hugging Face Llama / Qwen2 config keys (``hidden_size``,
  ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
  ``vocab_size``, ``tie_word_embeddings``, ``attention_bias``, ...), read by Partita's config.json reader
  as a Llama config (``is_qwen2_config`` included: src/nanotron/models/qwen.py l.183 takes the QKV bias
  from ``attention_bias``).

Estimated as framework ``megatron`` (nanotron's tensor-parallel linears, sequence parallel and 1F1B
are Megatron's scheme; nanotron's own kernels are not modelled separately). Not read, in one line:
``expert_parallel_size`` > 1 and a ``moe_config`` model, a Mamba model.
"""
from __future__ import annotations

from typing import Any

from ..errors import PartitaError
from ..plan import Plan

#: the top-level sections only a nanotron config has together
MARKERS = ("parallelism", "tokens", "model", "optimizer")


def is_nanotron(text: str) -> bool:
    """Whether ``text`` is a nanotron YAML (its ``parallelism:`` / ``tokens:`` / ``model:`` sections)."""
    lines = {line.split(":", 1)[0] for line in text.splitlines() if line and not line[0].isspace()}
    return all(m in lines for m in MARKERS) and ("data_stages" in lines or "data" in lines) and "general" in lines


def _section(cfg: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    value = cfg.get(name)
    if not isinstance(value, dict):
        raise PartitaError(f"{path}: nanotron's '{name}:' section is missing or not a mapping")
    return value


def _whole(section: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PartitaError(f"{where}.{key} is {value!r}: a whole number is needed")
    return value


def plan_from_nanotron(cfg: dict[str, Any], path: str, devices: int | None) -> tuple[Plan, tuple[str, ...]]:
    """(the plan, what it runs that Partita does not model) of a parsed nanotron YAML."""
    par, tok = _section(cfg, "parallelism", path), _section(cfg, "tokens", path)
    opt, model = _section(cfg, "optimizer", path), _section(cfg, "model", path)
    dp, tp, pp = (_whole(par, k, f"{path}: parallelism") for k in ("dp", "tp", "pp"))
    cp = _whole(par, "context_parallel_size", f"{path}: parallelism", 1)
    if _whole(par, "expert_parallel_size", f"{path}: parallelism", 1) > 1:
        raise PartitaError(f"{path}: parallelism.expert_parallel_size > 1: nanotron's expert parallel (its own "
                           "ep x pp x dp x cp x tp grid) is not read; estimate it with partita estimate --ep")
    world = dp * tp * pp * cp
    if devices is not None and devices != world:
        raise PartitaError(f"{path} runs on dp*tp*pp*cp = {dp}*{tp}*{pp}*{cp} = {world} ranks (nanotron asserts "
                           f"WORLD_SIZE equals it); --devices {devices} disagrees")
    mbs = _whole(tok, "micro_batch_size", f"{path}: tokens")
    accum = _whole(tok, "batch_accumulation_per_replica", f"{path}: tokens")
    zero = _whole(opt, "zero_stage", f"{path}: optimizer", 0)
    if zero > 1:
        raise PartitaError(f"{path}: optimizer.zero_stage {zero}: nanotron has ZeRO 0 and 1")
    dtype = str(model.get("dtype") or "bfloat16")
    dtypes = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    if dtype not in dtypes:
        raise PartitaError(f"{path}: model.dtype {dtype!r} is not one of {', '.join(dtypes)}")
    engine = str(par.get("pp_engine") or "afab").lower()
    if engine not in ("afab", "1f1b"):
        raise PartitaError(f"{path}: parallelism.pp_engine {engine!r}: nanotron's engines are 1f1b and afab")
    mode = str(par.get("tp_mode") or "ALL_REDUCE").upper()
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, sp=mode == "REDUCE_SCATTER" and tp > 1, zero=zero, mbs=mbs,
                gbs=mbs * accum * dp, seq_len=_whole(tok, "sequence_length", f"{path}: tokens"),
                recompute="full" if par.get("recompute_layer") else "none", dtype=dtypes[dtype],
                schedule="gpipe" if engine == "afab" and pp > 1 else "1f1b", framework="megatron")
    return plan, ()


def model_from_nanotron(cfg: dict[str, Any], path: str) -> tuple[Any, str]:
    """(the model of ``model.model_config``, why none): a Llama / Qwen2 config read as its config.json."""
    from ..spec.hf_config import parse_hf_config
    mc = cfg.get("model", {}).get("model_config")
    if not isinstance(mc, dict):
        return None, "the YAML has no model.model_config: pass --model"
    if mc.get("moe_config") or "ssm_cfg" in mc or "d_state" in mc:
        return None, "model.model_config is a MoE or Mamba model nanotron builds its own way: pass --model"
    fields = {k: v for k, v in mc.items() if not k.startswith("_")}
    # Llama's shapes in both: nanotron's Qwen2 takes its QKV bias from attention_bias (models/qwen.py l.183),
    # not from the family (Hugging Face's Qwen2 always has one), so the llama reader's attention_bias is right
    fields["model_type"] = "llama"
    return parse_hf_config(fields, f"{path}: model.model_config", path.rsplit("/", 1)[-1]), ""
