"""One training process, started by torchrun: ``python -m partita.train.worker RUN_DIR``.

The run directory holds ``plan.json`` and ``train.json`` (the
:class:`~partita.train.config.TrainConfig`), both written by the launcher. Rank 0 prints
one line (or JSON object) per step and appends it to the run's metrics file;
checkpoints are written every ``checkpoint_every`` steps and the newest complete one is
resumed with ``resume`` or automatically after an elastic restart.

Read :class:`Trainer` top to bottom: setup (plan, model, data, metrics), resume, the
step loop (:meth:`Trainer.run_step`: fault points, batch, step, log, save), finish. What
it writes down lives beside it: the metrics file (:mod:`.metrics`), the screen output
(:mod:`.progress`) and, under ``partita profile``, traces and summaries (:mod:`.profiling`).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..calibrate.binding import bind_cores
from ..calibrate.busy_clock import critical_busy_s, mark, since
from ..errors import PartitaError
from ..models.registry import family_of, resolve_model
from ..plan import Plan
from ..runtime.device import backend_for, detect_device_type
from ..runtime.parallelize import parallelize
from . import faults
from .config import PLAN_FILE, TrainConfig
from .data import PackedTokens, dp_shard, synthetic_batch, tokenize_to_file, tokenizer_used
from .evaluate import TensorBoard, compile_blocks, evaluate, perplexity
from .guard import StepGuard
from .metrics import Metrics, peak_memory_gib
from .ownership import stop_requested, watch_launcher
from .profiling import dp_wire, mark_process_groups, start_counter, start_profiler, write_profile_summary
from .progress import StepPrinter
from .replan import describe_change, replan
from .schedule import lr_at

USAGE = "usage: python -m partita.train.worker RUN_DIR  (a run directory written by partita train)"


def init_distributed(device_type: str, timeout_s: int) -> None:
    """Process group per elastic attempt: a PrefixStore per restart keeps a new attempt from
    reading the previous attempt's peer addresses (docs/reference/pytorch_cpu.md F15)."""
    timeout = timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and "MASTER_ADDR" in os.environ:
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
        dist.init_process_group(backend_for(device_type), store=dist.PrefixStore(f"attempt_{attempt}", base),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group(backend_for(device_type), timeout=timeout)


class NonFiniteStep(PartitaError):
    """A step's loss or gradient norm was not finite and ``--skip-nonfinite`` is used up."""


def check_resumable(meta: dict, config: TrainConfig, plan: Plan, path: Path) -> None:
    """Refuse (one line) a checkpoint of another model or another global batch: the data of
    step s is sequences [s * gbs, (s + 1) * gbs) and the schedule counts steps, so under
    another global batch neither the data position nor the schedule would continue.
    The launcher makes the same check before any process starts (``check_resume``)."""
    problem = resume_problem(meta, config.model, plan.gbs)
    if problem:
        raise PartitaError(f"cannot resume from {path}: {problem}")


def resume_problem(meta: dict, model: str, gbs: int) -> str | None:
    """Why a checkpoint with ``meta`` cannot continue a run of ``model`` with global batch ``gbs``."""
    theirs = meta.get("model")
    if theirs is not None and theirs != model:
        return f"it holds model {theirs}, this run trains {model} (start a new run or pass --model {theirs})"
    their_gbs = (meta.get("plan") or {}).get("gbs")
    if their_gbs is not None and their_gbs != gbs:
        return (f"it was trained with global batch {their_gbs}, this run uses {gbs}: the data position "
                f"(step x global batch) and the schedule would not continue; resume with gbs={their_gbs} "
                "in --plan (or no --plan) or start a new run")
    return None


def make_optimizer_factory(config: TrainConfig):
    """The optimizer ``parallelize`` builds over each shard's parameters."""
    if config.optimizer == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=config.lr, momentum=config.momentum,
                                          weight_decay=config.weight_decay or 0.0)
    return lambda ps: torch.optim.AdamW(ps, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                                        weight_decay=0.01 if config.weight_decay is None else config.weight_decay,
                                        foreach=False)


