"""What checkpoint integrity costs: save + load with and without checksums and verification.

    python bench/checkpoint_integrity.py [--nproc 2] [--repeats 7] [--models tiny-llama,small-llama,bench-llama-25m]

For each model (AdamW, one step taken so the optimizer state exists, plan dp=<nproc>) the
same torchrun job times, alternating the two variants each round so machine noise hits
both alike:

- plain: the save path before issue 21 - ``dcp.save`` with DCP's own ``FileSystemWriter``
  into ``step_N.partial``, ``meta.json`` fsynced, a ``COMMITTED`` marker, the atomic
  rename - and a plain ``load_checkpoint``;
- checked: ``save_checkpoint`` (finite check, CRC-32 of every file while writing, manifest
  written last, size check, rename) and ``resume_checkpoint`` (listing, every file reread
  and checksummed - split over the ranks - the model-fit check on ``.metadata``, the load,
  the finite check of every tensor).

It prints the best round of each (other jobs on a shared machine only ever add time, so
the fastest round is the closest to the cost itself) side by side and the ratio checked /
plain of save, load and save + load (issue 21 asks for under 1.10 on save + load), in
wall-clock time and in CPU time summed over the ranks - the second barely moves when
other jobs load the machine, which the first does a lot on a shared 2-core box. Files are read back from the page
cache here, as a resume right after a save would; on a cold disk verification costs one
extra read of the checkpoint, split over the ranks. ``bench-llama-25m`` is the largest
model that saves in a few seconds on this 2-core machine (about 25 M parameters, 0.3 GB
with AdamW state).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

EXTRA_MODELS = {"bench-llama-25m": dict(vocab=8192, hidden=512, layers=8, heads=8, kv_heads=4, ffn_hidden=1408)}


def _build(name: str, world: int):
    import torch

    from partita.models.llama import TransformerConfig, build_model
    from partita.plan import Plan
    from partita.runtime import parallelize
    from partita.train.data import dp_shard, synthetic_batch
    model = build_model(TransformerConfig(**EXTRA_MODELS[name]) if name in EXTRA_MODELS else name, seed=0)
    plan = Plan.parse(f"dp={world},mbs=1,gbs={world},seq_len=16", world_size=world, defaults={"dtype": "fp32"})
    pm = parallelize(model, plan, make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False))
    rank = torch.distributed.get_rank()
    x, y = synthetic_batch(0, plan.gbs, plan.seq_len, model.cfg.vocab, 0)
    pm.train_step(dp_shard(x, plan, rank), dp_shard(y, plan, rank))
    return pm


def _plain_save(pm, root: Path, step: int, meta: dict) -> Path:
    """The save path as it was before checksums (checkpoint.py at f237530^)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from partita.runtime.checkpoint import state_for_checkpoint
    final, partial = root / f"step_{step:08d}", root / f"step_{step:08d}.partial"
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(state_for_checkpoint(pm), checkpoint_id=str(partial))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(partial / "meta.json", "w") as f:
            json.dump({**meta, "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        (partial / "COMMITTED").write_text("ok\n")
        os.replace(partial, final)
    dist.barrier()
    return final


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of all ranks together) of a collective call."""
    import torch.distributed as dist
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    cpu = [0.0] * dist.get_world_size()
    dist.all_gather_object(cpu, time.process_time() - c0)
    dist.barrier()
    return time.perf_counter() - t0, sum(cpu)


def _one_round(pm, base: Path, k: int, order: tuple[str, str]) -> dict[str, tuple[float, float]]:
    import torch.distributed as dist

    from partita.runtime.checkpoint import load_checkpoint, save_checkpoint
    from partita.runtime.checkpoint_resume import resume_checkpoint
    out = {}
    for variant in order:
        root = base / f"{variant}-{k}"
        if variant == "plain":
            out["plain_save"] = _timed(lambda: _plain_save(pm, root, k, {}))
            out["plain_load"] = _timed(lambda: load_checkpoint(pm, root / f"step_{k:08d}"))
        else:
            out["checked_save"] = _timed(lambda: save_checkpoint(pm, root, k, {}, keep=0))
            out["checked_load"] = _timed(lambda: resume_checkpoint(pm, root))
        if dist.get_rank() == 0:
            shutil.rmtree(root)
    return out


def worker(models: list[str], repeats: int) -> None:
    import torch.distributed as dist

    from partita.runtime.checkpoint import state_for_checkpoint
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    base = Path(tempfile.mkdtemp(prefix="partita-bench-ckpt-")) if rank == 0 else None
    obj = [str(base) if base else None]
    dist.broadcast_object_list(obj)
    base = Path(obj[0])
    rows = []
    for name in models:
        pm = _build(name, world)
        nbytes = sum(t.numel() * t.element_size() for t in state_for_checkpoint(pm).values())
        times: dict[str, list[float]] = {}
        for k in range(repeats + 1):
            order = ("plain", "checked") if k % 2 == 0 else ("checked", "plain")
            for key, t in _one_round(pm, base, k, order).items():
                if k > 0:  # round 0 warms up (imports, first-touch allocation)
                    times.setdefault(key, []).append(t)
        rows.append((name, nbytes, {f"{key}_{kind}": min(t[i] for t in v) for key, v in times.items()
                                    for i, kind in enumerate(("wall", "cpu"))}))
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
        _print(rows, world, repeats)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _print(rows, world: int, repeats: int) -> None:
    print(f"checkpoint save + load, {world} ranks (gloo), AdamW state, best of {repeats} alternating rounds; "
          "plain = DCP before issue 21, checked = hash while writing + manifest + verified resume")
    for kind, what in (("wall", "wall-clock time"), ("cpu", "CPU time of all ranks (insensitive to other jobs)")):
        print(f"\n{what}")
        print(f"{'model':<18}{'state MB':>9}{'save plain':>12}{'checked':>9}{'ratio':>7}"
              f"{'load plain':>12}{'checked':>9}{'ratio':>7}{'save+load ratio':>17}")
        for name, nbytes, m in rows:
            ps, cs, pl, cl = (m[f"{v}_{kind}"] for v in ("plain_save", "checked_save", "plain_load", "checked_load"))
            print(f"{name:<18}{nbytes / 1e6:>9.1f}{ps * 1e3:>10.0f}ms{cs * 1e3:>7.0f}ms{cs / ps:>7.2f}"
                  f"{pl * 1e3:>10.0f}ms{cl * 1e3:>7.0f}ms{cl / pl:>7.2f}{(cs + cl) / (ps + pl):>17.3f}")
    print("\nrerun: python bench/checkpoint_integrity.py --nproc 2 --repeats 7")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--models", default="tiny-llama,small-llama,bench-llama-25m")
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args.models.split(","), args.repeats)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           __file__, "--worker", "--models", args.models, "--repeats", str(args.repeats)]
    sys.exit(subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1800).returncode)


if __name__ == "__main__":
    main()
