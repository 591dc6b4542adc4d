"""Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed) command lines: the fork's own flag spellings
read as what they run, translated to the Megatron-LM spellings :mod:`.megatron` reads.

The fork is recognised by ``--deepspeed`` / ``--deepspeed_config`` (Megatron-LM has neither).
Every fact below is from microsoft/Megatron-DeepSpeed@f4157be (line numbers of that commit):

- ZeRO is DeepSpeed's: the engine runs the stage of the ``--deepspeed_config`` JSON; the scripts
  write that JSON from the same variable they pass as ``--zero-stage`` (e.g.
  ``examples_deepspeed/universal_checkpointing/megatron_gpt/run_bf16.sh``), so ``--zero-stage`` is
  the stage. Without ``--zero-stage`` the JSON alone knows it (the MoE examples ``sed`` a template):
  read as 0, DeepSpeed's default when ``zero_optimization`` is absent, and said so in the output.
- ``--num-key-value-heads N`` (megatron/arguments.py l.623; l.444: absent = every head its own
  K/V) is Megatron-LM's ``--group-query-attention --num-query-groups N``.
- ``--ds-sequence-parallel-size N`` (l.974) is DeepSpeed-Ulysses: the sequence split N ways and
  the data-parallel size ``world / (tp * pp * N)`` (l.101-108): read as context parallel N, its
  all-to-all named (priced as Megatron's context parallel).
- ``--moe-expert-parallel-size`` (l.1159) is the expert-parallel degree; ``--num-experts`` takes a
  list (l.608, default ``[1]``: dense), ``--expert-interval`` (l.614, default 2) places the MoE
  layers at 1-based layer numbers divisible by it (megatron/model/transformer.py
  ``get_num_experts_per_layer``, l.1650-1661), ``--topk`` (l.612) is the router's k, default 1.
- **The ds_config JSON** (issue 33): where the script writes it (``cat <<EOT > $config_json``, ``sed``
  over a template; :func:`partita.imports.script.inline_ds_config` passes its content as the base64
  string DeepSpeed accepts for ``--deepspeed_config``), it is read (:func:`merge_ds_config`) and merged
  as the run merges it: the engine is built from the JSON alone (megatron/training.py
  ``_create_ds_config_dict`` l.73-87 and ``deepspeed.initialize(..., config=args.deepspeed_config_dict)``
  l.606-624), so the **ZeRO stage, offload and overlap_comm are the JSON's** (``offload_optimizer`` on
  the host: ``optimizer_offload`` 1, the inverse of Partita's DeepSpeed export; ``--zero-stage``, default
  1 at arguments.py l.1487, only selects Megatron's own optimizer statistics, training.py l.1056); the
  **global batch is the command line's** (training.py l.1252-1258 calls the engine's
  ``set_train_batch_size(dp x --micro-batch-size x micro-batches)`` every iteration; without
  ``--global-batch-size`` Megatron's default is micro x dp, arguments.py l.166): the JSON's
  ``train_batch_size`` is only checked as DeepSpeed checks it at start (``_batch_assertion``,
  runtime/config.py: a multiple of micro x accumulation) and named where it differs; the **micro-batch
  is both sides'**: Megatron's loader yields ``--micro-batch-size`` samples while the engine counts
  accumulation in the JSON's ``train_micro_batch_size_per_gpu``, so a difference is one line;
  the **dtype** is the JSON's where it enables one (the engine casts the parameters to its
  ``bf16``/``fp16``, runtime/engine.py ``_configure_distributed_model``), a disagreeing flag named;
  **recompute** stays the command line's (``--checkpoint-activations`` /
  ``--deepspeed-activation-checkpointing`` / ``--recompute-*`` turn it on; the JSON's ``activation_checkpointing`` only configures it, megatron/initialize.py l.186-190),
  its ``cpu_checkpointing`` named. ZeRO 2/3 under ``--deepspeed`` without ``--no-pipeline-parallel``
  is refused (that ``PipelineModule``'s engine asserts "ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism", deepspeed runtime/pipe/engine.py), as is ``--no-pipeline-parallel`` beside
  more than one stage (arguments.py l.94-96). bf16 at ZeRO 0 on the ``PipelineModule`` the fork builds under
  ``--deepspeed`` (pretrain_gpt.py l.51, unless ``--no-pipeline-parallel``) is DeepSpeed's
  ``BF16_Optimizer`` (runtime/engine.py ``_do_optimizer_sanity_check``): ZeRO-1, as
  :func:`partita.imports.deepspeed.plan_from_ds_config` reads it.
- The plan's framework is ``deepspeed``: the DeepSpeed engine runs ZeRO, and Partita's deepspeed entry
  (cost/frameworks.py) is Megatron-DeepSpeed's model code under it (reentrant checkpointing, no
  tensor-parallel overlap, the ZeRO all-gather after the step).
- Attention is the unfused ``CoreAttention`` (scores kept) unless one of ``--use-flash-attn``
  (``-v1``), ``--use-flash-attn-v2``, ``--use-flash-attn-triton``, ``--use-flash-attn-builder`` is
  given (megatron/model/transformer.py l.528-531).
- **Selective recompute** (``--recompute-granularity selective``, or ``--recompute-activations``,
  which sets it, megatron/arguments.py l.145-146) checkpoints the core attention as a module:
  microsoft/Megatron-DeepSpeed@f4157bea69f3df8c6cb66f2ebcda66ba03d1288e megatron/model/transformer.py
  l.624-629 sets ``checkpoint_core_attention`` for the unfused ``CoreAttention`` only, and l.864-869
  runs ``_checkpointed_attention_forward`` (l.642-663: ``tensor_parallel.checkpoint`` of
  ``self.core_attention``) - the same scheme as Megatron-Core's module-level ``core_attn``
  (Korthikanti et al. 2022 sec. 4.2), so the plan is ``recompute_modules=core_attn`` (priced by
  cost/frameworks.py ``selective_modules``). With flash attention (the ``core_attention_flash``
  branch, l.624-626 and l.850-862) or DeepSpeed-Ulysses (``dist_attn``, l.613-622 and l.845-847) the
  attribute is never set and nothing is checkpointed: the plan is ``recompute=none``, said in a note
  (:data:`SELECTIVE_NOOP`).
"""
from __future__ import annotations

