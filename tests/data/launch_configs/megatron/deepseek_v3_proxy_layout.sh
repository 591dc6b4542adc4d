#!/bin/bash
# A 14-layer DeepSeek-V3 proxy on 8 nodes: the pipeline given by Megatron's layout grammar
# (2 virtual stages per rank, the MTP layer beside the loss).
GPUS_PER_NODE=8
NNODES=8

PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 4
    --pipeline-model-parallel-layout "Et*2|(tt|)*5t|tmL"
    --expert-model-parallel-size 16
    --context-parallel-size 1
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --sequence-parallel
)

MODEL_ARGS=(
    --use-mcore-models
    --use-flash-attn
    --disable-bias-linear
    --seq-length 4096
    --num-layers 14
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --kv-channels 128
    --max-position-embeddings 4096
    --position-embedding-type rope
    --make-vocab-size-divisible-by 3232
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --multi-latent-attention
    --mtp-num-layers 1
    --qk-layernorm
    --num-experts 64
    --moe-layer-freq "([0]*3+[1]*11)"
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048
    --moe-router-topk 8
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --tokenizer-type NullTokenizer
    --vocab-size 131072
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 512
    --bf16
    --recompute-granularity selective
    --recompute-modules mla_up_proj moe_act
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    "${PARALLEL_ARGS[@]}" "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}"
