"""The cost model: pure functions of (model, cluster, plan); no torch import.

* :mod:`.compute`   - FLOPs and achievable time of one layer's forward/backward
* :mod:`.comm`      - collective times on a two-level (node / network) topology
* :mod:`.memory`    - per-rank memory: weights, gradients, optimizer, activations, buffers
  (the parts in :mod:`.states`, :mod:`.activations`, :mod:`.placement`, :mod:`.transient`)
* :mod:`.pipeline`  - schedule formulas: in-flight micro-batches and bubbles
* :mod:`.step`      - the step-time breakdown that puts them together
* :mod:`.frameworks` - what changes when a named framework runs the plan (``--framework``)
"""
