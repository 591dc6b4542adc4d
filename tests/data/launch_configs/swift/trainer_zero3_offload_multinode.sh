# 2 nodes x 8 GPUs, ZeRO-3 with CPU offload (node 0)
export NNODES=2
export NODE_RANK=0
export MASTER_ADDR=10.0.0.1
export NPROC_PER_NODE=8

swift sft \
    --model Qwen/Qwen2.5-72B-Instruct \
    --tuner_type full \
    --torch_dtype bfloat16 \
    --dataset 'my-org/sft-mix#50000' \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 4 \
    --max_length 2048 \
    --deepspeed zero3_offload \
    --save_only_model true
