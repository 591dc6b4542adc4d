#!/bin/bash
# Qwen2.5-7B with AC=offload: activations offloaded to the host (--cpu-offloading), and because tp > 1 the
# script keeps --tp-comm-overlap but drops the gradient/parameter overlap it sets by default (a branch that
# reassigns comm_overlap_option); TP_COMM_OVERLAP from a C-style ternary in $(( )).
ENV=$1
GPUS_PER_NODE=8
NNODES=1
BATCH_SIZE=$2
GLOBAL_BATCH_SIZE=$3
SEQ_LEN=$4
TP=$5
PP=$6
AC=$7
MP_AC_LAYERS=${MP_AC_LAYERS:-1}

TP_COMM_OVERLAP=$(( ($TP > 1) ? 1 : 0 ))
comm_overlap_option="\
    --overlap-grad-reduce \
    --overlap-param-gather"
if [ $TP_COMM_OVERLAP -eq 1 ]; then
    comm_overlap_option="\
        --tp-comm-overlap \
        --overlap-grad-reduce \
        --overlap-param-gather"
fi

if [ $AC = full ]; then
    activation_checkpoint_options="--recompute-method uniform --recompute-num-layers ${MP_AC_LAYERS} --recompute-granularity full"
elif [ $AC = sel ]; then
    activation_checkpoint_options="--recompute-activations"
elif [ $AC = offload ]; then
    activation_checkpoint_options=" \
        --cpu-offloading \
        --cpu-offloading-num-layers ${MP_AC_LAYERS}"
    if [ $TP_COMM_OVERLAP -eq 1 ]; then
        echo "Disable --overlap-grad-reduce and --overlap-param-gather when cpu offloading is on..."
        comm_overlap_option="\
            --tp-comm-overlap"
    else
        comm_overlap_option=""
    fi
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_qwen.py \
    --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers 28 --hidden-size 3584 --num-attention-heads 28 --ffn-hidden-size 18944 \
    --group-query-attention --num-query-groups 4 \
    --seq-length ${SEQ_LEN} --max-position-embeddings 131072 \
    --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} \
    --padded-vocab-size 152064 --swiglu --normalization RMSNorm --position-embedding-type rope \
    --add-qkv-bias --disable-bias-linear --untie-embeddings-and-output-weights \
    --bf16 --use-distributed-optimizer --sequence-parallel \
    ${activation_checkpoint_options} ${comm_overlap_option}
