"""DeepSpeed 0.19's own config class on a ``partita export --to deepspeed`` result.

``deepspeed.runtime.config.DeepSpeedConfig(cfg, mpu=...)`` is what ``deepspeed.initialize``
builds; its batch check (``train_batch_size == micro * accumulation * world_size``) uses the
data-parallel size from the ``mpu`` (runtime/config.py ``__init__``), and only when
``deepspeed.comm`` is initialised. So the oracle starts a fake torch process group of the plan's
world size, initialises deepspeed.comm on it, and passes an mpu reporting the plan's dp (none for
AutoTP, as ``deepspeed.initialize`` gets none from the Hugging Face Trainer: every rank counts).
``deepspeed.comm.torch.build_shm_op`` (a CPU shared-memory all-reduce kernel JIT-compiled at
init, irrelevant to config parsing) is replaced by ``None`` so the test needs no C++ compiler.
"""
from __future__ import annotations

import sys


class _Mpu:
    """What DeepSpeedConfig asks of Megatron's mpu: the data-parallel world size."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _init_comm(world_size: int) -> None:
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import deepspeed.comm as dist
    if tdist.is_initialized():
        tdist.destroy_process_group()
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    dist.comm.cdb = None
    dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False)


def load(cfg: dict, world_size: int, dp: int):
    """DeepSpeedConfig(cfg) as rank 0 of ``world_size`` ranks with ``dp`` data-parallel ranks."""
    from deepspeed.runtime.config import DeepSpeedConfig
    _init_comm(world_size)
    try:
        # AutoTP training passes no mpu (the Hugging Face Trainer does not): every rank counts;
        # a PipelineModule's grid counts the ranks of one stage
        stages = cfg.get("pipeline", {}).get("stages")
        autotp = world_size // (stages if isinstance(stages, int) else 1)
        return DeepSpeedConfig(cfg, mpu=_Mpu(autotp if cfg.get("tensor_parallel") else dp))
    finally:
        import torch.distributed as tdist
        tdist.destroy_process_group()
