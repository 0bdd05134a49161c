"""ASR runner of the `triton` backend: the torch runner built with the Triton kernel set, with every
single-token decoder step replayed from a CUDA graph (HIP graph on ROCm).

A decode step launches some 15 kernels per layer, each too short to hide its launch cost; a graph
launches them all at once. Graphs need fixed shapes and addresses, so the steps run through the
model's fixed-shape path (Whisper.decoder with a `position` tensor: cache write by index, attention
over the whole cache masked by length) on static input buffers, and reordering beams copies the
cache rows in place instead of allocating new tensors. One graph per (batch rows, cache and
cross-attention tensors); prompts (several tokens) run eagerly.

Not yet run on a GPU: the fixed-shape path is tested on the CPU against the offset path; the capture
and replay themselves need a device.
"""
from __future__ import annotations

import torch

from .torch_asr import TorchASRRunner, load_weights, parse_dtype

MAX_GRAPHS = 8  # beam sizes / window batches in flight; each graph pins its cache tensors


class _StepGraph:
    """One captured decoder step over fixed buffers: tokens [N, 1], position [1] -> logits [N, vocab]."""

    def __init__(self, model, state, n):
        dev = state.caches[0][0].device
        self.tokens = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.position = torch.zeros((1,), dtype=torch.long, device=dev)
        self.caches, self.cross, self.cross_lengths = state.caches, state.cross, state.cross_lengths

        def step():
            return model.decoder(self.tokens, self.caches, 0, self.cross, position=self.position,
                                 cross_lengths=self.cross_lengths)

        self.step = step
        self.graph = None
        self.out = None

    def __call__(self, tokens, position: int):
        self.tokens.copy_(tokens, non_blocking=True)
        self.position.fill_(position)
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up: Triton compiles, allocator settles; writes the same slot
                for _ in range(2):
                    self.step()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.step()
        self.graph.replay()
        return self.out.clone()


class TritonASRRunner(TorchASRRunner):
    def __init__(self, weights, device, dtype, model_name: str = "", model_format: str = "", graphs: bool = True):
        super().__init__(weights, device, dtype, "triton", None, model_name, model_format)
        self.graphs_enabled = graphs and device.type == "cuda"
        self._graphs: dict[tuple, _StepGraph] = {}

    def _graph_for(self, state, n):
        key = (n, *(t.data_ptr() for kv in (*state.caches, *state.cross) for t in kv),
               None if state.cross_lengths is None else state.cross_lengths.data_ptr())
        g = self._graphs.get(key)
        if g is None:
            if len(self._graphs) >= MAX_GRAPHS:
                self._graphs.pop(next(iter(self._graphs)))
            g = self._graphs[key] = _StepGraph(self.model, state, n)
        return g

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
