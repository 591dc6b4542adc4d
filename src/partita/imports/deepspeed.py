"""DeepSpeed ``ds_config`` read back into a :class:`~partita.plan.Plan` (issue 14 item 2; moved out
of ``export/`` and made to read configs as DeepSpeed runs them by issue 32), with the type checks
of the keys it reads.

Facts from DeepSpeed (microsoft/DeepSpeed v0.19.8, the version in the project's environment;
the same logic since 0.9):

- **Batch** (``runtime/config.py`` ``DeepSpeedConfig._set_batch_related_parameters``): of
  ``train_batch_size`` (T), ``train_micro_batch_size_per_gpu`` (m) and
  ``gradient_accumulation_steps`` (g), the missing ones are derived with the config's world size
  W: T and m give g = T // m // W; T and g give m = T // W // g; m and g give T = m * g * W; T
  alone gives g = 1, m = T // W; m alone gives g = 1; then ``_batch_assertion`` requires
  T == m * g * W. W is the data-parallel size of the ``mpu`` (a ``PipelineModule``'s grid:
  world / stages) and otherwise every rank (``dist.get_world_size()``, AutoTP ranks included).
- **"auto"** is not DeepSpeed's: the Hugging Face Trainer fills it (transformers
  ``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.trainer_config_process``):
  ``train_micro_batch_size_per_gpu`` <- ``--per_device_train_batch_size``,
  ``gradient_accumulation_steps`` <- ``--gradient_accumulation_steps``, ``train_batch_size`` <-
  their product with the world size, ``bf16.enabled`` / ``fp16.enabled`` <- ``--bf16`` / ``--fp16``.
  LLaMA-Factory and ms-swift ship such configs; here Partita's own flags give those values
  (``--mbs``, ``--global-batch``, ``--dtype``), and one left unresolved is one line naming its flag.
- **bf16 key** (``runtime/precision_config.py`` ``get_bfloat16_config``): ``"bf16"``, else the old
  ``"bfloat16"`` (DeepSpeed-Chat writes the latter).
- **bf16 at ZeRO 0** (``runtime/engine.py`` ``_do_optimizer_sanity_check``): a ``PipelineModule``
  with bf16 and no ZeRO gets the ``BF16_Optimizer`` (``runtime/bf16_optimizer.py``), which keeps
  full fp32 gradients but partitions the fp32 master weights and optimizer states over the
  data-parallel group: ZeRO-1 in Partita's terms. Without a pipeline, bf16 at ZeRO 0 is
  ``DDP_BFLOAT16`` (the fp16 optimizer wrapper in bf16, nothing partitioned): ZeRO 0.
- **overlap_comm** (``runtime/zero/config.py`` ``overlap_comm_valid``): unset means on at ZeRO-3
  and off below.
- **offload_optimizer** (``runtime/zero/offload_config.py``): device cpu/nvme under ZeRO 1-3 keeps
  the optimizer states on the host, the share ``ratio`` (default 1.0; below 1 at ZeRO-3 only,
  ``runtime/zero/config.py`` ``offload_ratio_check``): the plan's ``optimizer_offload``
  (:func:`optimizer_offload`, which the Megatron-DeepSpeed reader shares).
"""
from __future__ import annotations

from typing import Any

from ..errors import PartitaError
from ..plan import Plan, flag_name

#: DeepSpeed config keys the importer reads, and their JSON types.
_DS_INTS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_DS_OBJECTS = ("pipeline", "tensor_parallel", "bf16", "bfloat16", "fp16", "zero_optimization")
#: The plan field whose flag fills each "auto" value (the Trainer argument that fills it in a real run).
_AUTO = {"train_micro_batch_size_per_gpu": ("mbs", "--per_device_train_batch_size"),
         "train_batch_size": ("gbs", "--per_device_train_batch_size x --gradient_accumulation_steps x world"),
         "gradient_accumulation_steps": ("gbs", "--gradient_accumulation_steps"),
         "bf16.enabled": ("dtype", "--bf16"), "fp16.enabled": ("dtype", "--fp16")}
