#!/bin/bash
# One script for an A2 node (8 NPUs) or an A3 node (16 NPUs), chosen by a case on DEVICE_TYPE
# (--env DEVICE_TYPE=A3); on A3 the tensor-parallel size doubles. The virtual pipeline flag exists
# only when VPP is set (${VPP:+...}) and its layers per chunk are computed.
# Exercises: case "$X" in A2|910B) ... ;; A3) ... ;; esac, ${VPP:+word}, $((A / B / C)), export.
export CUDA_DEVICE_MAX_CONNECTIONS=1

DEVICE_TYPE=${DEVICE_TYPE:-A2}
case "$DEVICE_TYPE" in
    A2|910B)
        NPUS_PER_NODE=8
        TP=1
        ;;
    A3)
        NPUS_PER_NODE=16
        TP=2
        ;;
    *)
        echo "unknown DEVICE_TYPE $DEVICE_TYPE"
        exit 1
        ;;
esac

MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

NUM_LAYERS=36
PP=2
VPP=3
VPP_ARGS=${VPP:+"--num-layers-per-virtual-pipeline-stage $((NUM_LAYERS / PP / VPP))"}

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

GPT_ARGS="
    --use-mcore-models \
    --spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    ${VPP_ARGS} \
    --num-layers ${NUM_LAYERS} \
    --hidden-size 4096 \
    --ffn-hidden-size 12288 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --kv-channels 128 \
    --qk-layernorm \
    --seq-length 4096 \
    --max-position-embeddings 40960 \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --padded-vocab-size 151936 \
    --make-vocab-size-divisible-by 1 \
    --rotary-base 1000000 \
    --disable-bias-linear \
    --swiglu \
    --use-fused-swiglu \
    --use-fused-rmsnorm \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --untie-embeddings-and-output-weights \
    --use-distributed-optimizer \
    --bf16
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    --data-path "your data path" \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path "your tokenizer path" \
    --distributed-backend nccl \
    | tee logs/train_mcore_qwen3_8b.log