import base64
import binascii
import json

from ..errors import PartitaError

#: flags of the fork whose memory/time Partita does not model -> what they change
NOT_MODELLED: dict[str, str] = {
    "--partition-activations": "checkpointed activations split over the tensor-parallel ranks (less activation "
                               "memory; megatron/arguments.py l.1526)",
    "--cpu-optimizer": "the optimizer step on the host (DeepSpeedCPUAdam; the ZeRO-Offload of the ds_config "
                       "is not read: more device memory than the run)",
    "--ds-sequence-parallel-size": "DeepSpeed-Ulysses: all-to-all of Q/K/V and output, priced as context parallel",
    "--ds-sequence-parallel-fpdt": "FPDT: attention over sequence chunks (--ds-sequence-parallel-fpdt-chunk-size), "
                                   "with --ds-sequence-parallel-fpdt-offloading chunks kept in host memory "
                                   "(less activation memory than estimated)",
}
#: noted only on a MoE model (the dense examples pass them too)
MOE_NOT_MODELLED: dict[str, str] = {
    "--moe-train-capacity-factor": "DeepSpeed-MoE's expert capacity (tokens over it dropped; estimated as routed "
                                   "without a capacity limit)",
}
#: selective recompute that the fork's model code does not run (module docstring)
SELECTIVE_NOOP = ("--recompute-granularity selective: Megatron-DeepSpeed checkpoints only the unfused CoreAttention "
                  "(megatron/model/transformer.py checkpoint_core_attention); with {} nothing is recomputed: read as "
                  "recompute none")
#: the fork's flags read here that take a value (an unknown value in a script is named, not guessed)
VALUE_FLAGS = ("--zero-stage", "--num-key-value-heads", "--ds-sequence-parallel-size", "--num-experts",
               "--moe-expert-parallel-size", "--expert-interval", "--topk", "--mlp-type")
#: the fork's spellings of flash attention (megatron/arguments.py l.927-936)
FLASH = ("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton",
         "--use-flash-attn-builder")
#: no --zero-stage under --deepspeed: the JSON's stage, not on the command line
ZERO_NOTE = ("--deepspeed_config without --zero-stage: the ZeRO stage is the config file's, read as 0 (DeepSpeed's "
             "default without zero_optimization)")


#: the flag the JSON's stage overrides, when it disagrees
ZERO_WINS = "--zero-stage {0}: the engine runs the --deepspeed_config JSON's ZeRO stage {1} (megatron/training.py " \
            "passes the JSON alone to deepspeed.initialize); read as {1}"


