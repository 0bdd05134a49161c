"""The `torch` backend: the PyTorch model definitions run eagerly on CPU, CUDA or ROCm, built with the
torch reference kernel set. Each family's runner lives in its own module (torch_asr, torch_lm, torch_tts);
how they use the CPU's threads is decided here, once, by ThreadPolicy."""

from __future__ import annotations

import contextlib
import importlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from speechrt.errors import UserError

from .base import Backend

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


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run the block with `n` intra-op threads on this thread (OpenMP's thread count is per calling
    thread); None leaves it as it is."""
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


@dataclass(frozen=True)
class ThreadPolicy:
    """How a torch runner uses the CPU's cores, fixed when the runner is built.

    A decode step is some hundred small ops. With several intra-op threads each one ends in a thread
    barrier, which stalls for a whole scheduler time slice whenever another process holds a core; one
    thread does small ops as fast and never waits. Large ops (the Whisper encoder, the vocabulary
    projection) gain from every core.

    step: threads for the small ops of a step and of the caller's loop around it (`small`); None: all.
    total: threads for large ops (`large`), and the number of one-thread workers that run independent
    pieces side by side (speech synthesis windows, `workers`): the thread count when the runner was built.
    On GPUs there is nothing to set: step is None and no workers are made."""

    step: int | None = None
    total: int = 1
    cpu: bool = True

    @classmethod
    def build(cls, device: torch.device, step: int | None) -> ThreadPolicy:
        if step is not None and step < 1:
            raise UserError(f"step threads must be >= 1 (or None: all threads), got {step}")
        cpu = device.type == "cpu"
        return cls(step if cpu else None, torch.get_num_threads(), cpu)

    def small(self) -> contextlib.AbstractContextManager:
        return cpu_threads(self.step)

    def large(self) -> contextlib.AbstractContextManager:
        # only needed when the caller narrowed this thread (inside small() or a runner's loop())
        return cpu_threads(self.total if self.step else None)

    def workers(self, name: str) -> ThreadPoolExecutor | None:
        """`total` worker threads with one intra-op thread each (CPU only)."""
        if not self.cpu:
            return None
        return ThreadPoolExecutor(
            max(1, self.total), thread_name_prefix=name, initializer=torch.set_num_threads, initargs=(1,)
        )

    def describe(self) -> str:
        if not self.cpu:
            return ""
        return f"{self.step or self.total} of {self.total} threads for small ops"


class TorchBackend(Backend):
    name = "torch"
    kernels = KERNELS
    families = ("asr", "lm", "tts")

    def _build(self, family, model, device, dtype, step_threads):
        from speechrt.models.registry import source_of

        model = source_of(model)  # an ONNX export runs here as the model it was exported from
        dev = resolve_device(device)
        m = importlib.import_module(f"speechrt.backends.torch_{family}")
        return m.build(model, dev, dtype, self.kernels, ThreadPolicy.build(dev, step_threads))

    def asr(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("asr", model, device, dtype, step_threads)

    def lm(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("lm", model, device, dtype, step_threads)

    def tts(self, model, device="cpu", dtype=None, step_threads=None):
        return self._build("tts", model, device, dtype, step_threads)
