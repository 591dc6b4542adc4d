"""Flags of a Megatron-LM / MindSpeed-LLM command line that change memory or step time but
that Partita's cost model does not express (issue 32 item 3): each is named in ``partita
import``'s output under "in the file, not modelled: ..." and in ``--json``, never dropped.

The list comes from the frameworks' own argument definitions (NVIDIA/Megatron-LM@d98e8a6
megatron/training/arguments.py; Ascend/MindSpeed@028de58 mindspeed/arguments.py and
mindspeed/features_manager/; Ascend/MindSpeed-LLM@c77308a) and from how often the example
launch scripts use them (docs/import_megatron.md has the survey). A flag Partita models is read into a
Plan field by :mod:`.megatron` instead and does not appear here.
"""
from __future__ import annotations

#: flag -> what it changes, as the framework runs it (why the estimate can differ).
NOT_MODELLED: dict[str, str] = {
    "--swap-optimizer": "optimizer states swapped to host memory between steps (less device memory)",
    "--swap-attention": "attention activations swapped to host memory (less device memory, more transfer time)",
    "--moe-fb-overlap": "one micro-batch's forward overlapped with another's backward (MoE all-to-all hidden); "
                        "modelled only with --schedules-method dualpipev (cost/pipeline.py), not with interleaving",
    "--schedules-method": "a pipeline schedule Partita does not model (dualpipev is modelled: schedule=dualpipev)",
    "--recompute-activation-function": "the MLP activation recomputed (less activation memory)",
    "--recompute-norm": "the norms recomputed (less activation memory)",
    # named here only where the plan carries no list; a list of modelled modules with selective
    # granularity is read into plan.recompute_modules and named with MODULES_TIME_NOTE (imports/megatron.py)
    "--recompute-modules": "the modules selective recompute reruns: core_attn, moe_act, layernorm, mla_up_proj, "
                           "mlp, moe and shared_experts are modelled (their memory and rerun forward, plan "
                           "recompute_modules; `partita plan` searches lists of them); a list naming another module "
                           "is estimated as Megatron-Core's default, core_attn, and with --recompute-granularity "
                           "full Megatron reads no list (megatron/training/arguments.py)",
    "--moe-zero-memory": "MoE activations freed and recomputed (less activation memory)",
    "--moe-alltoall-overlap-comm": "the MoE all-to-all overlapped with expert computation",
    # Megatron-Core's combined 1F1B (NVIDIA/Megatron-LM@d98e8a6 megatron/core/model_parallel_config.py
    # l.343-349, megatron/core/pipeline_parallel/combined_1f1b.py): estimated with the all-to-all exposed
    "--overlap-moe-expert-parallel-comm": "the expert-parallel all-to-all overlapped with another micro-batch's "
                                          "computation (Megatron-Core's combined 1F1B; estimated exposed)",
    "--delay-wgrad-compute": "the weight-gradient GEMMs delayed to overlap the expert-parallel all-to-all",
    "--mtp-num-layers": "multi-token-prediction layers after the decoder (more weights and activations)",
    "--optimizer-cpu-offload": "optimizer states offloaded to host memory",
    "--cpu-offloading": "activations offloaded to host memory",
    "--fine-grained-activation-offloading": "chosen activations offloaded to host memory",
    "--recompute-in-advance": "recompute started before the backward needs it",
    "--enable-recompute-layers-per-pp-rank": "the recompute layer count per pipeline rank, not per chunk",
    "--moe-layer-recompute": "MoE layers recomputed (less activation memory)",
    "--adaptive-recompute-device-swap": "recompute chosen at run time from device memory",
    "--use-ascend-coc": "tensor-parallel communication computed over (CoC)",
    "--no-pad-to-seq-lengths": "fine-tuning samples not padded to --seq-length (shorter sequences: less activation "
                               "memory and time than estimated at --seq-length)",
    "--variable-seq-lengths": "fine-tuning batches padded to their longest sample, not to --seq-length (shorter "
                              "sequences: less activation memory and time than estimated at --seq-length)",
    "--stage": "a preference or reward stage (DPO, ORM, PRM, ...): a frozen reference model and chosen + rejected "
               "sequences per sample (estimated as supervised training of the policy alone)",
    "--interleave-sliding-window": "every other layer attends within a sliding window (less attention time)",
    "--context-parallel-algo": "the context-parallel algorithm (Ulysses / ring / hybrid) changes communication",
}

#: flag -> values at which it is no departure from what Partita models.
MODELLED_VALUES: dict[str, tuple[str, ...]] = {"--context-parallel-algo": ("megatron_cp_algo",), "--stage": ("sft",),
                                               "--schedules-method": ("dualpipev",)}


def unmodelled(argv: list[str]) -> list[str]:
    """The flags of ``argv`` (in order, once each, with their value) that Partita does not
    model, as ``"--flag value: what it changes"``."""
    found: dict[str, str] = {}
    for i, tok in enumerate(argv):
        name, eq, inline = tok.partition("=")
        if name not in NOT_MODELLED or name in found:
            continue
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "")
        if value in MODELLED_VALUES.get(name, ()):
            continue
        found[name] = f"{name}{' ' + value if value else ''}: {NOT_MODELLED[name]}"
    if "--moe-fb-overlap" in found and _dualpipev(argv):
        del found["--moe-fb-overlap"]  # DualPipeV's overlapped pairs are the schedule Partita prices
    elif _dualpipev(argv) and _given(argv, "--num-experts"):
        found["--schedules-method"] = ("--schedules-method dualpipev without --moe-fb-overlap: Partita's dualpipev "
                                       "hides the MoE all-to-all in the overlapped forward/backward pairs, which "
                                       "MindSpeed does only with --moe-fb-overlap (the estimate is optimistic)")
    return list(found.values())


def _given(argv: list[str], flag: str) -> bool:
    """Whether ``argv`` sets ``flag``, as ``--flag value`` or ``--flag=value`` (argparse
    takes both; Megatron's parser has ``allow_abbrev=False``, so no shorter prefix counts)."""
    return any(tok == flag or tok.startswith(flag + "=") for tok in argv)


def _dualpipev(argv: list[str]) -> bool:
    """Whether ``argv`` asks for MindSpeed's DualPipeV schedule (``--schedules-method
    dualpipev`` or ``--schedules-method=dualpipev``)."""
    return any(tok == "--schedules-method=dualpipev"
               or (tok == "--schedules-method" and argv[i + 1:i + 2] == ["dualpipev"]) for i, tok in enumerate(argv))
