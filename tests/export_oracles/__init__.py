"""Test-only oracles for ``partita export`` (issue 11 item 4: test parsers live in tests/).

Each module runs a target framework's OWN argument/config handling on an export:
``torchtitan_oracle`` (torchtitan 0.3.0's ConfigManager/tyro, Trainer.Config's checks,
ParallelDims mesh building), ``deepspeed_oracle`` (DeepSpeedConfig), ``megatron_oracle``
(Megatron-LM's argument definitions; see its docstring for how faithful it is)."""
