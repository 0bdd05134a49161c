"""Binding torch tensors to ONNX Runtime graphs in place (I/O binding): no copies in or out, caches stay in
the runner's own torch buffers, which ORT reads and writes where they are."""

from __future__ import annotations

import numpy as np
import torch

NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def ort_device(device: torch.device) -> tuple[str, int]:
    return ("cuda", device.index or 0) if device.type == "cuda" else ("cpu", 0)


def bind(io, name: str, t: torch.Tensor, output: bool = False) -> None:
    """Bind contiguous tensor `t` as input (or output) `name` of IOBinding `io`."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: ONNX Runtime binds contiguous tensors only")
    kind, index = ort_device(t.device)
    fn = io.bind_output if output else io.bind_input
    fn(name, kind, index, NUMPY[t.dtype], list(t.shape), t.data_ptr())


def run_bound(session, io, device: torch.device, run_options=None) -> None:
    """`session.run_with_iobinding`, once the torch work that wrote the bound inputs has finished: ORT's CUDA and
    ROCm providers run on a stream of their own that does not wait for torch's. (ORT synchronizes its own
    stream before the run returns, so the outputs are ready for torch.)"""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    session.run_with_iobinding(io, run_options)


def providers_device(providers) -> torch.device:
    """The torch device whose memory a session's first provider works on."""
    first = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    if first == "CPUExecutionProvider":
        return torch.device("cpu")
    opts = providers[0][1] if isinstance(providers[0], tuple) else {}
    return torch.device("cuda", int(opts.get("device_id", 0)))