#: Features that change memory or time that the cost model does not hold: (key path, is it on).
_NOT_MODELLED = (
    ("zero_optimization.offload_optimizer", lambda v: isinstance(v, dict) and v.get("device") in ("cpu", "nvme"),
     "optimizer states and step on the host (ZeRO-Offload)"),
    ("zero_optimization.offload_param", lambda v: isinstance(v, dict) and v.get("device") in ("cpu", "nvme"),
     "parameters on the host (ZeRO-Infinity)"),
    ("zero_optimization.zero_quantized_weights", lambda v: v is True, "int8 weight all-gather (ZeRO++ qwZ)"),
    ("zero_optimization.zero_quantized_gradients", lambda v: v is True, "int4 gradient reduce-scatter (ZeRO++ qgZ)"),
    ("zero_optimization.zero_hpz_partition_size", lambda v: isinstance(v, int) and v > 1,
     "secondary weight partition inside a node (ZeRO++ hpZ)"),
    ("activation_checkpointing.cpu_checkpointing", lambda v: v is True, "activation checkpoints on the host"),
    ("sequence_parallel_size", lambda v: isinstance(v, int) and v > 1, "Ulysses sequence parallelism"),
    ("compression_training", lambda v: isinstance(v, dict) and bool(v), "quantisation/pruning during training"),
    # read off DeepSpeedExamples@45b4b71 training/bing_bert and training/data_efficiency configs (issue 32)
    ("sparse_attention", lambda v: isinstance(v, dict) and bool(v),
     "block-sparse attention (less attention memory and time than dense attention)"),
    ("optimizer.type", lambda v: str(v).lower() in ("onebitadam", "zerooneadam", "onebitlamb"),
     "1-bit compressed gradient communication after the warm-up steps (less data-parallel traffic)"),
    ("progressive_layer_drop.enabled", lambda v: v is True, "layers skipped at random (less compute per step)"),
    ("data_efficiency.enabled", lambda v: v is True,
     "curriculum learning / random layerwise token dropping (fewer tokens in some steps or layers)"),
    ("curriculum_learning.enabled", lambda v: v is True, "the sequence length grows during training"),
)


class _Unresolved(list):
    """Each "auto" value no flag filled, named with the flag that supplies it (one error line, all of them)."""

    def need(self, key: str, path: str) -> None:
        field, trainer = _AUTO[key]
        self.append(f"{key} is \"auto\" (the Hugging Face Trainer's {trainer}): pass {flag_name(field)}")

    def message(self, path: str) -> str:
        return f"{path}: " + "; ".join(self)


def _get(cfg: dict, key: str) -> Any:
    """``cfg``'s value at a dotted key path (None when absent)."""
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def _dtype(cfg: dict, fill: dict[str, Any], unresolved: _Unresolved, path: str) -> str:
    """The training dtype: ``bf16`` (else the old ``bfloat16`` key, as DeepSpeed reads it) or
    ``fp16`` enabled; an "auto" one is the ``--dtype`` flag's value (a flag that contradicts an
    enabled key is one line)."""
    bf16 = cfg.get("bf16") if cfg.get("bf16") is not None else cfg.get("bfloat16")
    enabled = {"bf16": (bf16 or {}).get("enabled", False), "fp16": (cfg.get("fp16") or {}).get("enabled", False)}
    given = fill.get("dtype")
    on = [name for name, value in enabled.items() if value is True]
    if on:
        if given not in (None, on[0]):
            raise PartitaError(f"{path} enables {on[0]}; {flag_name('dtype')} {given} disagrees (drop the flag)")
        return on[0]
    auto = [name for name, value in enabled.items() if value == "auto"]
    if not auto:
        if given not in (None, "fp32"):
            raise PartitaError(f"{path} enables neither bf16 nor fp16 (fp32 training); {flag_name('dtype')} {given} "
                               "disagrees (drop the flag)")
        return "fp32"
    if given is None:
        unresolved.need(f"{auto[0]}.enabled", path)
        return "bf16"
    return given


