#!/bin/bash
# ChatGLM3-6B at 64k tokens with context parallel 16 over two nodes listed in an array: the node
# count is the array's length, the node rank found by a loop over its indices comparing this
# host's address (a command's output: unknown without running it, and not needed for the layout).
# Exercises: A=('x' 'y'), ${A[0]}, ${#A[@]}, for i in "${!A[@]}", `cmd | awk`, break, msrun --worker_num.
export CUDA_DEVICE_MAX_CONNECTIONS=1

# Please enter ip of your server.
IPs=('IP1' 'IP2')
LOCAL_HOST=`hostname -I|awk -F " " '{print$1}'`
echo LOCAL_HOST $LOCAL_HOST

NPUS_PER_NODE=8
MASTER_ADDR=${IPs[0]}
MASTER_PORT=6010
NNODES=${#IPs[@]}
NODE_RANK=""
WORLD_SIZE=$((NPUS_PER_NODE*$NNODES))

for i in "${!IPs[@]}";
do
    if [ "$LOCAL_HOST" == "${IPs[$i]}" ];
    then
        echo "Node Rank : ${i}"
        NODE_RANK=$i
        break
    fi
done

CKPT_SAVE_DIR="your model save ckpt path"
DATA_PATH="your data path"
TOKENIZER_PATH="your tokenizer path"
CKPT_LOAD_DIR="your model ckpt path"

TP=1
PP=1
CP=16
MBS=1
GBS=64
SEQ_LEN=65536
CP_ALGO=hybrid_cp_algo

DISTRIBUTED_ARGS="
    --worker_num $WORLD_SIZE \
    --local_worker_num $NPUS_PER_NODE \
    --master_port $MASTER_PORT \
    --master_addr $MASTER_ADDR \
    --node_rank $NODE_RANK \
    --log_dir=msrun_log \
    --join=False \
    --cluster_time_out=300
"

GPT_ARGS="
    --use-mcore-models \
    --transformer-impl local \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --context-parallel-algo ${CP_ALGO} \
    --ulysses-degree-in-cp 8 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --num-layers 28 \
    --hidden-size 4096 \
    --ffn-hidden-size 13696 \
    --num-attention-heads 32 \
    --seq-length ${SEQ_LEN} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --max-position-embeddings ${SEQ_LEN} \
    --padded-vocab-size 65024 \
    --make-vocab-size-divisible-by 1 \
    --group-query-attention \
    --num-query-groups 2 \
    --disable-bias-linear \
    --add-qkv-bias \
    --position-embedding-type rope \
    --use-glm-rope \
    --rotary-percent 0.5 \
    --no-rope-fusion \
    --normalization RMSNorm \
    --use-fused-rmsnorm \
    --swiglu \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path ${TOKENIZER_PATH} \
    --untie-embeddings-and-output-weights \
    --recompute-granularity full \
    --recompute-method block \
    --recompute-num-layers 28 \
    --lr 1e-6 \
    --train-iters 2000 \
    --bf16
"

DATA_ARGS="
    --data-path $DATA_PATH \
    --split 949,50,1
"

OUTPUT_ARGS="
    --log-interval 1 \
    --save-interval 2000 \
    --eval-interval 2000 \
    --eval-iters 10
"

msrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $DATA_ARGS \
    $OUTPUT_ARGS \
    --distributed-backend nccl \
    --load ${CKPT_LOAD_DIR} \
    --save ${CKPT_SAVE_DIR} \
    --ai-framework mindspore \
    | tee logs/train_chatglm3_6b_64k.log
