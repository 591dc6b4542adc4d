# 8 x 24 GiB, LoRA; gradient_accumulation_steps left to ms-swift (16 / batch / world, at least 1)
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 \
NPROC_PER_NODE=8 \
swift sft \
    --model Qwen/Qwen2.5-14B-Instruct \
    --tuner_type lora \
    --lora_rank 16 \
    --target_modules all-linear \
    --dataset 'my-org/agent-traces#5000' \
    --per_device_train_batch_size 1 \
    --max_length 8192 \
    --deepspeed zero3 \
    --logging_steps 5
