#!/bin/bash
# Qwen2.5-32B full fine-tune launched by msrun on each of four nodes: the master address and this
# node's rank are the script's positional arguments (--args '10.0.0.1 0'); neither changes the
# layout, so the script reads without them too.
# Exercises: $1 $2, $(($A*$B)), msrun --worker_num / --local_worker_num, strings with \<newline>.
export CUDA_DEVICE_MAX_CONNECTIONS=1

NPUS_PER_NODE=8
MASTER_ADDR=$1
MASTER_PORT=6000
NNODES=4
NODE_RANK=$2
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

CKPT_LOAD_DIR="your model ckpt path"
CKPT_SAVE_DIR="your model save ckpt path"
DATA_PATH="your data path"
TOKENIZER_PATH="your tokenizer path"

TP=8
PP=2
SEQ_LENGTH=4096

DISTRIBUTED_ARGS="
    --local_worker_num $NPUS_PER_NODE \
    --worker_num $WORLD_SIZE \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT \
    --log_dir=msrun_log \
    --join=False
"

GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --sequence-parallel \
    --use-distributed-optimizer \
    --num-layers 64 \
    --hidden-size 5120 \
    --ffn-hidden-size 27648 \
    --num-attention-heads 40 \
    --group-query-attention \
    --num-query-groups 8 \
    --add-qkv-bias \
    --seq-length ${SEQ_LENGTH} \
    --max-position-embeddings 32768 \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 152064 \
    --rotary-base 1000000 \
    --disable-bias-linear \
    --swiglu \
    --use-fused-swiglu \
    --use-fused-rmsnorm \
    --normalization RMSNorm \
    --norm-epsilon 1e-6 \
    --position-embedding-type rope \
    --untie-embeddings-and-output-weights \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path ${TOKENIZER_PATH} \
    --lr 1.25e-6 \
    --train-iters 2000 \
    --bf16
"

TUNE_ARGS="
    --finetune \
    --stage sft \
    --is-instruction-dataset \
    --prompt-type qwen
"

msrun $DISTRIBUTED_ARGS posttrain_gpt.py \
    $GPT_ARGS \
    $TUNE_ARGS \
    --data-path $DATA_PATH \
    --load ${CKPT_LOAD_DIR} \
    --save ${CKPT_SAVE_DIR} \
    --ai-framework mindspore \
    | tee logs/tune_qwen25_32b_4k_full_ms.log
