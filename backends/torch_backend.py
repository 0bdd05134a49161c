"""The `torch` backend: the PyTorch model definitions run eagerly on CPU, CUDA or ROCm, built with the
torch reference kernel set. Each family's runner lives in its own module (torch_asr, torch_slm, torch_tts)."""
from __future__ import annotations

import importlib

import torch

from .base import Backend

KERNELS = "torch"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' / None -> cuda if present, else cpu; checks that an explicit device exists."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        from speechrt.errors import UserError
        raise UserError(f"unsupported device {device!r}; valid: cpu, cuda, cuda:N (ROCm devices are 'cuda' in PyTorch), auto") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        from speechrt.errors import UserError
        raise UserError(f"device {device!r} requested but no CUDA/ROCm device is visible to PyTorch "
                        f"(torch {torch.__version__}); use --device cpu")
    if d.type not in ("cpu", "cuda"):
        from speechrt.errors import UserError
        raise UserError(f"unsupported device {device!r}; valid: cpu, cuda, cuda:N (ROCm devices are 'cuda' in PyTorch), auto")
    return d


class TorchBackend(Backend):
    name = "torch"
    kernels = KERNELS

    def _build(self, family, model, device, dtype):
        m = importlib.import_module(f"speechrt.backends.torch_{family}")
        return m.build(model, resolve_device(device), dtype, kernels=self.kernels)

    def asr(self, model, device="cpu", dtype=None):
        return self._build("asr", model, device, dtype)

    def slm(self, model, device="cpu", dtype=None):
        return self._build("slm", model, device, dtype)

    def tts(self, model, device="cpu", dtype=None):
        return self._build("tts", model, device, dtype)
