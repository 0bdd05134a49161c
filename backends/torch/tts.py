"""TTS runner of the `torch` backend: models/vits.py built with a kernel set, weights from the Piper ONNX file, run by
the streaming TTS runner the backends share (tts_runner.TorchTTSRunner)."""

from __future__ import annotations

import torch

from speechrt.errors import UserError

from ..threads import ThreadPolicy
from ..tts_runner import TorchTTSRunner

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build(
    model, device: torch.device, dtype: str | None, kernels: str = "torch", threads: ThreadPolicy | None = None
) -> TorchTTSRunner:
    """ResolvedModel (format 'piper-onnx') -> TorchTTSRunner."""
    import speechrt.kernels as K
    from speechrt.models.piper_loader import load_vits

    if model.format != "piper-onnx":
        raise UserError(f"{model.name}: the torch TTS runner loads Piper voices (piper-onnx), not {model.format}")
    dt = torch.float32
    if dtype is not None:
        if dtype not in DTYPES:
            raise UserError(f"unsupported dtype {dtype!r} for TTS; valid: {', '.join(DTYPES)}")
        dt = DTYPES[dtype]
        if dt != torch.float32 and device.type == "cpu":
            raise UserError(f"dtype {dtype} is for GPUs; on the CPU the torch TTS runner uses float32")
    ops = K.select(kernels, device)
    vits, voice = load_vits(model.path, ops, device=device)
    if dt != torch.float32:  # only the generator runs in reduced precision (see latent())
        vits.dec.to(dt)
    return TorchTTSRunner(vits, voice, device, dt, threads, kernels, model.name)
