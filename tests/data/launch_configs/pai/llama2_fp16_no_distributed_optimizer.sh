#!/bin/bash
# Llama-2-13B in fp16 (PR=fp16 adds --apply-query-key-layer-scaling and exports NVTE_APPLY_QK_LAYER_SCALING)
# with DO=false: plain data parallelism, no distributed optimizer; the vocabulary padded from --vocab-size.
ENV=$1
if [ $ENV = dsw ]; then
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    GPUS_PER_NODE=8
    NNODES=1
    NODE_RANK=0
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
PR=$6
TP=$7
PP=$8
DO=$9
SP=${10}

if [ $MODEL_SIZE = 7B ]; then
    NUM_LAYERS=32; HIDDEN_SIZE=4096; NUM_ATTN_HEADS=32; INTERMEDIATE_SIZE=11008
elif [ $MODEL_SIZE = 13B ]; then
    NUM_LAYERS=40; HIDDEN_SIZE=5120; NUM_ATTN_HEADS=40; INTERMEDIATE_SIZE=13824
fi

if [ $PR = fp16 ]; then
    pr_options=" \
        --fp16 \
        --apply-query-key-layer-scaling"
    export NVTE_APPLY_QK_LAYER_SCALING=1
elif [ $PR = bf16 ]; then
    pr_options=" \
        --bf16"
fi

if [ $DO = true ]; then
    do_options=" \
        --use-distributed-optimizer"
elif [ $DO = false ]; then
    do_options=" \
        "
fi

if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_options=" \
        --sequence-parallel"
elif [ $SP = false ]; then
    sp_options=" \
        "
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK pretrain_llama.py \
    --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} --hidden-size ${HIDDEN_SIZE} --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} --seq-length ${SEQ_LEN} --max-position-embeddings ${SEQ_LEN} \
    --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} \
    --vocab-size 32000 --make-vocab-size-divisible-by 128 \
    --swiglu --normalization RMSNorm --use-rotary-position-embeddings --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    ${pr_options} ${do_options} ${sp_options}
