"""Language-model runner of the `triton` backend: the torch runner built with the Triton kernel set, with
decode steps replayed from CUDA graphs (HIP graphs on ROCm).

A SmolLM2-135M decode step is some 400 kernels of a few microseconds each: launched one by one from
Python, a step of two sequences took 17-37 ms on an H200 (docs/gpu.md), replayed from a graph 1.2 ms: the
launches go at once. Graphs need fixed shapes and addresses, so a step runs models.llama.Llama.decode_range
over slots 0..n-1 on static token / position buffers, attending over the whole cache masked by each slot's
length; n is the power of two (at most the cache's slots) that covers the highest slot stepped, so one graph
per (cache, n) serves any set of slots. (Graphs were keyed on a contiguous range of slots before; a
conversation keeps its slot between turns, its prefix cached, so the slots replying at once are often not
contiguous, and those steps ran eagerly.) The rows not stepped write their next position, past what they
hold, which nothing reads before it is written again; their logits are dropped. A step where one of them is
full runs eagerly.

Prompts from position 0 (a new conversation, or prompts that join together) are padded to a bucket of
PREFILL_BUCKETS tokens (cut to the cache's length) and run as Llama.prefill_rows on static buffers, the
slots given as a device tensor: one graph per (cache, N, bucket) serves any slots and any lengths up to
the bucket. Eager, a 37-token prompt took 21-35 ms of launches on an H100, from its graph 1.8 ms (docs/gpu.md).
Prompts that continue a cached prefix (start > 0), or longer than the largest bucket, run eagerly.

The decode graphs run the step in the fused layer kernels (models/llama_fused.py, kernels/triton_fused.py: four
launches per layer plus decode attention, against some 13 unfused; on int4 / int8 / fp8 weights
kernels/triton_fused_quant.py's, which dequantize in registers) unless `fused=False`, the kernel set is not
Triton, or `fused_unsupported` refuses the model (a config field the kernels do not compute); `fused_why` says
which. The unfused step stays the reference they are tested against.
"""

from __future__ import annotations

import logging
from functools import partial

import torch

from speechrt.models.llama_fused import FLOAT_FORMATS, decode_range_fused, fused_unsupported

from ..base import check_prefill
from ..cuda_graphs import CapturedStep, GraphCache, rows_bucket
from ..decode_loop import DecodeLoop, repeat_width, stop_width
from ..torch.lm import TorchLMRunner
from ..torch.lm import build as build_torch

log = logging.getLogger(__name__)

MAX_GRAPHS = 16  # (cache, rows) pairs; each graph pins the cache and a small memory pool
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)  # prompt lengths a prefill graph is captured for
# blocks of several decode steps: (cache, rows, steps, sampling features, stop width, repeat window)
MAX_LOOP_GRAPHS = 32
MAX_PREFILL_GRAPHS = 12  # (batch, bucket) pairs; a 512-token bucket of 8 prompts pools ~100 MB (bf16, 135M)


def prefill_bucket(n: int, max_seq: int) -> int | None:
    """The smallest bucket that holds an n-token prompt, cut to the cache's length; None: run it eagerly
    (longer than the largest bucket or than the cache)."""
    if n > max_seq:
        return None
    b = next((b for b in PREFILL_BUCKETS if n <= b), None)
    return None if b is None else min(b, max_seq)


def range_rows(top: int, slots: int) -> int:
    """The rows of the decode graph that steps slots below `top`: their bucket, at most `slots`."""
    return min(rows_bucket(top), slots)


class _DecodeGraph:
    """One captured decode step over slots 0..n-1 of `cache`: tokens [n], positions [n] -> logits [n, vocab].
    `decode_range`: the model's, or the fused kernels' (models.llama_fused), with its arguments."""

    def __init__(self, decode_range, cache, n: int, capture: bool):
        dev = cache.k.device
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.zeros(n, dtype=torch.long, device=dev)
        self.step = CapturedStep(lambda: decode_range(cache, 0, self.tokens, self.pos, cache.max_seq), capture)

    def __call__(self, slots: list[int], tokens: torch.Tensor, pos: list[int]) -> torch.Tensor:
        """Logits [len(slots), vocab] of `tokens` fed to `slots`; `pos`: every row's position."""
        rows = torch.tensor(slots, device=self.tokens.device)
        self.tokens.zero_()
        self.tokens.index_copy_(0, rows, tokens)
        self.pos.copy_(torch.tensor(pos), non_blocking=True)
        return self.step().index_select(0, rows)


