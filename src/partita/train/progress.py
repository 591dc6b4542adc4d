"""Rank 0's screen output during training: a JSON object, a progress bar (rich) or a plain line
per step, and the eval lines between them. Its own module so the trainer does not know how
a step is shown."""
from __future__ import annotations

import json

from .config import TrainConfig


class StepPrinter:
    """Rank 0's screen output: a JSON object, a progress bar or a plain line per step."""

    def __init__(self, config: TrainConfig, enabled: bool, start: int):
        self.config, self.enabled, self.bar, self.task = config, enabled, None, None
        if enabled and config.progress and not config.json:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
            self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.task = self.bar.add_task("train", total=config.steps, completed=start, info="")
            self.bar.start()

    def step(self, record: dict, mem: float) -> None:
        if not self.enabled:
            return
        if self.config.json:
            print(json.dumps(record), flush=True)
        elif self.bar is not None:
            self.bar.update(self.task, completed=record["step"] + 1,
                            info=f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s  mem {mem:.2f} GiB"
                            + (f"  MFU {record['mfu']:.1%}" if "mfu" in record else ""))
        else:
            print(f"step {record['step']:5d}  loss {record['loss']:.6f}  lr {record['lr']:.2e}  "
                  f"{record['step_time_s'] * 1e3:8.1f} ms  {record['tokens_per_s']:,.0f} tokens/s", flush=True)

    def eval(self, record: dict) -> None:
        if not self.enabled:
            return
        if self.config.json:
            print(json.dumps(record), flush=True)
            return
        line = (f"eval  step {record['step']:5d}  loss {record['eval_loss']:.6f}  "
                f"perplexity {record['eval_perplexity']:.3f}")
        if self.bar is not None:
            self.bar.console.print(line)
        else:
            print(line, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
