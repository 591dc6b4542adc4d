"""Analysis of profiler traces recorded by anyone (``partita analyze``, and the measured side
of ``partita profile``): torch.profiler / Kineto Chrome traces - ``torch_npu.profiler``
writes the same format - from Megatron-LM, torchtitan, DeepSpeed, a plain loop or Partita.
No torch needed.

* :mod:`.files` reads a rank's trace file or a directory of them, with one-line errors
  (torch_npu: cluster directories of ``*_ascend_pt`` captures, ranks from their
  ``profiler_info_<N>.json``, captures of different jobs refused);
* :mod:`.ascend` reads torch_npu / msprof captures as msprof reads them (the HCCL process,
  stream roles, task types, msprof's device step) and msprof's own summaries;
* :mod:`.breakdown` splits one trace into compute, communication, memory copies and idle
  time (Partita's conventions); :mod:`.hta` gives Holistic Trace Analysis's;
* :mod:`.groups` names the parallel axis each process group serves; :mod:`.memory` reads
  the allocator's timeline and fragmentation;
* :mod:`.ranks` puts these together per rank, with the stragglers across ranks;
* :mod:`.figures` and :mod:`.report` draw them on an HTML page.

(Model *tracing*, turning a torch module into a spec, is :mod:`partita.tracing`.)
"""
from .breakdown import TraceBreakdown, analyze_trace, load_trace
from .ranks import analyze_traces

__all__ = ["TraceBreakdown", "analyze_trace", "analyze_traces", "load_trace"]
