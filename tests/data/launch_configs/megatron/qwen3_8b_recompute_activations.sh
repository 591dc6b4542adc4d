#!/bin/bash
# Qwen3-8B at 32K tokens on one node: tp 2 x cp 2, --recompute-activations, vocabulary padded for tp.
TP=${TP:-2}
PP=${PP:-1}
CP=${CP:-2}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
TRAINING_BATCH_SIZE=${TRAINING_BATCH_SIZE:-256}
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-32768}

MODEL_OPTIONS="\
  --seq-length $MAX_SEQ_LENGTH \
  --untie-embeddings-and-output-weights \
  --num-layers 36 \
  --hidden-size 4096 \
  --ffn-hidden-size 12288 \
  --num-attention-heads 32 \
  --kv-channels 128 \
  --max-position-embeddings 40960 \
  --group-query-attention \
  --num-query-groups 8 \
  --normalization RMSNorm \
  --qk-layernorm \
  --position-embedding-type rope \
  --swiglu \
  --disable-bias-linear \
  --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model Qwen/Qwen3-8B \
  --vocab-size 151936 \
  --make-vocab-size-divisible-by 128 \
  --recompute-activations \
  --bf16 \
  --tensor-model-parallel-size $TP \
  --pipeline-model-parallel-size $PP \
  --context-parallel-size $CP \
  --sequence-parallel \
  --micro-batch-size $MICRO_BATCH_SIZE \
  --global-batch-size $TRAINING_BATCH_SIZE \
  --use-distributed-optimizer"

torchrun --nproc-per-node 8 pretrain_gpt.py $MODEL_OPTIONS
