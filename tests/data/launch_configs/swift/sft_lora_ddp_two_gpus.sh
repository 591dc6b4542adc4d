#!/bin/bash
# ms-swift's Trainer path without DeepSpeed (torch DDP over two GPUs), LoRA with its rank and alpha
# given and the target modules left at ms-swift's default (all-linear). Follows the public file named
# in the .expected.json (one GPU there; two here, through NPROC_PER_NODE).
CUDA_VISIBLE_DEVICES=0,1 \
NPROC_PER_NODE=2 \
swift sft \
    --model Qwen/Qwen2.5-7B-Instruct \
    --tuner_type lora \
    --dataset 'swift/self-cognition#1000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 2 \
    --learning_rate 1e-4 \
    --lora_rank 32 \
    --lora_alpha 64 \
    --gradient_accumulation_steps 8 \
    --max_length 2048 \
    --output_dir output
