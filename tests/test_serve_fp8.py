"""``partita serve`` offers fp8 weights where the device multiplies fp8, and exports them.

Oracles outside the code under test: the devices' datasheets (Hopper has FP8 tensor cores,
Ampere does not - NVIDIA H100 and A100 datasheets; the 910B's catalog file has no fp8 rate),
Llama-3-70B's parameter count from its published safetensors index (70,553,706,496 parameters:
1 byte each in fp8), and the engines' own argument definitions (vLLM ``--quantization`` /
``QuantizationMethods``, SGLang ``QUANTIZATION_CHOICES``, transcribed with their commits in
export_oracles/serve_engines.json).
"""
from __future__ import annotations

import pytest
from export_oracles import serve_oracle

from partita.models.registry import resolve_model
from partita.serve import export
from partita.serve.memory import serve_memory
from partita.serve.search import candidate_layouts, search_serve
from partita.serve.workload import Layout, Workload
from partita.spec.hardware import load_device

LLAMA3_70B_PARAMS = 70_553_706_496  # meta-llama/Meta-Llama-3-70B model.safetensors.index.json total_size / 2
WORK = Workload(2048, 512, 10.0)


@pytest.mark.parametrize("hardware, has_fp8", [("h100-sxm", True), ("a100-80gb", False), ("ascend-910b3", False)])
def test_the_search_offers_fp8_weights_only_on_devices_with_fp8_gemms(hardware, has_fp8):
    model = resolve_model("llama3-70b").spec()
    dtypes = {lay.dtype for lay in candidate_layouts(model, load_device(hardware), 16, 8)}
    assert dtypes == ({"bf16", "fp8"} if has_fp8 else {"bf16"})


def test_fp8_weights_weigh_one_byte_per_parameter():
    model, dev = resolve_model("llama3-70b").spec(), load_device("h200")
    assert serve_memory(model, dev, Layout(1, 1, 1, dtype="fp8"), 2560).weights == LLAMA3_70B_PARAMS
    assert serve_memory(model, dev, Layout(1, 1, 1), 2560).weights == 2 * LLAMA3_70B_PARAMS


def test_the_h100_search_explains_the_weight_dtype():
    model, dev = resolve_model("llama3-70b").spec(), load_device("h100-sxm")
    res = search_serve(model, dev, 16, 8, WORK)
    other = "bf16" if res.best.layout.dtype == "fp8" else "fp8"
    assert any(line.startswith(f"why not dtype={other} ") for line in res.why_not)
    fp8 = next(r for r in res.results if r.layout.dtype == "fp8")
    assert "weights fp8" in fp8.layout.describe()


@pytest.mark.parametrize("role", ["both", "prefill"])
def test_fp8_exports_parse_with_the_engines_definitions(role):
    lay = Layout(4, 1, 4, "fp8", dtype="fp8", prefill_replicas=1 if role == "prefill" else 0)
    inp = export.ExportInput(lay, 64, WORK, "/models/x", load_device("h100-sxm"), 0.3, 0.03)
    assert serve_oracle.parse("vllm", export.vllm_argv(inp, role)).quantization == "fp8"
    assert serve_oracle.parse("sglang", export.sglang_argv(inp, role)).quantization == "fp8"
    bf16 = export.ExportInput(Layout(4, 1, 4), 64, WORK, "/models/x", load_device("h100-sxm"))
    assert serve_oracle.parse("vllm", export.vllm_argv(bf16)).quantization is None
    assert "fp8 weights" in export.not_expressible("mindie", lay)


def test_the_oracle_refuses_a_quantization_the_engine_does_not_know():
    with pytest.raises(Exception, match="invalid choice"):
        serve_oracle.parse("vllm", ["m", "--quantization", "fp8_e4m3"])
