"""Decode steps replayed from CUDA graphs (HIP graphs on ROCm), shared by the `triton` backend's runners.

A decode step of a small model launches hundreds of short kernels, each too short to hide its launch
cost; a graph launches them all at once. A graph replays fixed addresses: the step reads its inputs from
buffers the caller fills before each replay, and its output buffer is overwritten by the next replay.
"""

from __future__ import annotations

import gc
import logging
from collections import OrderedDict
from collections.abc import Callable

import torch

log = logging.getLogger("speechrt.graphs")


def rows_bucket(n: int) -> int:
    """The rows of the graph that serves a batch of n: the next power of two (a few graphs serve every size)."""
    return 1 << max(0, n - 1).bit_length()


class CapturedStep:
    """`fn()` (reading only fixed buffers, returning a tensor) captured into a graph on the first call and
    replayed on later ones; each call returns a copy of the output. `capture=False` runs `fn` every call (the
    CPU, and tests of what is captured). A capture that fails (an operation the capture does not allow) is
    logged and counted (`failed`), and that step runs eagerly from then on: the server keeps serving."""

    captured = 0  # graphs captured in this process
    failed = 0  # captures that failed (their steps run eagerly)

    def __init__(self, fn: Callable[[], torch.Tensor], capture: bool = True):
        self.fn = fn
        self.capture = capture
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        if self.graph is None and self.capture:
            try:
                self.graph, self.out = self._capture()
                CapturedStep.captured += 1
            except RuntimeError as e:
                CapturedStep.failed += 1
                self.capture = False
                log.warning("a CUDA graph capture failed; this step runs eagerly from now on: %s", e)
                torch.cuda.synchronize()  # a failed capture leaves nothing pending (an error here is a real one)
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out.clone()

    def _capture(self):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        # warm-up off the capture: Triton compiles, the allocator settles. It runs the real step on the
        # buffers as they are, so it writes what the replay writes next (the same cache slots).
        with torch.cuda.stream(s):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        # No garbage collection inside the capture: freeing an old graph or its memory there is an operation
        # a capture does not allow. "thread_local": what other threads do on the device (the language model's
        # steps beside the recognizer's) cannot spoil this thread's capture.
        gc.collect()
        enabled, stream = gc.isenabled(), torch.cuda.current_stream()
        gc.disable()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = self.fn()
        finally:
            if enabled:
                gc.enable()
            torch.cuda.set_stream(stream)  # a capture_end that raises leaves the capture's stream current
        return graph, out


class GraphCache:
    """At most `limit` captured steps by key, the least recently used dropped first (each graph pins the
    tensors it reads and its own memory pool)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.items: OrderedDict = OrderedDict()

    def get(self, key, make):
        g = self.items.get(key)
        if g is None:
            if len(self.items) >= self.limit:
                self.items.popitem(last=False)
            g = self.items[key] = make()
        else:
            self.items.move_to_end(key)
        return g

    def __len__(self) -> int:
        return len(self.items)