def _batch_values(cfg: dict, dp: int, fill: dict[str, Any], unresolved: _Unresolved,
                  path: str) -> tuple[int | None, int | None, int | None]:
    """(train_batch_size, micro, accumulation) with every "auto" replaced as the Trainer would
    fill it, from ``--mbs`` and ``--global-batch`` (None: left for DeepSpeed to derive)."""
    t, m, g = (cfg.get(key) for key in _DS_INTS)
    if m is None and t in (None, "auto") and fill.get("mbs") is not None:
        m = "auto"  # set by the training script in code (DeepSpeed-Chat does): the flag gives it, as for "auto"
    if m == "auto":
        m = fill.get("mbs")
        if m is None:
            unresolved.need("train_micro_batch_size_per_gpu", path)
    elif m is not None and fill.get("mbs") not in (None, m):
        raise PartitaError(f"{path} sets train_micro_batch_size_per_gpu {m}; {flag_name('mbs')} {fill['mbs']} "
                           "disagrees (drop the flag)")
    auto = [key for key in ("train_batch_size", "gradient_accumulation_steps") if cfg.get(key) == "auto"
            or (cfg.get(key) is None and fill.get("gbs") is not None)]  # absent: set in code, as above
    t, g = (None if t == "auto" else t), (None if g == "auto" else g)
    if auto and t is None and g is None:  # the Trainer's accumulation steps: from the global batch
        gbs = fill.get("gbs")
        if gbs is None:
            unresolved.need(auto[-1], path)
        elif m is not None:
            if gbs % (m * dp):
                raise PartitaError(f"{flag_name('gbs')} {gbs} is not a multiple of micro-batch {m} x {dp} "
                                   "data-parallel ranks")
            g = gbs // (m * dp)
    return t, m, g


def _derive(t: int | None, m: int | None, g: int | None, world: int, path: str) -> tuple[int, int]:
    """(micro, accumulation) as DeepSpeed derives them on ``world`` ranks (module docstring)."""
    if t is not None and m is not None and g is None:
        g = t // m // world
    elif t is not None and g is not None and m is None:
        m = t // world // g
    elif t is None and m is not None:
        g = 1 if g is None else g
        t = m * g * world
    elif t is not None and m is None:
        g, m = 1, t // world
    elif t is None:
        raise PartitaError(f"{path}: neither train_batch_size nor train_micro_batch_size_per_gpu is set (DeepSpeed "
                           f"needs one): pass {flag_name('mbs')}")
    if t is not None and m is not None and 1 <= t < m * world:
        raise PartitaError(f"{path}: DeepSpeed refuses this batch on {world} data-parallel ranks: train_batch_size "
                           f"{t} is less than train_micro_batch_size_per_gpu {m} x {world} ranks (the file is for at "
                           f"most {max(1, t // m)} ranks: pass --devices)")
    if m < 1 or g < 1 or t != m * g * world:
        raise PartitaError(f"{path}: DeepSpeed refuses this batch: train_batch_size {t} is not "
                           f"train_micro_batch_size_per_gpu {m} x gradient_accumulation_steps {g} x {world} "
                           "data-parallel ranks")
    return m, g


#: ``offload_param`` below ZeRO-3: DeepSpeed accepts it and does nothing with it. Its config says "Valid only
#: with stage 3" (deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641 deepspeed/runtime/zero/config.py
#: l.157-161) and has no validator refusing it (l.382-393 check only overlap_comm and the optimizer offload
#: ratio); runtime/engine.py ``_configure_zero_optimizer`` passes ``offload_param_config`` only in its
#: ``zero_stage == ZeroStageEnum.weights`` branch (l.2434-2555), the stage 1/2 branch (l.2382-2432) never. So the
#: run keeps its parameters on the device, as the plan is priced; the note says so.
PARAM_OFFLOAD_BELOW_3 = ("zero_optimization.offload_param {} at ZeRO stage {}: DeepSpeed offloads parameters only at "
                         "stage 3 (runtime/engine.py _configure_zero_optimizer) and ignores it here; priced with the "
                         "parameters on the device, as it runs")