def ds_config(argv: list[str]) -> dict | None:
    """The JSON of ``--deepspeed_config`` when its value is the base64 string DeepSpeed also accepts
    (what :func:`partita.imports.script.inline_ds_config` puts there); None for a path. A file that is
    not a JSON object when read is one line."""
    words = _value(argv, "--deepspeed_config") or _value(argv, "--deepspeed-config")
    if not words or "/" in words[0] or words[0].endswith(".json"):
        return None
    try:
        text = base64.urlsafe_b64decode(words[0].encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        return None
    if not text.lstrip().startswith("{"):
        return None  # a path that happens to decode: not a config written here
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1].strip() if 0 < e.lineno <= len(text.splitlines()) else ""
        raise PartitaError(f"the --deepspeed_config file the script writes is not JSON when read (line {e.lineno}: "
                           f"{line[:60]!r}: a placeholder the script leaves, which DeepSpeed refuses too, or a "
                           "variable with no value, which --env sets)") from None
    if not isinstance(cfg, dict):
        raise PartitaError("the --deepspeed_config file the script writes must hold a JSON object")
    return cfg


def merge_ds_config(argv: list[str], cfg: dict) -> tuple[dict[str, object], list[str], list[str], list[str]]:
    """(plan fields, the switches to add to the command line, those to remove from it, notes) of
    the ds_config ``cfg`` merged with the command line as the run merges them (module docstring); a
    batch DeepSpeed refuses, or a micro-batch the JSON and the flag disagree on, is one line."""
    from .deepspeed import check_ds_config, ds_not_modelled, optimizer_offload
    where = "the --deepspeed_config JSON"
    check_ds_config(where, cfg)
    t, m, g = (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps"))
    if "auto" in (t, m, g):
        raise PartitaError(f"{where} has \"auto\" batch values: only the Hugging Face Trainer fills those; "
                           "Megatron-DeepSpeed passes the file as it is")
    micro = _int("--micro-batch-size", _value(argv, "--micro-batch-size"), 0) or None
    glob = _int("--global-batch-size", _value(argv, "--global-batch-size"), 0) or None
    if t is not None and m is not None and t % (m * (g or 1)):
        raise PartitaError(f"DeepSpeed refuses this batch: {where}'s train_batch_size {t} is not "
                           f"train_micro_batch_size_per_gpu {m} x gradient_accumulation_steps {g or 'g'} x "
                           "data-parallel ranks (runtime/config.py _batch_assertion)")
    if m is not None and micro is not None and m != micro:
        raise PartitaError(f"{where} sets train_micro_batch_size_per_gpu {m}; --micro-batch-size {micro} disagrees "
                           "(the engine counts its accumulation in the JSON's micro-batches, the loader yields the "
                           "flag's: the step's batch is neither)")
    notes: list[str] = []
    if t is not None and glob is not None and t != glob:
        notes.append(f"train_batch_size {t} of {where}: replaced by --global-batch-size {glob} (megatron/training.py "
                     "l.1252-1258 sets the engine's batch to dp x micro x micro-batches every iteration)")
    bf16 = (cfg.get("bf16") if cfg.get("bf16") is not None else cfg.get("bfloat16")) or {}
    on = [name for name, block in (("bf16", bf16), ("fp16", cfg.get("fp16") or {})) if block.get("enabled") is True]
    given = [name for name in ("bf16", "fp16") if f"--{name}" in argv]
    add: list[str] = []
    drop: list[str] = []
    if on and given != on[:1]:
        add.append(f"--{on[0]}")
        drop += [f"--{name}" for name in given if name != on[0]]
        if drop:
            notes.append(f"{drop[0]}: {where} enables {on[0]}, and the engine casts the parameters to it "
                         "(deepspeed runtime/engine.py _configure_distributed_model): read as " + on[0])
    zero = int((cfg.get("zero_optimization") or {}).get("stage", 0))
    if zero > 3:
        raise PartitaError(f"{where}: zero_optimization.stage {zero}: DeepSpeed's ZeRO stages are 0-3")
    if _value(argv, "--zero-stage") not in (None, [str(zero)]):
        notes.append(ZERO_WINS.format(_value(argv, "--zero-stage")[0], zero))
    dtype = on[0] if on else given[0] if given else "fp32"
    if zero == 0 and dtype == "bf16" and "--no-pipeline-parallel" not in argv:
        zero = 1  # BF16_Optimizer on the PipelineModule (module docstring)
    fields: dict[str, object] = {"zero": zero}
    fields["overlap_grad_reduce"] = bool((cfg.get("zero_optimization") or {}).get("overlap_comm", zero == 3))
    offload = optimizer_offload(cfg, where)  # ZeRO-Offload, shared with the ds_config reader
    if offload is not None:
        fields["optimizer_offload"] = offload
    notes += ds_not_modelled(cfg)
    return fields, add, drop, notes


def _selective(argv: list[str]) -> bool:
    """Whether the fork runs ``recompute_granularity == 'selective'``: ``--recompute-activations``
    sets it whatever ``--recompute-granularity`` says (megatron/arguments.py l.145-146), else the last
    ``--recompute-granularity``."""
    return "--recompute-activations" in argv or _value(argv, "--recompute-granularity") == ["selective"]


def is_megatron_deepspeed(argv: list[str]) -> bool:
    """Whether a Megatron command line is Megatron-DeepSpeed's (``--deepspeed``, ``--deepspeed_config``)."""
    return any(tok == "--deepspeed" or tok.split("=", 1)[0] in ("--deepspeed_config", "--deepspeed-config")
               for tok in argv)


def _value(argv: list[str], flag: str) -> list[str] | None:
    """The words after the last ``flag`` (``--flag=v`` or ``--flag v1 v2 ...`` up to the next flag), or None."""
    found = None
    for i, tok in enumerate(argv):
        if tok == flag:
            found = []
            for word in argv[i + 1:]:
                if word.startswith("--"):
                    break
                found.append(word)
        elif tok.startswith(flag + "="):
            found = [tok.split("=", 1)[1]]
    return found


def _int(flag: str, words: list[str] | None, default: int) -> int:
    """One whole number of a flag, or ``default`` where absent; a bad value is one line."""
    if words is None:
        return default
    if any("$" in w for w in words):
        raise PartitaError(f"{flag} is {' '.join(words)[:60]}, which has no value when the script is read "
                           "(an unset variable or positional argument: --args or --env sets it)")
    if len(words) != 1 or not words[0].isdigit():
        raise PartitaError(f"{flag} {' '.join(words)!r} must be one whole number")
    return int(words[0])


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` less ``flags`` and the words that are their values."""
    out: list[str] = []
    skipping = False
    for tok in argv:
        if tok.split("=", 1)[0] in flags:
            skipping = "=" not in tok
            continue
        if skipping and not tok.startswith("--"):
            continue
        skipping = False
        out.append(tok)
    return out


def _moe(argv: list[str]) -> list[str]:
    """Megatron-LM's MoE flags for the fork's ``--num-experts`` list, ``--expert-interval``, ``--topk``
    and ``--moe-expert-parallel-size`` (module docstring); [] for a dense model (``--num-experts 1``)."""
    words = _value(argv, "--num-experts") or ["1"]
    if not all(w.isdigit() for w in words):
        raise PartitaError(f"--num-experts {' '.join(words)!r} must be whole numbers")
    counts = {int(w) for w in words}
    ep = _int("--moe-expert-parallel-size", _value(argv, "--moe-expert-parallel-size"), 1)
    if counts == {1}:
        return ["--expert-model-parallel-size", str(ep)] if ep > 1 else []
    if len(counts) > 1:
        raise PartitaError(f"--num-experts {' '.join(words)}: a different expert count per MoE layer (Megatron-"
                           "DeepSpeed's pyramid MoE) is not modelled; Partita's MoE has one expert count")
    mlp_type = (_value(argv, "--mlp-type") or ["standard"])[0]
    if mlp_type != "standard":
        raise PartitaError(f"--mlp-type {mlp_type}: Megatron-DeepSpeed's residual MoE (a dense MLP beside the "
                           "experts) is not modelled")
    layers = _int("--num-layers", _value(argv, "--num-layers"), 0)
    interval = _int("--expert-interval", _value(argv, "--expert-interval"), 2)
    if not layers or not interval:
        raise PartitaError("--num-experts needs --num-layers and an --expert-interval of 1 or more")
    pattern = ",".join("1" if (i + 1) % interval == 0 else "0" for i in range(layers))
    return ["--num-experts", str(counts.pop()), "--moe-layer-freq", f"[{pattern}]",
            "--moe-router-topk", str(_int("--topk", _value(argv, "--topk"), 1)),
            "--expert-model-parallel-size", str(ep)]


def translate(argv: list[str]) -> tuple[list[str], dict[str, object], tuple[str, ...]]:
    """(the command line in Megatron-LM's spellings, the plan fields set beside it - the ZeRO stage and,
    with ``--enable-zbh1-pipeline`` (arguments.py l.856: "zero bubble pipeline parallelism", ZB-H1), the
    schedule ``zero-bubble``, which is ZB-H1 in cost/pipeline.py - and the fork's flags not modelled)."""
    zero_words = _value(argv, "--zero-stage")
    zero = _int("--zero-stage", zero_words, 0)
    if zero > 3:
        raise PartitaError(f"--zero-stage {zero}: DeepSpeed's ZeRO stages are 0-3")
    cfg = ds_config(argv)
    json_fields, json_flags, dropped, json_notes = merge_ds_config(argv, cfg) if cfg is not None else ({}, [], [], [])
    moe = _moe(argv)
    noted = {**NOT_MODELLED, **(MOE_NOT_MODELLED if moe and moe[0] == "--num-experts" else {})}
    notes = [f"{flag}: {what}" for flag, what in noted.items() if _value(argv, flag) is not None
             and not (flag == "--ds-sequence-parallel-size" and _value(argv, flag) == ["1"])]
    if zero_words is None and cfg is None:
        notes.append(ZERO_NOTE)
    if cfg is not None:  # the JSON is read: its offload is the plan's (merge_ds_config)
        notes = [n.replace("the ZeRO-Offload of the ds_config is not read: more device memory than the run",
                           "the optimizer memory is the --deepspeed_config JSON's offload_optimizer") for n in notes]
    notes += json_notes
    out = _without([tok for tok in argv if tok not in dropped] + json_flags,
                   ("--num-key-value-heads", "--ds-sequence-parallel-size", "--num-experts", "--topk",
                    "--moe-expert-parallel-size", "--expert-interval", "--mlp-type"))
    kv = _value(argv, "--num-key-value-heads")
    if kv is not None:
        out += ["--group-query-attention", "--num-query-groups", str(_int("--num-key-value-heads", kv, 1))]
    ulysses = _int("--ds-sequence-parallel-size", _value(argv, "--ds-sequence-parallel-size"), 1)
    if ulysses > 1:
        out += ["--context-parallel-size", str(ulysses)]
    out += moe
    flash = any(tok in FLASH for tok in argv)
    if not flash:
        out += ["--attention-backend", "unfused"]
    fields: dict[str, object] = {"zero": zero, **json_fields}
    if _selective(argv) and (flash or ulysses > 1):  # no checkpoint_core_attention (module docstring)
        fields.update(recompute="none", recompute_modules="", recompute_layers=0)
        notes.append(SELECTIVE_NOOP.format("flash attention" if flash else "DeepSpeed-Ulysses attention"))
    stages = _int("--pipeline-model-parallel-size", _value(argv, "--pipeline-model-parallel-size"), 1)
    if "--no-pipeline-parallel" in argv and stages > 1:
        raise PartitaError(f"--no-pipeline-parallel with --pipeline-model-parallel-size {stages}: Megatron-DeepSpeed "
                           "refuses it (megatron/arguments.py l.94-96: the size must be 1 without the pipeline)")
    if int(fields["zero"]) >= 2 and "--deepspeed" in argv and "--no-pipeline-parallel" not in argv:
        # pretrain_gpt.py l.51 (finetune_llama.py l.46) builds GPTModelPipe, a PipelineModule, under --deepspeed unless
        # --no-pipeline-parallel, even at one stage, and DeepSpeed's PipelineEngine asserts "ZeRO-2 and
        # ZeRO-3 are incompatible with pipeline parallelism" (deepspeed runtime/pipe/engine.py l.77)
        raise PartitaError(f"ZeRO stage {fields['zero']} under --deepspeed without --no-pipeline-parallel: the fork "
                           "builds a pipeline model and DeepSpeed's pipeline engine refuses ZeRO-2/3; add "
                           "--no-pipeline-parallel (with --pipeline-model-parallel-size 1) or use ZeRO 0-1")
    if "--enable-zbh1-pipeline" in argv and stages > 1:
        fields["schedule"] = "zero-bubble"
    return out, fields, tuple(notes)
