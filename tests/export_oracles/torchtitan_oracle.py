"""torchtitan 0.3.0's own parsing and validation of a ``partita export --to torchtitan``.

What runs is torchtitan's code, not ours:

* ``torchtitan.config.ConfigManager().parse_args`` (tyro, with torchtitan's tyro rules) on the
  exported flags, exactly as ``python -m torchtitan.train`` does.
* ``Trainer.Config.__post_init__`` / ``_validate_cuda_graphs`` - read from the installed
  ``torchtitan/trainer.py`` and executed unchanged on the parsed sections.
* ``ParallelDims.from_config(...).build_mesh()`` on a fake process group of the plan's world
  size (``torchtitan/distributed/parallel_dims.py``), which is where an impossible expert mesh fails.

Why not ``--module llama3``: torchtitan is installed with ``--no-deps`` (its full dependency set
is ~0.5 GB) and the model registries import triton, torchdata and datasets at import time. So
``--module`` names this file, whose ``partita_probe`` config function returns a dataclass made of
torchtitan's own section classes (the fields the export writes) - ConfigManager accepts any
fully-qualified module with a config function (``config/manager.py`` ``_load_config``).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass, field

import torchtitan
from torchtitan.config import CompileConfig, ConfigManager, ParallelismConfig, TrainingConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, MemoryBudgetAC, SelectiveAC


def _trainer_config_methods() -> dict:
    """``Trainer.Config.__post_init__`` and ``_validate_cuda_graphs`` from the installed
    torchtitan/trainer.py, compiled unchanged (the module itself needs triton to import)."""
    path = inspect.getfile(torchtitan).replace("__init__.py", "trainer.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    config = next(n for n in trainer.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    wanted = {"__post_init__", "_validate_cuda_graphs"}
    funcs = [n for n in config.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in funcs} == wanted, "torchtitan's Trainer.Config changed"

    class FlexAttention:  # only reached when a model_spec is set; the probe has none
        class Config:
            pass

    namespace = {"SelectiveAC": SelectiveAC, "MemoryBudgetAC": MemoryBudgetAC, "FlexAttention": FlexAttention}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec"), namespace)
    return {name: namespace[name] for name in wanted}


_METHODS = _trainer_config_methods()


@dataclass(kw_only=True)
class ProbeConfig:
    """The Trainer.Config fields an export sets, with torchtitan's own types and defaults."""
    model_spec: None = None
    hf_assets_path: str = "./tests/assets/tokenizer"
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)
    compile: CompileConfig = field(default_factory=CompileConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    __post_init__ = _METHODS["__post_init__"]
    _validate_cuda_graphs = _METHODS["_validate_cuda_graphs"]


def partita_probe() -> ProbeConfig:
    return ProbeConfig()


def parse(flags: list[str]) -> ProbeConfig:
    """torchtitan's ConfigManager on ``flags`` (raises SystemExit/ValueError as torchtitan does)."""
    return ConfigManager().parse_args(["--module", __name__, "--config", "partita_probe", *flags])


def build_mesh(parallelism: ParallelismConfig, world_size: int) -> None:
    """torchtitan's ParallelDims + build_mesh on a fake process group of ``world_size`` ranks."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed.parallel_dims import ParallelDims
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        ParallelDims.from_config(parallelism, world_size).build_mesh()
    finally:
        dist.destroy_process_group()


def fields_of(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
