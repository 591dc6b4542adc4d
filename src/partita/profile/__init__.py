"""Profiling: analyse torch.profiler traces (GPU, NPU or CPU/gloo) - where a step's time goes."""
from .trace import TraceBreakdown, analyze_trace, load_trace

__all__ = ["TraceBreakdown", "analyze_trace", "load_trace"]
