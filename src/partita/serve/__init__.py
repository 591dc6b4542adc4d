"""Inference (serving) planning: ``partita serve``.

Planning only and torch-free, like :mod:`partita.search`: from a model spec, a device file and
a workload it predicts, per candidate serving layout, memory (weights, KV cache, activations,
runtime workspace), time to first token, time per output token, and the throughput a layout
sustains under latency targets, and says why the alternatives lose.

* :mod:`.workload` - the workload and the layout records (the shared vocabulary);
* :mod:`.memory`   - bytes per device: weights, KV cache per token (MHA/GQA and MLA latent),
  activations, workspace, and the KV budget that bounds concurrency;
* :mod:`.latency`  - prefill (compute-bound) and decode (bandwidth-bound) step times with the
  tensor/expert-parallel collectives and pipeline hops;
* :mod:`.queueing` - waiting time for the first token and the decode batch at an arrival rate;
* :mod:`.search`   - the layouts searched, ranked and explained;
* :mod:`.export`   - vLLM (and vLLM-Ascend), SGLang and MindIE launch arguments.
"""
