# 4 x 80 GiB: full fine-tuning with ms-swift's Trainer and DeepSpeed ZeRO-2
nproc_per_node=4

CUDA_VISIBLE_DEVICES=0,1,2,3 \
NPROC_PER_NODE=$nproc_per_node \
swift sft \
    --model Qwen/Qwen2.5-7B \
    --tuner_type full \
    --dataset 'my-org/sft-zh#20000' \
              'my-org/sft-en#20000' \
    --torch_dtype bfloat16 \
    --num_train_epochs 2 \
    --per_device_train_batch_size 2 \
    --learning_rate 1e-5 \
    --gradient_accumulation_steps $(expr 32 / $nproc_per_node) \
    --eval_steps 500 \
    --save_steps 500 \
    --max_length 4096 \
    --output_dir output \
    --deepspeed zero2 \
    --dataloader_num_workers 4
