"""``partita calibrate``: measure this machine and write a hardware file the planner reads.

Run under torchrun with the process count a plan will use. It measures, on the
device each rank trains on:

* GEMM throughput at several sizes; the cost model's curve ``rate(G) = peak * eff * G /
  (G + G_half)`` is linear in 1/G as ``1/rate = a + b/G``, so least squares gives
  ``eff = 1/(a peak)`` and ``G_half = b/a`` exactly;
* element-wise bandwidth (a large copy) -> ``memory.hbm_tbps`` at efficiency 1;
* all-reduce time over all ranks at sizes 4 KiB ... 16 MiB, fitted to the model's
  ``t = 2(n-1) alpha + 2 (n-1)/n S / B`` -> ``intra_node.latency_us`` and
  ``intra_node.gbps_per_direction`` at efficiency 1;
* the per-layer overhead: a tiny transformer block's forward time minus its predicted
  GEMM time -> ``efficiency.kernel_overhead_us_per_layer``;
* with more than one process, the host-side framework time tensor parallelism (DTensor)
  and FSDP add per layer: the tiny model's forward + backward alone, tensor parallel and
  FSDP over all ranks; what each costs beyond the plain run, minus what the cost model
  already predicts for it (its collectives on the calibrated numbers) ->
  ``efficiency.tp_framework_us_per_layer`` and ``efficiency.zero3_framework_us_per_layer``.

The output ``extends`` the base device file, so every field not measured keeps its
documented value; the raw measurements are stored under ``calibration``.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from datetime import timedelta


def _timeit(fn, min_time: float = 0.2, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= min_time / repeat:
                break
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares y = a + b x."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-30)
    return my - b * mx, b


def measure(device_type: str, dtype_name: str = "fp32") -> dict:
    import torch
    import torch.distributed as dist
    from ..runtime.device import local_device
    device = local_device(device_type)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    sync = (lambda: getattr(torch, device.type).synchronize()) if device.type != "cpu" else (lambda: None)
    out: dict = {"device": device.type, "dtype": dtype_name, "world": dist.get_world_size()}
    gemm = []
    for n in (64, 128, 256, 512, 1024):
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        t = _timeit(lambda: (a @ b, sync()))
        gemm.append({"gflop": 2 * n ** 3 / 1e9, "seconds": t})
    out["gemm"] = gemm
    x = torch.randn(16_000_000 // (1 if dtype_name == "fp32" else 2), device=device, dtype=dtype)
    t = _timeit(lambda: (x.clone(), sync()))
    out["copy_bytes_per_s"] = 2 * x.numel() * x.element_size() / t
    coll = []
    for size, iters in ((4096, 40), (65536, 40), (1 << 20, 20), (4 << 20, 10), (16 << 20, 5)):
        # every rank must run the same number of collectives: fixed counts, no time-based loop
        buf = torch.zeros(size // 4, device=device)
        dist.all_reduce(buf)
        dist.barrier()
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            sync()
            runs.append((time.perf_counter() - t0) / iters)
        coll.append({"bytes": size, "seconds": statistics.median(runs)})
    out["all_reduce"] = coll
    # per-layer overhead: a tiny block (hidden 64) is launch/framework bound
    from ..models.llama import Block, TransformerConfig, rope_tables
    cfg = TransformerConfig()
    block = Block(cfg).to(device)
    h = torch.randn(1, 64, cfg.hidden, device=device)
    cos, sin = rope_tables(cfg.head_dim, 64, cfg.rope_theta)
    cos, sin = cos.to(device), sin.to(device)
    out["tiny_block_forward_s"] = _timeit(lambda: (block(h, cos, sin), sync()))
    params = sum(p.numel() for p in block.parameters() if p.dim() == 2)
    out["tiny_block_gflop"] = 2 * 64 * params / 1e9
    if out["world"] > 1:
        out["framework"] = _measure_framework(device, sync)
    return out


FRAMEWORK_MODEL, FRAMEWORK_SEQ = "tiny-llama", 64


def _measure_framework(device, sync) -> dict:
    """Forward + backward of the tiny model (one micro-batch of 64 tokens) three ways:
    alone on each rank, tensor parallel (DTensor, sp) over as many ranks as its heads
    allow, and FSDP2 (zero 3) over all ranks - every rank runs the same fixed number of steps (collectives inside
    a time-based loop would deadlock)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ..models.llama import build_model
    from ..runtime.data_parallel import apply_fsdp
    from ..runtime.parallelize import cross_entropy
    from ..runtime.tensor_parallel import apply_tp
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (1, FRAMEWORK_SEQ + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def fixed_time(model, context) -> float:
        def step():
            with context():
                cross_entropy(model(x), y).backward()
            sync()
        for _ in range(2):
            step()
        dist.barrier()
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(6):
                step()
            runs.append((time.perf_counter() - t0) / 6)
        dist.barrier()
        return statistics.median(runs)

    plain = build_model(FRAMEWORK_MODEL, device=device)
    # the largest tensor-parallel degree the model's heads allow; the other ranks of the
    # world run independent replicas beside it (no gradient sync in this measurement)
    tp_degree = max(d for d in range(1, world + 1) if world % d == 0 and plain.cfg.kv_heads % d == 0
                    and plain.cfg.heads % d == 0)
    mesh = init_device_mesh(device.type, (world // tp_degree, tp_degree), mesh_dim_names=("dp", "tp"))
    tp = build_model(FRAMEWORK_MODEL, device=device)
    apply_tp(tp, mesh["tp"], sp=True)
    fsdp = build_model(FRAMEWORK_MODEL, device=device)
    apply_fsdp(fsdp, init_device_mesh(device.type, (world,)), zero=3, param_dtype=None)
    return {"model": FRAMEWORK_MODEL, "seq_len": FRAMEWORK_SEQ, "tp": tp_degree,
            "plain_s": fixed_time(plain, contextlib.nullcontext),
            "tp_s": fixed_time(tp, loss_parallel), "fsdp_s": fixed_time(fsdp, contextlib.nullcontext)}


def framework_overheads(m: dict, device_file: dict) -> dict[str, float]:
    """Per-layer host-side time (us) that tensor parallelism and FSDP add beyond what the
    cost model already predicts for them on the calibrated device: the measured
    difference to the plain run minus the predicted difference, per layer."""
    from ..cost.step import step_time_lower_bound
    from ..plan import Plan
    from ..spec.hardware import Cluster, load_device
    from ..spec.load import load_model
    f, world = m["framework"], m["world"]
    model = load_model(f["model"])
    # the file extends its base: the same device is the base with the file's fields on top
    device = load_device(device_file["extends"], overrides={k: v for k, v in device_file.items() if k != "extends"})
    cluster = Cluster(device=device, nodes=1, devices_per_node=max(world, 1))
    common = {"mbs": 1, "seq_len": f["seq_len"], "dtype": m["dtype"]}

    def predicted(**degrees) -> float:  # one micro-batch through one stage: forward + backward
        plan = Plan(gbs=degrees.get("dp", 1), **degrees, **common)
        return step_time_lower_bound(model, cluster, plan)

    plain = predicted()
    tp = (f["tp_s"] - f["plain_s"]) - (predicted(tp=f["tp"], sp=True) - plain) if f["tp"] > 1 else 0.0
    z3 = (f["fsdp_s"] - f["plain_s"]) - (predicted(dp=world, zero=3) - plain)
    return {"tp_framework_us_per_layer": max(tp, 0.0) / model.layers * 1e6,
            "zero3_framework_us_per_layer": max(z3, 0.0) / model.layers * 1e6}


def fit_gemm(gemm: list[dict], peak: float) -> tuple[float, float, float]:
    """(peak FLOP/s, efficiency, half-saturation size in GFLOP) from GEMM timings
    (``{"gflop", "seconds"}`` each).

    The cost model's curve ``rate(G) = peak * eff * G / (G + G_half)`` is linear in
    ``1/G``: ``1/rate = 1/(peak eff) + (G_half/(peak eff)) / G``, so the least-squares
    line ``1/rate = a + b/G`` gives ``eff = 1/(a peak)`` and ``G_half = b/a`` exactly for
    measurements on the curve. A measured rate above ``peak`` raises the peak to it (the
    base file's peak is then too low for this machine)."""
    xs = [1 / g["gflop"] for g in gemm]
    ys = [g["seconds"] / (g["gflop"] * 1e9) for g in gemm]  # 1/rate
    a, b = _fit_line(xs, ys)
    a = max(a, 1e-30)
    best = max(g["gflop"] * 1e9 / g["seconds"] for g in gemm)
    if best > peak:
        peak = best
    return peak, min(1.0, 1 / (a * peak)), max(b / a, 0.0)


def fit_all_reduce(coll: list[dict], world: int) -> tuple[float, float]:
    """(per-hop latency alpha in s, bandwidth in bytes/s) from all-reduce timings
    (``{"bytes", "seconds"}`` each) over ``world`` ranks, fitted to the cost model's ring
    all-reduce ``t = 2(n-1) alpha + 2(n-1)/n S / B`` (Thakur et al. 2005), linear in
    ``x = 2(n-1)/n S``: intercept ``2(n-1) alpha``, slope ``1/B``."""
    xs = [2 * (world - 1) / world * c["bytes"] for c in coll]
    ys = [c["seconds"] for c in coll]
    lat_total, inv_bw = _fit_line(xs, ys)
    return max(lat_total, 0.0) / (2 * (world - 1)), 1 / max(inv_bw, 1e-15)


def kernel_overhead_s(forward_s: float, gflop: float, peak: float, eff: float, g_half: float) -> float:
    """Per-layer time beyond the GEMMs: a tiny block's measured forward minus its GEMM
    time on the fitted curve (``gflop / rate(gflop)``), never negative."""
    layer_gemm = gflop * 1e9 / (peak * eff * gflop / (gflop + g_half))
    return max(forward_s - layer_gemm, 0.0)


def hardware_file(m: dict, base: str, name: str) -> dict:
    """Turn measurements into a device file that extends ``base`` (no measuring here:
    tests feed synthetic measurements to it and to the fits above)."""
    from ..spec.hardware import load_device
    dev = load_device(base)
    dtype = m["dtype"]
    peak = dev.peak_flops(dtype) if dev.supports(dtype) else max(g["gflop"] * 1e9 / g["seconds"] for g in m["gemm"])
    peak, eff, g_half = fit_gemm(m["gemm"], peak)
    n = m["world"]
    if n > 1:
        alpha, bw = fit_all_reduce(m["all_reduce"], n)
    else:
        bw, alpha = dev.intra_gbps * 1e9, dev.intra_latency_us * 1e-6
    overhead = kernel_overhead_s(m["tiny_block_forward_s"], m["tiny_block_gflop"], peak, eff, g_half)
    out = {
        "name": name, "extends": base,
        "description": f"{base} calibrated by `partita calibrate` on this machine ({n} process(es), {m['device']})",
        "peak_tflops": {dtype: peak / 1e12},
        "memory": {"hbm_tbps": m["copy_bytes_per_s"] / 1e12},
        "intra_node": {"gbps_per_direction": bw / 1e9, "peer_gbps_per_direction": bw / 1e9, "latency_us": alpha * 1e6},
        "efficiency": {"gemm": eff, "gemm_half_gflop": g_half, "memory_bandwidth": 1.0, "intra_node_comm": 1.0,
                       "kernel_overhead_us_per_layer": overhead * 1e6},
        "calibration": m,
    }
    if "framework" in m:
        out["efficiency"].update(framework_overheads(m, out))
    return out


def main() -> None:
    """``torchrun ... -m partita.profile.calibrate OUT.json BASE NAME DEVICE DTYPE``"""
    import torch.distributed as dist
    from ..runtime.device import backend_for, detect_device_type
    out_path, base, name, device, dtype = sys.argv[1:6]
    device_type = detect_device_type(device if device != "auto" else None)
    dist.init_process_group(backend_for(device_type), timeout=timedelta(seconds=300))
    m = measure(device_type, dtype)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(hardware_file(m, base, name), f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
