"""``partita serve`` (issue 37 items 1-2): the planner's CLI, its queueing formula against a
simulated queue, its exports against the engines' own argument definitions (transcribed with
their source in export_oracles/serve_engines.json), and the torch-free planning rule.

The formulas' outside oracles that need torch (transformers' KV cache, the real models'
parameters, torch's FLOP counter) are in test_serve_oracles.py.
"""
from __future__ import annotations

import json
import random
import shlex
import subprocess
import sys

import pytest
from export_oracles import serve_oracle

from partita.cli.main import main
from partita.serve import export, queueing
from partita.serve.memory import kv_bytes_per_token, serve_memory
from partita.serve.search import evaluate, search_serve
from partita.serve.workload import Layout, Workload
from partita.spec.hardware import load_device
from partita.spec.load import load_model

DONE_WHEN = ["serve", "--model", "llama3-70b", "--hardware", "ascend-910b3", "--devices", "16", "--prompt-len", "2048",
             "--output-len", "512", "--rate", "10"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_issue_command_prints_layouts_memory_latency_and_why_not(capsys):
    code, out, err = run(DONE_WHEN, capsys)
    assert code == 0, err
    for text in ("tp/pp/dpa/ep", "weights", "KV pool", "TTFT ms", "TPOT ms", "goodput", "why not",
                 "80 % intervals", "no layout sustains 10 req/s"):
        assert text in out, text


def test_json_ranks_fitting_layouts_first_and_explains(capsys):
    code, out, _ = run(DONE_WHEN + ["--json", "--ttft-ms", "3000", "--tpot-ms", "150", "--rate", "1"], capsys)
    assert code == 0
    data = json.loads(out)
    best = data["layouts"][0]
    assert best["meets_targets"] and best["ttft_ms"] <= 3000 and best["tpot_ms"] <= 150
    caps = [r["capacity_rps"] for r in data["layouts"] if r["meets_targets"]]
    assert caps == sorted(caps, reverse=True)  # ranked by capacity among those that meet the targets
    mem = best["memory_bytes"]
    assert mem["weights"] + mem["kv"] + mem["activations"] + mem["workspace"] == pytest.approx(mem["limit"])
    assert data["why_not"] and data["interval"]["level"] == 0.8


def test_unknown_model_is_one_line_with_close_names(capsys):
    code, _, err = run(["serve", "--model", "llama3-70", *DONE_WHEN[3:]], capsys)
    assert code == 2 and err.count("\n") == 1 and "llama3-70b" in err


@pytest.mark.parametrize("flag, value", [("--rate", "0"), ("--prompt-len", "0"), ("--tpot-ms", "-1"),
                                         ("--devices", "12")])
def test_bad_input_is_one_line(flag, value, capsys):
    args = list(DONE_WHEN)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    code, _, err = run(args, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("partita: error:"), err


def test_a_model_that_cannot_fit_says_so(capsys):
    code, _, err = run(["serve", "--model", "deepseek-v3", "--hardware", "ascend-910b3", "--devices", "1",
                        "--prompt-len", "1024", "--output-len", "128", "--rate", "1"], capsys)
    assert code == 2 and "does not fit" in err and err.count("\n") == 1


def test_md1_wait_matches_a_simulated_queue():
    """The Pollaczek-Khinchine M/D/1 wait against Lindley's recursion on Poisson arrivals
    (W_{n+1} = max(0, W_n + S - A_{n+1})): the formula is the mean of the simulated waits."""
    rng = random.Random(7)
    service, rate = 1.0, 0.7
    wait, total, n = 0.0, 0.0, 200_000
    for _ in range(n):
        total += wait
        wait = max(0.0, wait + service - rng.expovariate(rate))
    assert queueing.md1_wait(rate * service, service) == pytest.approx(total / n, rel=0.05)
    assert queueing.md1_max_load(queueing.md1_wait(0.6, 2.0), 2.0) == pytest.approx(0.6)


def test_colocated_steady_state_obeys_littles_law():
    """At the bisected batch the decode throughput equals the arrival rate x output length."""
    t_dec = lambda n: 0.02 + 0.0005 * n  # noqa: E731 - a decode step growing with the batch
    op = queueing.colocated(2.0, 200, 0.1, t_dec, 500)
    rho = 2.0 * 0.1
    assert op.stable and op.tpot == pytest.approx(t_dec(op.seqs) / (1 - rho))
    assert op.seqs / op.tpot == pytest.approx(2.0 * 200, rel=1e-6)
    assert not queueing.colocated(11.0, 200, 0.1, t_dec, 500).stable  # rho > 1


def test_kv_cache_per_token_hand_counted():
    """Llama-3-70B: 80 layers x 2 (K, V) x 8 kv heads x 128 x 2 bytes = 320 KiB per token; tp=8
    keeps one kv head per rank, tp=16 still one (replicated). DeepSeek-V3 MLA: (512 + 64) x 61
    layers x 2 bytes, not split by tp."""
    llama, ds = load_model("llama3-70b"), load_model("deepseek-v3")
    assert kv_bytes_per_token(llama, Layout(1, 1, 1)) == 80 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token(llama, Layout(8, 1, 1)) == 80 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(llama, Layout(16, 1, 1)) == 80 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(llama, Layout(8, 2, 1, "fp8")) == 40 * 2 * 128
    assert kv_bytes_per_token(ds, Layout(8, 1, 1)) == (512 + 64) * 61 * 2


def test_weights_add_up_to_the_model():
    """With tp = pp = 1 a device holds every parameter once (bf16); the stages of pp = 4 hold
    them once between them."""
    m, dev = load_model("llama3-70b"), load_device("h200")
    mem = serve_memory(m, dev, Layout(1, 1, 1), 2560)
    assert mem.weights == m.total_params() * 2
    from partita.serve.memory import stage_weight_bytes
    assert sum(stage_weight_bytes(m, Layout(1, 4, 1))) == pytest.approx(m.total_params() * 2)


def _best_input(engine: str, model: str, hardware: str, devices: int, work: Workload):
    spec, dev = load_model(model), load_device(hardware)
    res = search_serve(spec, dev, devices, min(devices, dev.devices_per_node), work)
    chosen = next(r for r in res.results if r.memory.fits and not export.not_expressible(engine, r.layout))
    return export.ExportInput(chosen.layout, chosen.memory.max_seqs, work, "/models/x", dev, chosen.prefill,
                              chosen.tpot, min(devices, dev.devices_per_node))


WORK = Workload(2048, 512, 2.0, 3000, 100)


@pytest.mark.parametrize("hardware", ["ascend-910b3", "h100-sxm"])
@pytest.mark.parametrize("layout", [Layout(4, 1, 4), Layout(8, 2, 1, "fp8"), Layout(4, 1, 4, prefill_replicas=1),
                                    Layout(2, 1, 2, ep=8, dp_attn=4), Layout(2, 1, 2, ep=1, dp_attn=4)])
def test_vllm_and_sglang_arguments_parse_with_the_engines_definitions(hardware, layout):
    dev = load_device(hardware)
    inp = export.ExportInput(layout, 64, WORK, "/models/x", dev, 0.5, 0.05)
    roles = ["prefill", "decode"] if layout.disaggregated else ["both"]
    for role in roles:
        v = serve_oracle.parse("vllm", export.vllm_argv(inp, role))
        assert (v.tensor_parallel_size, v.pipeline_parallel_size) == (layout.tp, layout.pp)
        assert v.max_model_len == WORK.max_len and v.max_num_seqs == 64 // layout.dp_attn
        assert v.enable_expert_parallel is (True if layout.ep > 1 else None)
        assert v.data_parallel_size == (layout.dp_attn if layout.dp_attn > 1 else None)
        if role != "both":
            serve_oracle.check_kv_transfer(v.kv_transfer_config)
            assert v.kv_transfer_config["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
        s = serve_oracle.parse("sglang", export.sglang_argv(inp, role))
        assert s.tp_size == layout.tp * layout.dp_attn and s.pp_size == layout.pp
        assert s.enable_dp_attention == (layout.dp_attn > 1) and s.max_running_requests == 64
        assert s.disaggregation_mode == (None if role == "both" else role)
        assert (s.device == "npu") == hardware.startswith("ascend")


def test_rendered_commands_reparse():
    """The text ``--export`` prints: every command line splits back into the checked arguments."""
    inp = _best_input("vllm", "llama3-70b", "ascend-910b3", 16, WORK)
    for engine, program in (("vllm", "vllm serve"), ("sglang", "python -m sglang.launch_server")):
        commands = [line for line in export.render(engine, inp, "llama3-70b").splitlines() if line.startswith(program)]
        assert commands
        for line in commands:
            serve_oracle.parse(engine, shlex.split(line)[len(program.split()):])


def test_an_unknown_flag_or_choice_is_refused_by_the_oracle():
    """The oracle can fail: a misspelt flag or a kv dtype outside the engine's choices."""
    with pytest.raises(Exception):
        serve_oracle.parse("vllm", ["m", "--tensor-parallel", "2"])
    with pytest.raises(Exception):
        serve_oracle.parse("sglang", ["--model-path", "m", "--kv-cache-dtype", "fp8"])


def test_mindie_config_follows_the_documented_schema():
    inp = _best_input("mindie", "llama3-70b", "ascend-910b3", 16, WORK)
    config = export.mindie_config(inp, "llama3-70b")
    serve_oracle.check_mindie(config)
    assert config["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["worldSize"] == inp.layout.tp
    bad = json.loads(json.dumps(config))
    bad["BackendConfig"]["ScheduleConfig"]["maxBatchSize"] = 6000
    with pytest.raises(AssertionError):
        serve_oracle.check_mindie(bad)


def test_mindie_refuses_what_its_schema_cannot_say():
    assert "pipeline" in export.not_expressible("mindie", Layout(4, 2, 2))
    assert "prefill/decode" in export.not_expressible("mindie", Layout(4, 1, 4, prefill_replicas=2))
    assert export.not_expressible("vllm", Layout(4, 2, 2)) is None


def test_export_cli_writes_the_best_expressible_layout(tmp_path, capsys):
    out = tmp_path / "mindie.json"
    code, text, err = run(DONE_WHEN + ["--rate", "1", "--export", "mindie", "--output", str(out)], capsys)
    assert code == 0, err
    body = out.read_text()
    serve_oracle.check_mindie(json.loads(body[body.index("{"):]))
    code, text, _ = run(DONE_WHEN + ["--export", "sglang", "--model-path", "meta-llama/Meta-Llama-3-70B"], capsys)
    assert code == 0 and "--model-path meta-llama/Meta-Llama-3-70B" in text


def test_moe_search_uses_expert_parallel_and_stays_within_memory():
    """DeepSeek-V3 on 32 NPUs: every fitting layout's weights + KV + activations + workspace
    fit the engine's share of the device; the search considers ep and attention dp."""
    spec, dev = load_model("deepseek-v3"), load_device("ascend-910b3")
    res = search_serve(spec, dev, 32, 8, Workload(1024, 256, 0.5))
    assert res.best is not None
    assert any(r.layout.ep > 1 for r in res.results) and any(r.layout.dp_attn > 1 for r in res.results)
    for r in res.results:
        if r.memory.fits:
            m = r.memory
            assert m.weights + m.activations + m.workspace + m.kv_per_token * 1280 <= m.limit


def test_more_devices_serve_more():
    spec, dev = load_model("llama3-70b"), load_device("ascend-910b3")
    work = Workload(2048, 512, 1.0, 3000, 100)
    small = evaluate(spec, dev, Layout(8, 1, 1), work, 8)
    large = evaluate(spec, dev, Layout(8, 1, 2), work, 8)
    assert large.capacity == pytest.approx(2 * small.capacity)


def test_planning_never_imports_torch():
    code = ("import sys; import partita.serve.search, partita.serve.export, partita.cli.serve; "
            "assert not [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules], sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
