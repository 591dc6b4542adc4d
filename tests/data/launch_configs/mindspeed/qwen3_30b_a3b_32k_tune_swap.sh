#!/bin/bash
# Qwen3-30B-A3B 32K packed fine-tuning on two A3 nodes; NODE_RANK from the environment.
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=16
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=2
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

TP=4
PP=2
EP=8
CP=1
CP_TYPE='ulysses_cp_algo'
SEQ_LENGTH=32768

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

MOE_ARGS="
    --num-experts 128 \
    --expert-tensor-parallel-size 1 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 768 \
    --moe-alltoall-overlap-comm \
    --moe-grouped-gemm \
    --moe-layer-freq -1 \
    --first-k-dense-replace -1
"

OPTIMIZE_ARGS="
    --sequence-parallel \
    --use-flash-attn \
    --use-rotary-position-embeddings \
    --use-distributed-optimizer \
    --swap-optimizer \
    --swap-attention \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1
"

TRAIN_ARGS="
    --micro-batch-size 1 \
    --global-batch-size 32 \
    --bf16 \
    --seq-length ${SEQ_LENGTH}
"

MODEL_PARALLEL_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --expert-model-parallel-size ${EP} \
    --context-parallel-size ${CP} \
    --context-parallel-algo ${CP_TYPE}
"

GPT_ARGS="
    --use-mcore-models \
    --kv-channels 128 \
    --qk-layernorm \
    --max-position-embeddings ${SEQ_LENGTH} \
    --num-layers 48 \
    --hidden-size 2048 \
    --ffn-hidden-size 6144 \
    --num-attention-heads 32 \
    --tokenizer-type PretrainedFromHF \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 151936 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --group-query-attention \
    --num-query-groups 4
"

TUNE_ARGS="
    --finetune \
    --stage sft \
    --is-instruction-dataset \
    --reset-position-ids
"

torchrun $DISTRIBUTED_ARGS posttrain_gpt.py \
    $GPT_ARGS \
    $MOE_ARGS \
    $OPTIMIZE_ARGS \
    $TRAIN_ARGS \
    $MODEL_PARALLEL_ARGS \
    $TUNE_ARGS \
    --distributed-backend nccl
