#!/bin/bash
# Qwen3-14B fine-tuning: 26 positional arguments (${21}..${26} past the ninth), SFT=true reads iterations
# instead of tokens, LR_DECAY_ITERS from $(( )); the packing option only from the environment.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8; NNODES=1; NODE_RANK=0
elif [ $ENV = dlc ]; then
    NNODES=${WORLD_SIZE}; NODE_RANK=${RANK}; GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU}
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
LR=$5
MIN_LR=$6
SEQ_LEN=$7
PAD_LEN=$8
PR=$9
TP=${10}
PP=${11}
CP=${12}
ETP=${13}
EP=${14}
SP=${15}
DO=${16}
FL=${17}
SFT=${18}
AC=${19}
OPTIMIZER_OFFLOAD=${20}
SAVE_INTERVAL=${21}
DATASET_PATH=${22}
VALID_DATASET_PATH=${23}
PRETRAIN_CHECKPOINT_PATH=${24}
TRAIN_TOKENS=${25}
WARMUP_TOKENS=${26}

if [ $MODEL_SIZE = 14B ]; then
    NUM_LAYERS=40; HIDDEN_SIZE=5120; NUM_ATTENTION_HEADS=40; INTERMEDIATE_SIZE=17408; NUM_KEY_VALUE_HEADS=8
fi
if [ -z ${MP_SFT_PACKING} ]; then
    MP_SFT_PACKING=false
fi
if [ $SFT = true ]; then
    TRAIN_ITERS=${25}
    LR_WARMUP_ITERS=${26}
    LR_DECAY_ITERS=$(( ${TRAIN_ITERS} - ${LR_WARMUP_ITERS}))
    sft_options="--eod-mask-loss --calculate-per-token-loss --train-mode finetune"
else
    TRAIN_ITERS=$(( ${TRAIN_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
    LR_WARMUP_ITERS=$(( ${WARMUP_TOKENS} / ${GLOBAL_BATCH_SIZE} / ${SEQ_LEN} ))
    LR_DECAY_ITERS=${TRAIN_ITERS}
    sft_options="--train-mode pretrain"
fi
if [ ${MP_SFT_PACKING} = true ]; then
    packing_options="--reset-position-ids --no-create-attention-mask-in-dataloader"
else
    packing_options=""
fi
if [ $PR = bf16 ]; then pr_options="--bf16"; fi
if [ $DO = true ]; then do_option="--use-distributed-optimizer"; fi
if [ $SP = true ] && [ $TP -gt 1 ]; then sp_option="--sequence-parallel"; fi
if [ $AC = sel ]; then activation_checkpoint_options="--recompute-activations"; fi

run_cmd="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK pretrain_qwen.py
 --lr ${LR} --min-lr ${MIN_LR} --train-iters ${TRAIN_ITERS} --lr-warmup-iters ${LR_WARMUP_ITERS}
 --lr-decay-iters ${LR_DECAY_ITERS} --save-interval ${SAVE_INTERVAL} --load ${PRETRAIN_CHECKPOINT_PATH}
 --train-data-path ${DATASET_PATH} --valid-data-path ${VALID_DATASET_PATH} --max-padding-length ${PAD_LEN}
 --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} --num-layers ${NUM_LAYERS}
 --hidden-size ${HIDDEN_SIZE} --num-attention-heads ${NUM_ATTENTION_HEADS} --ffn-hidden-size ${INTERMEDIATE_SIZE}
 --seq-length ${SEQ_LEN} --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP}
 --context-parallel-size ${CP} --padded-vocab-size 151936 --swiglu --normalization RMSNorm
 --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --qk-layernorm
 --kv-channels 128 --group-query-attention --num-query-groups ${NUM_KEY_VALUE_HEADS}
 ${pr_options} ${do_option} ${sp_option} ${activation_checkpoint_options} ${sft_options} ${packing_options}"
eval ${run_cmd}
