"""The `torch` backend: the PyTorch model definitions run eagerly on CPU, CUDA or ROCm, built with the
torch reference kernel set. Each family's runner lives in its own module (torch_asr, torch_slm, torch_tts)."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with `n` intra-op threads on this thread (OpenMP's thread count is per calling
    thread); None leaves it as it is.

    A decode step is ~100 small ops; with several threads each one ends in a barrier that stalls for a
    whole scheduler slice whenever another process holds a core (steps ran 20x slower on a shared
    2-core machine). One thread does small ops as fast and never waits."""
    if n is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls run natively (AVX512-BF16 / AMX) rather than emulated."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class TorchBackend(Backend):
    name = "torch"
    kernels = KERNELS

    def _build(self, family, model, device, dtype, **options):
        m = importlib.import_module(f"speechrt.backends.torch_{family}")
        return m.build(model, resolve_device(device), dtype, kernels=self.kernels, **options)

    def asr(self, model, device="cpu", dtype=None, loop_threads=None):
        """loop_threads=1: the decoding loop's small ops on one CPU thread (for servers sharing the cores)."""
        return self._build("asr", model, device, dtype, loop_threads=loop_threads)

    def slm(self, model, device="cpu", dtype=None):
        return self._build("slm", model, device, dtype)

    def tts(self, model, device="cpu", dtype=None):
        return self._build("tts", model, device, dtype)