def ds_not_modelled(cfg: dict) -> tuple[str, ...]:
    """``"key value: what it changes"`` for each feature of the config the cost model does not hold
    (ZeRO-Offload of the optimizer is held where :func:`optimizer_offload` reads it: not listed)."""
    modelled = {"zero_optimization.offload_optimizer"} if _offloads(cfg) else set()
    stage = (cfg.get("zero_optimization") or {}).get("stage", 0)
    below_3 = isinstance(stage, int) and stage < 3
    return tuple(PARAM_OFFLOAD_BELOW_3.format(_short(_get(cfg, key)), stage)
                 if key == "zero_optimization.offload_param" and below_3 else
                 f"{key} {_short(_get(cfg, key))}: {REMOVED if key.split('.')[0] in REMOVED_KEYS else ''}{what}"[:240]
                 for key, on, what in _NOT_MODELLED if key not in modelled and on(_get(cfg, key)))


def _offloads(cfg: dict) -> bool:
    """Whether DeepSpeed runs the config's optimizer on the host: ``offload_optimizer.device`` cpu or
    nvme under a ZeRO stage (the offload lives in the ZeRO optimizers, runtime/zero/stage_1_and_2.py
    and stage3.py; ``offload_config.py``: "valid with stage 1, 2, and 3")."""
    zero_cfg = cfg.get("zero_optimization") or {}
    offload = zero_cfg.get("offload_optimizer")
    return (isinstance(offload, dict) and offload.get("device") in ("cpu", "nvme")
            and isinstance(zero_cfg.get("stage", 0), int) and zero_cfg.get("stage", 0) >= 1)


def optimizer_offload(cfg: dict, where: str) -> float | None:
    """The plan's ``optimizer_offload`` of a ds_config: ZeRO-Offload keeps the optimizer states (fp32
    master, Adam moments) and their step on the host, all of them unless ``ratio`` says which share
    (deepspeed runtime/zero/offload_config.py ``DeepSpeedZeroOffloadOptimizerConfig.ratio``,
    default 1.0, ZeRO-Offload++); None where nothing is offloaded. A ratio below 1 below ZeRO
    stage 3 is refused as DeepSpeed refuses it (runtime/zero/config.py ``offload_ratio_check``:
    "Partial offloading only supported for ZeRO Stage 3", whatever the device). Shared by every
    reader of a ds_config (this module, Megatron-DeepSpeed's --deepspeed_config JSON)."""
    zero_cfg = cfg.get("zero_optimization") or {}
    offload = zero_cfg.get("offload_optimizer")
    if offload is None:
        return None
    if not isinstance(offload, dict):
        raise PartitaError(f"{where}: zero_optimization.offload_optimizer must be a JSON object, got {offload!r}"[:200])
    ratio = offload.get("ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise PartitaError(f"{where}: zero_optimization.offload_optimizer.ratio must be a number from 0 to 1, "
                           f"got {ratio!r}"[:200])
    zero = zero_cfg.get("stage", 0)
    if ratio < 1 and zero != 3:
        raise PartitaError(f"{where}: zero_optimization.offload_optimizer.ratio {ratio:g} with ZeRO stage {zero}: "
                           "DeepSpeed refuses it (\"Partial offloading only supported for ZeRO Stage 3\", "
                           "runtime/zero/config.py); use stage 3 or drop the ratio")
    return float(ratio) if _offloads(cfg) else None


#: Top-level blocks DeepSpeed has removed: its config parser now refuses a file that holds one
#: (deepspeed 0.19.8 deepspeed/runtime/config.py ``_REMOVED_TOP_LEVEL_CONFIG_KEYS``, DeepSpeed issue
#: 8489); the public example configs written for older releases still carry them.
REMOVED_KEYS = frozenset({"sparse_attention", "progressive_layer_drop", "curriculum_learning", "compression_training"})
REMOVED = "removed from DeepSpeed (0.19 refuses the block; older releases run it); "


def _short(value: Any) -> str:
    """A config value as one short word: a section by its first setting (``{'mode': 'fixed', ...}``)."""
    if isinstance(value, dict) and value:
        first = next(iter(value))
        return "{" + f"{first!r}: {value[first]!r}" + (", ...}" if len(value) > 1 else "}")
    return repr(value)