class Trainer:
    """One rank's training run: ``Trainer(...).run()`` does setup, resume, steps, finish."""

    def __init__(self, config: TrainConfig, plan: Plan, run_dir: Path, device_type: str, rank: int, world: int):
        self.config, self.run_dir, self.rank, self.world = config, run_dir, rank, world
        self.ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        self.wants_resume = bool(self.ckpt_dir) and (config.resume or restarted)
        self.plan = self._fit_plan(plan)
        self.entry = resolve_model(config.model)
        # on the meta device: parallelize gives each rank storage for its shards only and fills
        # them from the seed or, for a weights directory (self.hf_dir), from its safetensors
        model, self.hf_dir = self.entry.build(config.seed, meta=True), self.entry.weights_dir
        if self.plan.finetune == "lora":  # PEFT's LoRA layers before the plan is applied (runtime/lora.py)
            from ..runtime.lora import inject_lora
            inject_lora(model, self.plan, config.adapter)
        self.vocab = family_of(model).vocab(model)
        self.hf_config = family_of(model).hf_config(model)
        self.pm = parallelize(model, self.plan, make_optimizer=make_optimizer_factory(config),
                              device_type=device_type, max_grad_norm=config.max_grad_norm or None)
        del model
        self.counter = start_counter(self.pm, config.profile_dir)
        self._load_hf_weights()
        if config.compile:
            self.log(f"partita: torch.compile: {compile_blocks(self.pm)} block(s) compiled")
        self.guard = StepGuard(self.pm, rank)
        self.dataset = self._load_data(config.data)
        self.eval_set = self._load_data(config.eval_data, self._train_tokenizer())
        self.metrics = Metrics(run_dir / "metrics.jsonl", rank == 0, note=self.log)
        self.tb = TensorBoard(config.tensorboard, rank == 0)
        self.schedule = {"kind": config.lr_schedule, "lr": config.lr, "warmup_steps": config.warmup_steps,
                         "total_steps": config.steps, "min_lr": config.min_lr}
        self.checkpoint_every = config.checkpoint_every or 0
        self.start = 0
        self.times: list[float] = []
        self.last_loss = float("nan")
        self.skipped: list[int] = []
        self.saved_step = -1
        self.last_eval: tuple[int, float] | None = None

    def log(self, msg: str) -> None:
        """A ``partita: ...`` line on stderr from rank 0 (the launcher forwards it)."""
        if self.rank == 0:
            print(msg, file=sys.stderr, flush=True)

    # -- setup ---------------------------------------------------------------------------
    def _fit_plan(self, plan: Plan) -> Plan:
        """An elastic restart may come back on another world size: re-plan for it."""
        if plan.world_size == self.world:
            return plan
        new = replan(plan, self.world)
        self.log(f"partita: world size {plan.world_size} -> {self.world}: re-planned keeping global batch "
                 f"{plan.gbs}: {describe_change(plan, new)}")
        return new

    def _load_hf_weights(self) -> None:
        """--model DIR with safetensors: each rank reads the slices of the shards it holds."""
        if not self.hf_dir:
            return
        from ..models.hf_weights import load_hf_weights
        t0 = time.perf_counter()
        read = load_hf_weights(self.pm, self.hf_dir, bool(getattr(self.hf_config, "tie_word_embeddings", False)))
        self.log(f"partita: loaded the weights of {self.hf_dir} ({read:,} values on rank 0, its shards only) "
                 f"in {time.perf_counter() - t0:.1f} s")

    def tokenizer(self) -> str | None:
        """--tokenizer, else the --model directory's tokenizer.json."""
        if self.config.tokenizer:
            return self.config.tokenizer
        return self.entry.tokenizer()

    def _train_tokenizer(self) -> str | None:
        """The tokenizer of the training data, for the held-out text."""
        if not self.config.data:
            return self.tokenizer()
        return tokenizer_used(self.config.data, self.vocab, str(self.run_dir), self.tokenizer())

    def _load_data(self, data: str | None, tokenizer: str | None = None):
        """Text data tokenized once (rank 0 writes the token file, the others read its path);
        chat / instruction JSONL formatted, masked and packed once (train/sft_data.py)."""
        if not data:
            return None
        from .sft_data import is_sft_file
        if is_sft_file(data):
            return self._load_sft(data)
        tokenizer = tokenizer or self.tokenizer()
        if self.rank == 0:
            tokenize_to_file(data, self.vocab, str(self.run_dir), tokenizer)
        dist.barrier()
        token_file = tokenize_to_file(data, self.vocab, str(self.run_dir), tokenizer)  # cached
        return PackedTokens(token_file, self.plan.seq_len, self.config.seed, self.vocab)

    def _load_sft(self, data: str):
        """Packed SFT rows (rank 0 encodes, every rank loads the cached arrays)."""
        from .sft_data import SftRows, encode_to_file
        if self.hf_config is None:
            raise PartitaError(f"--data {data} is chat / instruction data: it trains Hugging Face models (--model DIR "
                               "with a chat template), whose attention masks packed samples from their position ids")
        tokenizer = self.config.tokenizer or self.entry.source_dir
        if self.rank == 0:
            encode_to_file(data, tokenizer, self.plan.seq_len, str(self.run_dir), self.vocab)
        dist.barrier()
        rows = SftRows.load(encode_to_file(data, tokenizer, self.plan.seq_len, str(self.run_dir), self.vocab),
                            self.config.seed)
        if rows.truncated:
            self.log(f"partita: note: {rows.truncated} sample(s) of {data} are longer than seq_len "
                     f"{self.plan.seq_len} and were truncated")
        return rows

    def resume(self) -> None:
        """Load the newest checkpoint that passes verification (damaged ones are renamed
        ``corrupt-*`` with a warning line each; none good: ``PartitaError``) and rewind the
        metrics file to it."""
        from ..runtime.checkpoint_resume import resume_checkpoint
        if not self.wants_resume:
            return
        found = resume_checkpoint(self.pm, self.ckpt_dir, report=self.log)
        if found is None:
            return
        step_done, path, meta = found
        check_resumable(meta, self.config, self.plan, path)
        self.saved_step = step_done
        self.start = step_done + 1
        dropped = self.metrics.rewind(step_done)
        self._restore_state(meta)
        self.log(f"partita: resumed from {path} (step {step_done}, data position {meta.get('data_position')} "
                 f"sequences, saved under {Plan.from_dict(meta['plan']).summary()})")
        self.metrics.write({"event": "resume", "from_step": step_done, "checkpoint": str(path),
                            "discarded_steps": dropped, "plan": self.plan.summary()})

    def _restore_state(self, meta: dict) -> None:
        """The RNG streams, the LR schedule and the checkpoint cadence the checkpoint was
        saved with (a schedule flag that differs is named: the checkpoint's wins, so a
        resumed run has the lr an uninterrupted one would have had)."""
        rng = meta.get("rng_state")
        if rng:
            torch.set_rng_state(torch.tensor(rng, dtype=torch.uint8))
        device_rng = meta.get("device_rng_state")
        if device_rng and self.pm.device.type != "cpu":
            getattr(torch, self.pm.device.type).set_rng_state(torch.tensor(device_rng, dtype=torch.uint8))
        saved = meta.get("scheduler") or {}
        if "lr" in saved:
            theirs = {k: saved[k] for k in self.schedule if k in saved}
            relevant = ("kind", "lr") if theirs.get("kind") == "constant" else tuple(theirs)
            differs = {k: v for k, v in self.schedule.items() if k in relevant and theirs.get(k, v) != v}
            if differs:
                self.log(f"partita: note: resuming the checkpoint's LR schedule {theirs}; the flags' "
                         f"{differs} are not used (start a new run to change the schedule)")
            self.schedule.update(theirs)
        if self.config.checkpoint_every is None and meta.get("checkpoint_every"):
            self.checkpoint_every = int(meta["checkpoint_every"])

    def lr(self, step: int) -> float:
        s = self.schedule
        return lr_at(step, s["lr"], s["warmup_steps"], s["total_steps"], s["min_lr"], s["kind"])

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        """The step loop; returns 0, or 128 + the signal every rank agreed to stop for."""
        self.resume()
        self.printer = StepPrinter(self.config, self.rank == 0, self.start)
        self.profiler = start_profiler(self.config.profile_dir, self.pm.device, self.rank,
                                        self.config.steps - self.start)
        for step in range(self.start, self.config.steps):
            self.run_step(step)
            if self.guard.stop:
                return self.stop(step, self.guard.stop)
        self.finish()
        return 0

    def stop(self, step: int, signum: int) -> int:
        """Every rank agreed to stop after ``step`` (a SIGINT / SIGTERM reached one of them):
        save that step where a checkpoint directory is given, say so, exit 128 + signal."""
        self.printer.stop()
        if self.profiler is not None:
            self.profiler.stop()
        where = ""
        if self.ckpt_dir and self.saved_step != step:
            self.save(step)
        if self.ckpt_dir:
            where = f"; checkpoint {self.ckpt_dir / f'step_{step:08d}'} holds it (--resume continues)"
        self.log(f"partita: stopped by {signal.Signals(signum).name} after step {step}{where}")
        return 128 + signum

    def batch(self, step: int) -> tuple:
        """This rank's inputs and targets of ``step`` (text data or the synthetic stream;
        packed SFT rows add their position ids)."""
        if self.dataset is not None:
            return self.dataset.rank_batch(step, self.plan, self.rank)
        x, y = synthetic_batch(step, self.plan.gbs, self.plan.seq_len, self.vocab, self.config.seed)
        return dp_shard(x, self.plan, self.rank), dp_shard(y, self.plan, self.rank)

    def run_step(self, step: int) -> None:
        c = self.config
        lr = self.lr(step)
        for group in self.pm.optimizer.param_groups:
            group["lr"] = lr
        faults.before_step(self.rank, step)
        s0, t0 = mark(), time.perf_counter()
        x, y, *pos = self.batch(step)
        self.guard.step = step
        if self.counter is not None:
            self.counter.set_step(step)
        loss = self._train_step(x, y, step, *pos)
        dt = time.perf_counter() - t0
        self.busy = self.step_busy(since(s0))
        if self.guard.nonfinite:
            self.skip_nonfinite(step, loss)
            return
        self.times.append(dt)
        self.last_loss = loss
        self.log_step(step, loss, lr, dt)
        self.maybe_save(step)
        self.maybe_evaluate(step)
        if self.profiler is not None:
            self.profiler.step()
            if step == self.start and step + 1 < c.steps:
                mark_process_groups(self.pm)  # inside the first recorded step

    def step_busy(self, sched: list[float]) -> float | None:
        """The step's time without the neighbours' load, from every rank's ``[wall, run,
        run-queue wait]`` (calibrate/busy_clock.py ``critical_busy_s``, kept as ``self.waits``) -
        the clock ``partita calibrate`` times its micro-runs on, so the closed loop compares like
        with like on a loaded machine. None under profiling (its collective counter and trace
        must see only the step's own collectives). None on an accelerator too: there the host
        thread's run time is not the step's compute (kernels run asynchronously), so the clock
        would mean nothing - and its per-step all-gather would add a collective and a device
        sync to every step of a real run."""
        if self.counter is not None or self.profiler is not None or self.pm.device.type != "cpu":
            return None
        t = torch.tensor(sched, dtype=torch.float32, device=self.pm.device)
        if self.world > 1:
            out = torch.zeros(self.world * 3, dtype=torch.float32, device=self.pm.device)
            dist.all_gather_into_tensor(out, t)
            t = out
        self.waits = t.view(-1, 3).cpu().tolist()
        return critical_busy_s(self.waits)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, step: int, pos: torch.Tensor | None = None) -> float:
        """One step; with --compile, a compiler failure on the first step is one line."""
        if not (self.config.compile and step == self.start):
            return self.pm.train_step(x, y, pos)
        try:
            return self.pm.train_step(x, y, pos)
        except PartitaError:
            raise
        except Exception as e:  # torch._dynamo / inductor errors have no common base
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise PartitaError(f"--compile: torch.compile cannot compile this model/plan on "
                               f"{self.pm.device.type} ({type(e).__name__}: {first}); run without --compile") from None

    def eval_due(self, step: int) -> bool:
        every = self.config.eval_every
        return self.eval_set is not None and (step == self.config.steps - 1 or bool(every and (step + 1) % every == 0))

    def maybe_evaluate(self, step: int) -> None:
        """--eval-every N (and after the last step): eval loss and perplexity, logged."""
        if not self.eval_due(step):
            return
        k, gbs = self.config.eval_batches, self.plan.gbs
        batches = (self.eval_set.rank_batch(i, self.plan, self.rank) for i in range(k))
        from .sft_data import SftRows, evaluate_sft
        loss = evaluate_sft(self.pm, batches) if isinstance(self.eval_set, SftRows) else evaluate(self.pm, batches)
        self.last_eval = (step, loss)
        if self.rank != 0:
            return
        record = {"event": "eval", "step": step, "eval_loss": loss, "eval_perplexity": perplexity(loss),
                  "eval_sequences": k * gbs}
        self.metrics.write(record)
        self.tb.scalars(step, {"eval/loss": loss, "eval/perplexity": perplexity(loss)})
        self.printer.eval(record)

    def log_step(self, step: int, loss: float, lr: float, dt: float) -> None:
        """Rank 0: the step's record to the metrics file and the screen."""
        if self.rank != 0:
            return
        c, tokens = self.config, self.plan.tokens_per_step
        mem, kind = peak_memory_gib(self.pm.device)
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": self.guard.grad_norm, "step_time_s": dt,
                  "tokens_per_s": tokens / dt, f"peak_mem_{kind}_gib": mem}
        if c.model_flops_per_token and c.peak_flops:
            record["mfu"] = c.model_flops_per_token * tokens / dt / (c.peak_flops * self.world)
        if c.predicted_step_s:
            record["predicted_step_time_s"] = c.predicted_step_s
        if getattr(self, "busy", None) is not None:
            record["step_busy_s"] = self.busy
            record["step_sched_s"] = self.waits
        self.metrics.write(record)
        self.tb.scalars(step, {"train/loss": loss, "train/lr": lr, "train/grad_norm": self.guard.grad_norm,
                               "perf/tokens_per_s": record["tokens_per_s"], "perf/peak_mem_gib": mem,
                               "perf/mfu": record.get("mfu")})
        self.printer.step(record, mem)

    def skip_nonfinite(self, step: int, loss: float) -> None:
        """A step whose loss or gradient norm was not finite on some rank: no update was made
        (:class:`StepGuard`). Skipped and reported while ``--skip-nonfinite`` allows, else the
        run stops here - before any checkpoint of that state could be written."""
        what = self.guard.describe(loss)
        self.skipped.append(step)
        allowed = self.config.skip_nonfinite
        if len(self.skipped) > allowed:
            last = f"step_{self.saved_step:08d}" if self.saved_step >= 0 else "none"
            raise NonFiniteStep(f"step {step}: not finite: {what}; stopped before the optimizer update "
                                f"(--skip-nonfinite {allowed} allows {allowed} such step(s)); "
                                f"newest checkpoint of this run: {last}")
        self.log(f"partita: warning: step {step}: not finite: {what}; skipped without an update "
                 f"({len(self.skipped)} of --skip-nonfinite {allowed})")
        self.metrics.write({"event": "skipped_nonfinite", "step": step, "reason": what})
        self.maybe_save(step)

    def maybe_save(self, step: int) -> None:
        """Every ``checkpoint_every`` steps: a checkpoint with what resuming needs."""
        every = self.checkpoint_every
        if not (self.ckpt_dir and every and (step + 1) % every == 0):
            return
        self.save(step)

    def save(self, step: int) -> None:
        """A checkpoint of the state after ``step``, with what resuming needs in its meta."""
        from ..runtime.checkpoint import save_checkpoint
        c = self.config
        meta = {"plan": self.plan.to_dict(), "model": c.model, "data": c.data,
                "data_position": (step + 1) * self.plan.gbs, "seed": c.seed,
                "scheduler": {**self.schedule, "step": step + 1}, "checkpoint_every": self.checkpoint_every,
                "rng_state": torch.get_rng_state().tolist()}
        if self.pm.device.type != "cpu":
            meta["device_rng_state"] = getattr(torch, self.pm.device.type).get_rng_state().tolist()
        save_checkpoint(self.pm, self.ckpt_dir, step, meta, keep=c.keep, report=self.log)
        self.saved_step = step

    def summary(self) -> dict:
        return _summary(self)

    def save_hf(self) -> None:
        """--save-hf OUT: the trained weights as an HF directory (every rank takes part)."""
        from ..models.hf_weights import save_hf_weights
        if self.hf_config is None:
            raise PartitaError("--save-hf writes Hugging Face models only (--model DIR or hf-llama/hf-qwen2/hf-mixtral)")
        if self.plan.finetune == "lora":  # the PEFT adapter, or with --merge the merged model (runtime/lora.py)
            from ..runtime.lora import save_adapter, save_merged
            if self.config.merge:
                save_merged(self.pm, self.config.save_hf, self.hf_config, self.entry.source_dir)
            else:
                base = self.entry.source_dir or self.config.model
                save_adapter(self.pm, self.config.save_hf, self.pm.lora_config, base)
            self.log(f"partita: wrote the {'merged model' if self.config.merge else 'LoRA adapter'} to "
                     f"{self.config.save_hf}")
            return
        save_hf_weights(self.pm, self.config.save_hf, self.hf_config, int(self.config.save_hf_shard_mb * 1e6),
                        self.entry.source_dir)
        self.log(f"partita: wrote the trained weights as a Hugging Face directory: {self.config.save_hf}")

    def finish(self) -> None:
        """A final checkpoint (with a checkpoint dir) and the HF export (--save-hf); stop
        the profiler and progress bar; rank 0 prints the run's summary."""
        last = self.config.steps - 1
        if self.ckpt_dir and self.times and self.saved_step != last:
            self.save(last)
        if self.config.save_hf:
            self.save_hf()
        if self.profiler is not None:
            self.profiler.stop()
            write_profile_summary(self.config.profile_dir, self.rank, self.pm.device, self.times,
                                  dp_wire(self.pm, self.counter))
        self.printer.stop()
        self.tb.close()
        if self.rank != 0 or not self.times:
            return
        if self.config.json:
            print(json.dumps(self.summary()), flush=True)
            return
        steady_times = self.times[1:] or self.times
        steady = sorted(steady_times)[len(steady_times) // 2]
        line = (f"done: {len(self.times)} steps, final loss {self.last_loss:.4f}, median step {steady * 1e3:.1f} ms, "
                f"{self.plan.tokens_per_step / steady:,.0f} tokens/s")
        if self.last_eval is not None:
            line += f", eval loss {self.last_eval[1]:.4f} (perplexity {perplexity(self.last_eval[1]):.2f})"
        if self.skipped:
            line += f"; skipped {len(self.skipped)} non-finite step(s): {self.skipped}"
        predicted = self.config.predicted_step_s
        if predicted:
            line += f"; predicted {predicted * 1e3:.1f} ms (measured/predicted {steady / predicted:.2f})"
        print(line + f"; metrics in {self.run_dir / 'metrics.jsonl'}", flush=True)


def _summary(trainer: Trainer) -> dict:
    """The --json run summary (its ``step`` / ``loss`` are the last step's)."""
    t = trainer
    steady_times = t.times[1:] or t.times
    steady = sorted(steady_times)[len(steady_times) // 2]
    out = {"event": "summary", "step": t.config.steps - 1, "loss": t.last_loss, "steps_run": len(t.times),
           "median_step_time_s": steady, "tokens_per_s": t.plan.tokens_per_step / steady,
           "run_dir": str(t.run_dir), "metrics": str(t.run_dir / "metrics.jsonl")}
    if t.last_eval is not None:
        out.update(eval_loss=t.last_eval[1], eval_perplexity=perplexity(t.last_eval[1]))
    if t.skipped:
        out["skipped_nonfinite"] = t.skipped
    if t.ckpt_dir:
        out["checkpoint_dir"] = str(t.ckpt_dir)
    if t.config.save_hf:
        out["save_hf"] = t.config.save_hf
    return out


def load_run(run_dir: Path) -> tuple[TrainConfig, Plan]:
    """The run directory's config and plan (written by the launcher)."""
    config = TrainConfig.load(run_dir)
    try:
        plan = Plan.load(run_dir / PLAN_FILE)
    except OSError as e:
        raise PartitaError(f"cannot read the plan {run_dir / PLAN_FILE}: {e}") from None
    return config, plan


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    import faulthandler
    faulthandler.enable()  # a native crash (SIGSEGV in a collective) prints where each thread was
    try:
        config, plan = load_run(run_dir)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)
        return 2
    watch_launcher()
    requested = {"signal": 0}
    trainer: Trainer | None = None

    def on_signal(signum, frame):  # every rank stops after the step all of them agree on
        if not stop_requested(run_dir):  # torchrun ending the job after a failure: go now
            os._exit(128 + signum)
        requested["signal"] = signum
        if trainer is not None:
            trainer.guard.stop_signal = signum
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    device_type = detect_device_type(config.device)
    try:
        bind_cores(device_type)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)
        return 2
    init_distributed(device_type, config.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    from .nodes import JOB_KEY, mark_rank0
    multinode = rank == 0 and bool(os.environ.get(JOB_KEY))  # rank 0 lands on any node: say where
    if multinode:
        mark_rank0(run_dir)
    code = 0
    try:
        trainer = Trainer(config, plan, run_dir, device_type, rank, world)
        trainer.guard.stop_signal = requested["signal"]
        code = trainer.run()
    except NonFiniteStep as e:  # every rank agreed on it: one line, from rank 0
        if rank == 0:
            print(f"partita: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except Exception:  # noqa: BLE001 - print it as Python would, then leave before teardown:
        # interpreter finalization destroys gloo's pairs while a peer still waits on them and
        # can abort this rank (SIGABRT) - the launcher would then name a signal, not this error
        sys.excepthook(*sys.exc_info())
        sys.stderr.flush()
        os._exit(1)
    if code == 0:
        dist.barrier()
    dist.destroy_process_group()
    if multinode:
        mark_rank0(run_dir, code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
