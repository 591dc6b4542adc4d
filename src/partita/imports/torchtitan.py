"""torchtitan ``--section.field`` overrides and TOML files read back into a :class:`~partita.plan.Plan`
(issue 14 item 2; moved out of ``export/`` by issue 32)."""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan

#: Size flags of torchtitan overrides: each a whole number from 1.
TITAN_SIZES = ("--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
               "--parallelism.context_parallel_degree", "--parallelism.expert_parallel_degree",
               "--parallelism.data_parallel_shard_degree", "--parallelism.data_parallel_replicate_degree",
               "--parallelism.pipeline_parallel_layers_per_stage", "--parallelism.pipeline_parallel_microbatch_size",
               "--training.local_batch_size", "--training.global_batch_size", "--training.seq_len")
#: torchtitan fields where -1 means "fill" (its defaults).
TITAN_FILL = ("--parallelism.data_parallel_shard_degree", "--training.global_batch_size")


def _titan_values(argv: list[str]) -> tuple[dict, str]:
    """{"section.field": value} of tyro overrides (``--x`` True, ``--no_x`` False) and the AC subcommand."""
    values: dict = {}
    ac = "selective"  # Trainer.Config's default
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("activation_checkpoint:") or tok.startswith("activation-checkpoint:"):
            ac = tok.split(":", 1)[1]
        elif tok.startswith("--") and "." in tok:
            section, field = tok[2:].split(".", 1)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--") and ":" not in argv[i + 1]:
                values[f"{section}.{field}"] = argv[i + 1]
                i += 1
            elif field.startswith("no_"):
                values[f"{section}.{field[3:]}"] = False
            else:
                values[f"{section}.{field}"] = True
        i += 1
    return values, ac


def plan_from_torchtitan(argv: list[str], layers: int | None = None) -> Plan:
    """The plan torchtitan 0.3.0 overrides describe (unset degrees at torchtitan's defaults of 1)."""
    v, ac = _titan_values(argv)
    num = lambda key, default=1: int(v.get(key, default))  # noqa: E731
    rep, shard = num("parallelism.data_parallel_replicate_degree"), num("parallelism.data_parallel_shard_degree")
    tp, pp = num("parallelism.tensor_parallel_degree"), num("parallelism.pipeline_parallel_degree")
    zero = 0 if shard == 1 else 3 if v.get("parallelism.fsdp_reshard_after_forward", "default") != "never" else 2
    vpp, split = 1, None
    lps = v.get("parallelism.pipeline_parallel_layers_per_stage")
    if pp > 1 and lps is not None:
        lps = int(lps)
        first, last = num("parallelism.pipeline_parallel_first_stage_less_layers", 1), \
            num("parallelism.pipeline_parallel_last_stage_less_layers", 1)
        if layers is None:
            raise PartitaError("torchtitan's pipeline_parallel_layers_per_stage needs the model's layer count")
        stages = -(-(layers + first + last) // lps)
        vpp = stages // pp
        if first or last:
            split = (lps - first,) + (lps,) * (stages - 2) + (lps - last,)
    dp = rep * shard
    mbs = num("parallelism.pipeline_parallel_microbatch_size") if pp > 1 else num("training.local_batch_size")
    param = v.get("training.mixed_precision_param", "bfloat16")
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=num("parallelism.context_parallel_degree"),
                ep=num("parallelism.expert_parallel_degree"), sp=bool(v.get("parallelism.enable_sequence_parallel", True)),
                zero=zero, mbs=mbs, gbs=num("training.global_batch_size", mbs * dp),
                seq_len=num("training.seq_len", 2048), recompute=ac, dtype="fp32" if param == "float32" else "bf16",
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", layer_split=split)


def toml_argv(path: str, text: str) -> list[str]:
    """A torchtitan TOML as ``--section.field value`` overrides (booleans as ``--x`` / ``--no_x``)."""
    import tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PartitaError(f"{path} is not valid TOML: {e}") from None
    except RecursionError:
        raise PartitaError(f"{path} is nested too deeply to be a torchtitan TOML") from None
    argv: list[str] = []
    for section, fields in data.items():
        if not isinstance(fields, dict):
            continue
        for field, value in fields.items():
            if section == "activation_checkpoint" and field == "mode":
                argv.append(f"activation_checkpoint:{value}")
            elif isinstance(value, bool):
                argv.append(f"--{section}.{'' if value else 'no_'}{field}")
            elif not isinstance(value, (dict, list)):
                argv += [f"--{section}.{field}", str(value)]
    return argv


def titan_plan(argv: list[str], world: int | None, layers: int | None) -> Plan:
    """torchtitan's plan; an unset or -1 ``data_parallel_shard_degree`` (torchtitan's default, -1) fills
    the world size left by the other degrees, as ``ParallelDims`` does, when the world size is known."""
    flag = "--parallelism.data_parallel_shard_degree"
    given = [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == flag]
    if given and given[-1] != "-1":
        return plan_from_torchtitan(argv, layers)
    if world is None:
        raise PartitaError(f"torchtitan's data_parallel_shard_degree is {'-1' if given else 'unset'} (fill the "
                           "devices): pass --devices")
    others = plan_from_torchtitan(argv + [flag, "1"], layers).world_size
    if others < 1:
        raise PartitaError(f"the parallel degrees multiply to {others}; each must be at least 1")
    if world % others:
        raise PartitaError(f"--devices {world} is not a multiple of the other degrees' product {others}")
    return plan_from_torchtitan(argv + [flag, str(world // others)], layers)