class _PrefillGraph:
    """One captured prefill of N prompts padded to `t` tokens: any N slots of `cache`, any lengths <= t."""

    def __init__(self, model, cache, n: int, t: int, capture: bool):
        dev = cache.k.device
        self.rows = torch.zeros(n, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(n, t, dtype=torch.long, device=dev)
        self.last = torch.zeros(n, dtype=torch.long, device=dev)
        self.step = CapturedStep(lambda: model.prefill_rows(cache, self.rows, self.tokens, self.last), capture)

    def __call__(self, slots: list[int], prompts: list[torch.Tensor]) -> torch.Tensor:
        padded = torch.zeros(self.tokens.shape, dtype=torch.long)
        for i, p in enumerate(prompts):
            padded[i, : p.shape[0]] = p
        self.tokens.copy_(padded)
        self.rows.copy_(torch.tensor(slots))
        self.last.copy_(torch.tensor([p.shape[0] - 1 for p in prompts]))
        return self.step()


class TritonLMRunner(TorchLMRunner):
    def __init__(self, *args, graphs: bool = True, capture: bool | None = None, fused: bool = True, **kw):
        """`graphs`: decode steps and prompts on static buffers, captured as graphs on a GPU. `capture`
        (default: on CUDA/HIP devices) False runs that path uncaptured: what the CPU tests check. `fused`: those
        decode steps in the fused layer kernels (kernels/triton_fused.py) where the model and the kernel set
        allow (`fused_why` says why not); False keeps the unfused path, the reference they are tested against."""
        super().__init__(*args, **kw)
        self.fused_why = self._fused_why(fused)
        self.decode_range = self.model.decode_range
        if self.fused_why is None:
            from speechrt.kernels.triton_fused import OPS as FUSED
            from speechrt.kernels.triton_fused_quant import OPS as FUSED_QUANT

            ops = FUSED if self.model.weight_format in FLOAT_FORMATS else FUSED_QUANT
            self.decode_range = partial(decode_range_fused, self.model, ops)
        else:
            log.info("decode steps unfused: %s", self.fused_why)
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.graphs_enabled = graphs and (self.capture or capture is False)
        self.graphs = GraphCache(MAX_GRAPHS)
        self.prefill_graphs = GraphCache(MAX_PREFILL_GRAPHS)
        self.prefill_graphs_enabled = True
        self.loops = GraphCache(MAX_LOOP_GRAPHS)
        self.loops_enabled = True  # False after a block this device refused: one step at a time from then on
        # the repetition stop's step in a block: one Triton launch with the Triton kernel set, else the torch ops
        if self.ops.sources.get("linear") == "triton":
            from speechrt.kernels.triton_repeats import repeat_advance
        else:
            from speechrt.kernels.reference_repeats import repeat_advance
        self.repeat_advance = repeat_advance

    def _fused_why(self, fused: bool) -> str | None:
        """Why decode steps run unfused, or None: they run in the fused kernels."""
        if not fused:
            return "off by request (fused=False)"
        if self.ops.sources.get("linear") != "triton":
            return f"the kernel set is {self.ops.impl!r}, not Triton"
        return fused_unsupported(self.model.cfg, self.model.weight_format)

    def _prefill_graph(self, cache, slots: list[int], prompts: list[torch.Tensor]) -> torch.Tensor | None:
        """Logits [N, vocab] of prompts run from position 0 through a captured graph, or None where none
        applies (graphs off, a prompt too long for the buckets)."""
        if not (self.graphs_enabled and self.prefill_graphs_enabled):
            return None
        t = prefill_bucket(max(int(p.shape[0]) for p in prompts), cache.max_seq)
        if t is None:
            return None
        key = (cache.k.data_ptr(), cache.v.data_ptr(), len(slots), t)
        try:
            g = self.prefill_graphs.get(key, lambda: _PrefillGraph(self.model, cache, len(slots), t, self.capture))
            logits = g(slots, [p.cpu() for p in prompts])
        except Exception:  # noqa: BLE001 - a capture this device refuses: prompts run eagerly from now on
            log.exception(
                "prefill graph of %d prompt(s) padded to %d tokens failed; prompts run eagerly", len(slots), t
            )
            self.prefill_graphs_enabled = False
            self.prefill_graphs = GraphCache(MAX_PREFILL_GRAPHS)
            return None
        for s, p in zip(slots, prompts):
            cache.lengths[s] = int(p.shape[0])
        return logits

    @torch.inference_mode()
    def prepare(self, cache, slot: int) -> None:
        """Capture the one-prompt prefill graph of every bucket the cache holds (through free `slot`) and the
        decode graph of every row count, so that no request pays for a capture (~3 eager steps each);
        prefill graphs of several prompts at once are captured on first use. The other slots keep what
        they hold (a decode step writes past it, and their lengths are put back)."""
        for t in sorted({min(b, cache.max_seq) for b in PREFILL_BUCKETS}):
            self.prefill(cache, slot, torch.zeros(t, dtype=torch.long))
        self.release(cache, slot)
        if self.graphs_enabled:
            for n in sorted({range_rows(top, cache.max_batch) for top in range(1, cache.max_batch + 1)}):
                held = cache.lengths[n - 1]
                if held < cache.max_seq:
                    self.decode_step(cache, [n - 1], torch.zeros(1, dtype=torch.long))
                    cache.lengths[n - 1] = held

    @torch.inference_mode()
    def prefill(self, cache, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        if start == 0:
            check_prefill(cache, slot, int(tokens.shape[0]), start)
            logits = self._prefill_graph(cache, [slot], [tokens])
            if logits is not None:
                return logits[0]
        return super().prefill(cache, slot, tokens, start)

    @torch.inference_mode()
    def prefill_many(self, cache, jobs):
        """Prompts from position 0 into distinct slots: one graph replay for all of them (padding costs
        little next to launches on a GPU); anything else as the torch runner does."""
        slots = [j[0] for j in jobs]
        if len(jobs) > 1 and all(j[2] == 0 for j in jobs) and len(set(slots)) == len(slots):
            try:
                for slot, tokens, _ in jobs:
                    check_prefill(cache, slot, int(tokens.shape[0]), 0)
            except ValueError:  # run one by one below, where each error reaches its own prompt
                return super().prefill_many(cache, jobs)
            logits = self._prefill_graph(cache, slots, [j[1] for j in jobs])
            if logits is not None:
                return list(logits)
        return super().prefill_many(cache, jobs)

    @torch.inference_mode()
    def decode_step(self, cache, slots, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        slots = list(slots)
        n = range_rows(max(slots) + 1, cache.max_batch)
        pos = cache.next_positions(slots)  # (checks that the stepped slots have room)
        rows = cache.lengths[:n]  # every row writes at its length: the stepped ones their token's position
        if not self.graphs_enabled or len(set(slots)) < len(slots) or max(rows) >= cache.max_seq:
            return super().decode_step(cache, slots, tokens)
        g = self.graphs.get(
            (cache.k.data_ptr(), cache.v.data_ptr(), n), lambda: _DecodeGraph(self.decode_range, cache, n, self.capture)
        )
        logits = g(slots, tokens.to(self.device), rows)
        cache.advance(slots, pos)
        return logits

    @torch.inference_mode()
    def decode_loop(
        self, cache, slots, tokens: torch.Tensor, rows, steps: int, left: list[int], stops: list, repeats=None
    ):
        """`steps` decode steps of `slots` in one call (backends/decode_loop.py: one graph replay on a GPU):
        tokens [N] (host values) fed first, then each row's sampled token, with the sampling options `rows`
        (backends.sampling.SamplingRows of N rows, built by SamplingRows.one / stack); a row stops after one of
        its `stops` ids, `left` tokens, or a token that ends its output in a loop (`repeats`: per row
        (stop_repeats, its output tokens so far), or None: no row has the repetition stop;
        backends/token_repeats.py)
        -> (each row's `steps` tokens, how many of them it made), each slot's length advanced by the latter.
        None where the block cannot run (graphs off, a slot given twice, a row of the range full, a budget
        past the cache): the caller steps one at a time. `steps` must not exceed any `left`."""
        slots = [int(s) for s in slots]
        n = range_rows(max(slots) + 1, cache.max_batch)
        pos = cache.next_positions(slots)
        lengths = cache.lengths[:n]
        if (
            not (self.graphs_enabled and self.loops_enabled)
            or len(set(slots)) < len(slots)
            or max(lengths) >= cache.max_seq
            or any(p + steps > cache.max_seq or steps > a for p, a in zip(pos, left))
        ):
            return None
        width, vocab = stop_width(stops), self.config.vocab_size
        window = repeat_width([t for t, _ in repeats or ()])
        key = (cache.k.data_ptr(), cache.v.data_ptr(), n, steps, rows.features, width, window)
        try:  # the cache's lengths change only below, so a block that fails leaves the one-step path intact
            loop = self.loops.get(
                key,
                lambda: DecodeLoop(
                    self.decode_range,
                    cache,
                    n,
                    steps,
                    rows.features,
                    vocab,
                    width,
                    self.capture,
                    window,
                    self.repeat_advance,
                ),
            )
            ids, ran = loop(slots, tokens, lengths, rows, left, stops, repeats)
        except Exception:  # noqa: BLE001 - a capture this device refuses: decode one step at a time from now on
            log.exception("a decode block of %d steps over %d rows failed; decoding one step at a time", steps, n)
            self.loops_enabled = False
            self.loops = GraphCache(MAX_LOOP_GRAPHS)
            return None
        for s, p, r in zip(slots, pos, ran):
            cache.lengths[s] = p + r
        return ids, ran


def build(model, device: torch.device, dtype: str | None, kernels: str = "triton", threads=None) -> TritonLMRunner:
    return build_torch(model, device, dtype, kernels, threads, runner_class=TritonLMRunner)
