"""Decode steps replayed from CUDA graphs (HIP graphs on ROCm), shared by the `triton` backend's runners.

A decode step of a small model launches hundreds of short kernels, each too short to hide its launch
cost; a graph launches them all at once. A graph replays fixed addresses: the step reads its inputs from
buffers the caller fills before each replay, and its output buffer is overwritten by the next replay.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch


class CapturedStep:
    """`fn()` (reading only fixed buffers, returning a tensor) captured into a graph on the first call and
    replayed on later ones; each call returns a copy of the output."""

    def __init__(self, fn: Callable[[], torch.Tensor]):
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            # warm-up off the capture: Triton compiles, the allocator settles. It runs the real step on the
            # buffers as they are, so it writes what the replay writes next (the same cache slots).
            with torch.cuda.stream(s):
                for _ in range(2):
                    self.fn()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.fn()
        self.graph.replay()
        return self.out.clone()


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
