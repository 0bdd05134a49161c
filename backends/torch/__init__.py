"""The `torch` backend: the PyTorch model definitions run eagerly on CPU, CUDA or ROCm, built with the
torch reference kernel set. Each family's runner lives in its own module (asr, lm, tts); how they use the
CPU's threads is decided once, when a runner is built, by backends.threads.ThreadPolicy."""

from __future__ import annotations

import importlib

import torch

from speechrt.errors import UserError

from ..base import Backend
from ..threads import ThreadPolicy

KERNELS = "torch"
DEVICE_HELP = "valid: cpu, cuda, cuda:N (ROCm devices are 'cuda' in PyTorch), auto"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' / None -> cuda if present, else cpu; checks that an explicit device exists."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"unsupported device {device!r}; {DEVICE_HELP}") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device {device!r} requested but no CUDA/ROCm device is visible to PyTorch "
            f"(torch {torch.__version__}); use --device cpu"
        )
    if d.type not in ("cpu", "cuda"):
        raise UserError(f"unsupported device {device!r}; {DEVICE_HELP}")
    return d


class TorchBackend(Backend):
    name = "torch"
    kernels = KERNELS
    families = ("asr", "lm", "tts")

    def _build(self, family, model, device, dtype, step_threads):
        from speechrt.models.registry import source_of

        model = source_of(model)  # an ONNX export runs here as the model it was exported from
        dev = resolve_device(device)
        m = importlib.import_module(f"speechrt.backends.torch.{family}")
        return m.build(model, dev, dtype, self.kernels, ThreadPolicy.build(dev, step_threads))

    def asr(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("asr", model, device, dtype, step_threads)

    def lm(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("lm", model, device, dtype, step_threads)

    def tts(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("tts", model, device, dtype, step_threads)
