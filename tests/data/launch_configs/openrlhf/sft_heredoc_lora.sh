set -x
# OpenRLHF SFT with LoRA on two nodes of 8: the trainer's command line in a here-document read into a
# variable (read -r -d ''), launched by deepspeed with its node and GPU counts; ZeRO-3, fp16, Adam on the
# host, gradient checkpointing, packed samples.
read -r -d '' training_commands <<EOF
openrlhf.cli.train_sft \
   --data.max_len 4096 \
   --data.dataset Open-Orca/OpenOrca \
   --train.batch_size 128 \
   --train.micro_batch_size 4 \
   --model.model_name_or_path meta-llama/Meta-Llama-3-8B \
   --ds.zero_stage 3 \
   --ds.param_dtype fp16 \
   --ds.adam_offload \
   --ds.lora.rank 64 \
   --ds.lora.alpha 128 \
   --ds.packing_samples \
   --model.gradient_checkpointing_enable
EOF

if [[ ${1} != "slurm" ]]; then
    deepspeed --num_nodes 2 --num_gpus 8 --module $training_commands
fi
