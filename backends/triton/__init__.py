"""The `triton` backend: the same PyTorch modules as the `torch` backend, built with the Triton kernel
set (kernels.select('triton', device)), on a CUDA or ROCm GPU only; ASR decoder steps and language-model
decode steps are replayed from CUDA/HIP graphs (asr.py, lm.py). On a machine without one it
refuses with an error naming the alternative instead of running the kernels slowly in an interpreter.
"""

from __future__ import annotations

import importlib

import torch

try:
    import triton  # noqa: F401
except ImportError as e:  # backends.get('triton') reports this with the backends that do work
    raise ImportError("Triton is not installed (pip install 'speechrt[triton]')") from e

from speechrt.errors import UserError

from ..threads import ThreadPolicy
from ..torch import TorchBackend, resolve_device


class TritonUnavailable(UserError, RuntimeError):
    pass


def check_device(device: torch.device) -> torch.device:
    if device.type != "cuda":
        if torch.cuda.is_available():
            hint = "pass --device cuda (device='cuda')"
        else:
            hint = (
                "no CUDA or ROCm GPU is visible to PyTorch here "
                f"(torch {torch.__version__}); use --backend torch for the CPU"
            )
        raise TritonUnavailable(
            f"backend 'triton' runs its Triton kernels on a CUDA or ROCm GPU, not on {device}: {hint}"
        )
    return device


class TritonBackend(TorchBackend):
    name = "triton"
    kernels = "triton"

    def _build(self, family, model, device, dtype, step_threads):
        # GPU only: the CPU thread policy of the torch runners does not apply
        dev = check_device(resolve_device(device))
        if family in ("asr", "lm"):  # decode steps replayed from CUDA/HIP graphs (asr.py, lm.py)
            from speechrt.models.registry import source_of

            m = importlib.import_module(f"speechrt.backends.triton.{family}")
            return m.build(source_of(model), dev, dtype, self.kernels, ThreadPolicy.build(dev, None))
        return super()._build(family, model, dev, dtype, None)
