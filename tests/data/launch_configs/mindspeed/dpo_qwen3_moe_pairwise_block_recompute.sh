#!/bin/bash
# A DPO run of a Qwen3-style MoE (--stage dpo, --is-pairwise-dataset) on two nodes of 16 NPUs (A3):
# the preference stage is named as not modelled; block recompute of 4 layers per stage.
# Follows the public script named in the .expected.json (smaller model: 24 layers, 64 experts).
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=16
NNODES=2
NODE_RANK=0
MASTER_ADDR=localhost
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))
PP=4
TP=2
CP=1
SEQ_LENGTH=8192

DISTRIBUTED_ARGS="--nproc_per_node $NPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port 6000"

MOE_ARGS="
    --num-experts 64 \
    --moe-router-topk 8 \
    --moe-intermediate-size 768 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall_seq \
    --moe-layer-freq -1 \
    --first-k-dense-replace -1 \
"
MEMORY_ARGS="
    --recompute-granularity full \
    --recompute-method block \
    --recompute-num-layers 4 \
"
MODEL_PARALLEL_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --context-parallel-algo megatron_cp_algo \
    --pad-to-multiple-of $((TP*CP)) \
"
GPT_ARGS="
    --use-mcore-models \
    --use-flash-attn \
    --sequence-parallel \
    --use-distributed-optimizer \
    --kv-channels 128 \
    --qk-layernorm \
    --num-layers 24 \
    --hidden-size 2048 \
    --ffn-hidden-size 6144 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 4 \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 151936 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --micro-batch-size 1 \
    --global-batch-size 32 \
    --seq-length ${SEQ_LENGTH} \
    --bf16
"
TUNE_ARGS="
    --finetune \
    --stage dpo \
    --dpo-loss-type sigmoid \
    --is-pairwise-dataset \
    --prompt-type qwen3
"
torchrun $DISTRIBUTED_ARGS posttrain_gpt.py $TUNE_ARGS $GPT_ARGS $MOE_ARGS $MEMORY_ARGS $MODEL_PARALLEL_ARGS \
    --data-path "your data path"
