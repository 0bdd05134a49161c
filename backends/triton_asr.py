"""ASR runner of the `triton` backend: the torch runner built with the Triton kernel set, with every
single-token decoder step replayed from a CUDA graph (HIP graph on ROCm).

A decode step launches some 15 kernels per layer, each too short to hide its launch cost; a graph
launches them all at once. Graphs need fixed shapes and addresses, so the steps run through the
model's fixed-shape path (Whisper.decoder with a `position` tensor: cache write by index, attention
over the whole cache masked by length) on static input buffers, and reordering beams copies the
cache rows in place instead of allocating new tensors. One graph per (batch rows, cache and
cross-attention tensors); prompts (several tokens) run eagerly.

Run on an NVIDIA H200 (docs/gpu.md): replayed logits equal the eager steps', 8x faster per step; on the
CPU the fixed-shape path is tested against the offset path.
"""
from __future__ import annotations

import torch

from .cuda_graphs import CapturedStep, GraphCache
from .torch_asr import TorchASRRunner, load_weights, parse_dtype

MAX_GRAPHS = 8  # beam sizes / window batches in flight; each graph pins its cache tensors


class _StepGraph:
    """One captured decoder step over fixed buffers: tokens [N, 1], position [1] -> logits [N, vocab]."""

    def __init__(self, model, state, n):
        dev = state.caches[0][0].device
        self.tokens = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.position = torch.zeros((1,), dtype=torch.long, device=dev)
        caches, cross, cross_lengths = state.caches, state.cross, state.cross_lengths
        self.step = CapturedStep(lambda: model.decoder(self.tokens, caches, 0, cross, position=self.position,
                                                       cross_lengths=cross_lengths))

    def __call__(self, tokens, position: int):
        self.tokens.copy_(tokens, non_blocking=True)
        self.position.fill_(position)
        return self.step()


class TritonASRRunner(TorchASRRunner):
    def __init__(self, weights, device, dtype, model_name: str = "", model_format: str = "", graphs: bool = True):
        super().__init__(weights, device, dtype, "triton", None, model_name, model_format)
        self.graphs_enabled = graphs and device.type == "cuda"
        self._graphs = GraphCache(MAX_GRAPHS)

    def _graph_for(self, state, n):
        key = (n, *(t.data_ptr() for kv in (*state.caches, *state.cross) for t in kv),
               None if state.cross_lengths is None else state.cross_lengths.data_ptr())
        return self._graphs.get(key, lambda: _StepGraph(self.model, state, n))

    @torch.inference_mode()
    def decode_step(self, state, tokens, last_only=True):
        if not self.graphs_enabled or tokens.shape[1] != 1:
            return super().decode_step(state, tokens, last_only)
        if state.offset + 1 > state.caches[0][0].shape[2]:
            raise RuntimeError(f"decoder cache full ({state.caches[0][0].shape[2]} positions)")
        logits = self._graph_for(state, tokens.shape[0])(tokens.to(self.device), state.offset)
        state.offset += 1
        return logits

    @torch.inference_mode()
    def reorder(self, state, index):
        n = state.caches[0][0].shape[0]
        if not self.graphs_enabled or index.numel() != n:
            return super().reorder(state, index)
        for kv in (*state.caches, *state.cross):  # in place: the captured graphs keep their addresses
            for t in kv:
                t.copy_(t.index_select(0, index.to(t.device)))
        if state.cross_lengths is not None:
            state.cross_lengths.copy_(state.cross_lengths.index_select(0, index.to(state.cross_lengths.device)))
        return state


def build(model, device, dtype, kernels: str = "triton", threads=None) -> TritonASRRunner:
    return TritonASRRunner(load_weights(model), device, parse_dtype(dtype, device), model.name, model.format)
