"""Pick the device type and collective backend from what the machine has (never hard-coded)."""
from __future__ import annotations

import importlib.util
import os

import torch

BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo", "xpu": "xccl"}


def detect_device_type(requested: str | None = None) -> str:
    """``requested`` if given, else npu (torch_npu installed and a device present), cuda, or cpu."""
    if requested:
        return requested
    if importlib.util.find_spec("torch_npu") is not None:
        import torch_npu  # noqa: F401  (registers the npu device)
        if torch.npu.is_available():  # type: ignore[attr-defined]
            return "npu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def backend_for(device_type: str) -> str:
    return BACKENDS.get(device_type, "gloo")


def local_device(device_type: str) -> torch.device:
    """This process's device: ``<type>:<LOCAL_RANK>`` for accelerators, ``cpu`` otherwise."""
    if device_type == "cpu":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    module = getattr(torch, device_type)
    module.set_device(index)
    return torch.device(device_type, index)
