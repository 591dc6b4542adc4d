#!/bin/bash
# OpenRLHF DPO on one node with OpenRLHF's defaults for what the script leaves out: ZeRO-2
# (--ds.zero_stage), bf16 (--ds.param_dtype), micro-batch 8 and batch 128, max_len 2048; no gradient
# checkpointing flag, so none.
deepspeed --num_gpus 4 --module openrlhf.cli.train_dpo \
   --model.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture \
   --model.beta 0.1 \
   --data.dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \
   --data.chosen_key chosen \
   --data.rejected_key rejected
