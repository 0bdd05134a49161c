"""The CPU thread policy the backends' runners share: how a runner uses the CPU's cores (ThreadPolicy), fixed when
it is built, and the per-thread intra-op thread count it sets."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from speechrt.errors import UserError


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
