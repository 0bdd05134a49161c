"""Language-model runner of the `triton` backend: the torch runner built with the Triton kernel set, with
decode steps over contiguous slots replayed from CUDA graphs (HIP graphs on ROCm).

A SmolLM2-135M decode step is some 400 kernels of a few microseconds each: launched one by one from
Python, a step of two sequences took 17-37 ms on an H200 (docs/gpu.md), replayed from a graph 1.2 ms: the
launches go at once. Graphs need fixed shapes and addresses, so a step over the N contiguous slots
s0..s0+N-1 runs models.llama.Llama.decode_range on static token / position buffers, attending over the
whole cache masked by each slot's length. One graph per (cache, s0, N); prompts, and steps over slots
that are not contiguous, run eagerly.
"""
from __future__ import annotations

import torch

from speechrt.models.llama import contiguous

from .cuda_graphs import CapturedStep, GraphCache
from .torch_lm import TorchLMRunner, build as build_torch

MAX_GRAPHS = 16  # (first slot, batch) pairs in flight; each graph pins the cache and a small memory pool


class _DecodeGraph:
    """One captured decode step for slots s0..s0+n-1 of `cache`: tokens [n], positions [n] -> logits."""

    def __init__(self, model, cache, s0: int, n: int):
        dev = cache.k.device
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.zeros(n, dtype=torch.long, device=dev)
        self.step = CapturedStep(lambda: model.decode_range(cache, s0, self.tokens, self.pos, cache.max_seq))

    def __call__(self, tokens: torch.Tensor, pos: list[int]) -> torch.Tensor:
        self.tokens.copy_(tokens, non_blocking=True)
        self.pos.copy_(torch.tensor(pos), non_blocking=True)
        return self.step()


class TritonLMRunner(TorchLMRunner):
    def __init__(self, *args, graphs: bool = True, **kw):
        super().__init__(*args, **kw)
        self.graphs_enabled = graphs and self.device.type == "cuda"
        self.graphs = GraphCache(MAX_GRAPHS)

    @torch.inference_mode()
    def decode_step(self, cache, slots, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        slots = list(slots)
        if not self.graphs_enabled or not contiguous(slots):
            return super().decode_step(cache, slots, tokens)
        pos = cache.next_positions(slots)
        key = (cache.k.data_ptr(), cache.v.data_ptr(), slots[0], len(slots))
        g = self.graphs.get(key, lambda: _DecodeGraph(self.model, cache, slots[0], len(slots)))
        logits = g(tokens.to(self.device), pos)
        cache.advance(slots, pos)
        return logits


def build(model, device: torch.device, dtype: str | None, kernels: str = "triton", threads=None) -> TritonLMRunner:
    return build_torch(model, device, dtype, kernels, threads, runner_class=TritonLMRunner)