def plan_from_ds_config(cfg: dict, world_size: int, seq_len: int = 2048, pp: int | None = None,
                        fill: dict[str, Any] | None = None, path: str = "ds_config") -> Plan:
    """The plan a DeepSpeed ``ds_config`` runs on ``world_size`` ranks; ``pp`` is what the model code
    passes to ``PipelineModule(num_stages=...)`` (defaults to ``pipeline.stages`` when numeric);
    ``fill`` holds the values the user gives for "auto" (plan field -> value: mbs, gbs, dtype; seq_len
    and pp, which a ds_config does not hold, may come this way too).
    Every "auto" no flag fills is named, with its flag, in the one :class:`PartitaError` raised."""
    fill = fill or {}
    seq_len, pp = fill.get("seq_len", seq_len), pp or fill.get("pp")
    stages = (cfg.get("pipeline") or {}).get("stages")
    pp = pp or (stages if isinstance(stages, int) else 1)
    tp = (cfg.get("tensor_parallel") or {}).get("autotp_size", 0) or 1
    if world_size % (tp * pp):
        raise PartitaError(f"world size {world_size} is not a multiple of tp*pp = {tp * pp}")
    dp = world_size // (tp * pp)
    unresolved = _Unresolved()
    dtype = _dtype(cfg, fill, unresolved, path)
    t, m, g = _batch_values(cfg, dp, fill, unresolved, path)
    if unresolved:
        raise PartitaError(unresolved.message(path))
    m, g = _derive(t, m, g, world_size // pp, path)  # the config's world: all ranks but a pipeline's stages
    if fill.get("gbs") not in (None, m * g * dp):
        raise PartitaError(f"{path} gives a global batch of {m * g * dp} ({m} x {g} accumulation steps x {dp} "
                           f"data-parallel ranks); {flag_name('gbs')} {fill['gbs']} disagrees (drop the flag)")
    zero_cfg = cfg.get("zero_optimization") or {}
    offload = optimizer_offload(cfg, path)
    zero = int(zero_cfg.get("stage", 0))
    if zero == 0 and pp > 1 and dtype == "bf16":
        zero = 1  # BF16_Optimizer: fp32 master weights and optimizer states partitioned (module docstring)
    return Plan(dp=dp, tp=tp, pp=pp, zero=zero, mbs=m, gbs=m * g * dp, seq_len=seq_len,
                recompute="full" if "activation_checkpointing" in cfg else "none", dtype=dtype,
                overlap_grad_reduce=bool(zero_cfg.get("overlap_comm", zero == 3)), framework="deepspeed",
                optimizer_offload=offload or 0.0)


def check_ds_config(path: str, cfg: dict) -> None:
    """The fields :func:`plan_from_ds_config` reads have DeepSpeed's types (else one line naming the key);
    "auto" is accepted where the Hugging Face Trainer fills it."""
    from ..plan import MAX_PLAN_SIZE
    for key in _DS_OBJECTS:
        if key in cfg and not isinstance(cfg[key], dict):
            raise PartitaError(f"{path}: {key} must be a JSON object, got {cfg[key]!r}"[:200])
    ints = [(key, cfg.get(key)) for key in _DS_INTS]
    ints += [("pipeline.stages", _get(cfg, "pipeline.stages")),
             ("tensor_parallel.autotp_size", _get(cfg, "tensor_parallel.autotp_size")),
             ("zero_optimization.stage", _get(cfg, "zero_optimization.stage"))]
    for key, value in ints:
        if value is None or (value == "auto" and key in _AUTO) or (key == "pipeline.stages" and isinstance(value, str)):
            continue
        low = 0 if key in ("zero_optimization.stage", "tensor_parallel.autotp_size") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_PLAN_SIZE:
            raise PartitaError(f"{path}: {key} must be a whole number from {low} to {MAX_PLAN_SIZE:,}, "
                               f"got {value!r}"[:200])
    for key in ("bf16", "bfloat16", "fp16"):
        enabled = _get(cfg, f"{key}.enabled")
        if enabled is not None and not isinstance(enabled, bool) and enabled != "auto":
            raise PartitaError(f"{path}: {key}.enabled must be true, false or \"auto\", got {enabled!r}"[:200])
