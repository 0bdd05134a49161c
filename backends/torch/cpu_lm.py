"""Language-model runner of the `torch` backend for int4 on x86 CPUs with AVX2: prompts and decode steps in
kernels/cpu_decode (4-bit blocks read once per step; float32 activations quantized per block of 32 at each
matmul: to int8 in decode steps, as llama.cpp and ONNX Runtime's int4 graphs do, to two int8 terms (~14 bits)
in prompts, whose matmuls are bound by compute; fp16 KV cache), through ctypes.

`TorchLMRunner` keeps int4 on ATen's weight-only kernels (bf16 activations) where this one cannot run: not
x86-64 with AVX2/FMA/F16C, no C compiler to build the kernel, a model shape it does not take, or
SPEECHRT_CPU_DECODE=0.
"""

from __future__ import annotations

import torch

from speechrt.kernels import cpu_decode
from speechrt.models.llama import KVCache, rope_tables
from speechrt.models.llama_layers import quantize_int4

from ..base import LMRunner, RunnerInfo, check_cache_size, check_prefill
from ..threads import ThreadPolicy, cpu_threads
from . import cpu_lm_cache


def unavailable(cfg) -> str | None:
    """None where CpuInt4LMRunner runs a model of `cfg` here; otherwise why not."""
    return cpu_decode.unavailable() or cpu_decode.CpuLlama.unsupported(cfg)


def block_weights(lm_file) -> tuple[dict, dict]:
    """(float weights, 4-bit blocks): a GGUF's Q4_0 / Q4_1 blocks as they are (its other linear weights take
    8-bit blocks in the kernel); a float checkpoint's linear weights quantized to 4 bits by min/max."""
    if lm_file.q4:
        return lm_file.weights, lm_file.q4
    return lm_file.weights, {n: quantize_int4(lm_file.weights[n]) for n in cpu_decode.CpuLlama.needs(lm_file.config)}


class CpuInt4LMRunner(LMRunner):
    def __init__(
        self,
        lm_file,
        device: torch.device,
        weight_format: str,
        kernels: str = "torch",
        threads: ThreadPolicy | None = None,
        model_name: str = "",
        model_format: str = "",
    ):
        cfg = lm_file.config
        self.device, self.config = device, cfg
        self.tokenizer, self.chat_template = lm_file.tokenizer, lm_file.chat_template
        self.threads = threads or ThreadPolicy.build(device, None)
        # the layout's many small copies on one thread: with two, each op's barrier waits out any other process
        # holding a core (a loaded 2-core VM: 9.5-14 s and 4-6 CPU s for SmolLM2's weights, 1.4-1.6 s and 0.6
        # CPU s on one thread)
        with cpu_threads(1):
            weights, q4 = block_weights(lm_file)
            local = cfg.local_rope()  # Gemma 3's sliding-window layers: their own rotary base
            self.model = cpu_lm_cache.build(
                lm_file.source,
                cpu_decode.CpuLlama,
                cfg,
                weights,
                q4,
                *rope_tables(cfg),
                self.threads.total,
                rope_tables(local) if local else None,
            )
        self.info = RunnerInfo(
            kernels,
            model_name,
            model_format,
            weight_format,
            str(device),
            f"AVX2 kernel (kernels/cpu_decode) on {self.threads.total} threads, activations in "
            "int8 blocks at each matmul (prompts in two), fp16 KV cache",
        )

    def loop(self):
        """One torch thread for the sampling between steps: the kernel's threads spin there for a moment."""
        return cpu_threads(1)

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        check_cache_size(max_batch, max_seq)
        k, v = self.model.new_cache(max_batch, max_seq)
        return KVCache(k, v, [0] * max_batch)

    def _rows(self, cache: KVCache, rows: list[tuple[int, int, int]], outs: list[int], fine: bool) -> torch.Tensor:
        """(slot, position, token) rows in order, as many a call as the kernel takes -> the logits of rows `outs`
        [len, vocab]. `fine`: prompts, their matmuls' inputs in two int8 terms (see CpuLlama)."""
        got, n = [], self.model.max_rows // (2 if fine else 1)
        for c in range(0, len(rows), n):
            part = rows[c : c + n]
            sl, ps, tk = (list(x) for x in zip(*part))
            mine = [i - c for i in outs if c <= i < c + len(part)]
            got.append(self.model(cache.k, cache.v, sl, ps, tk, mine, fine=fine))
        return torch.cat(got)

    @torch.inference_mode()
    def prefill(self, cache: KVCache, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = int(tokens.shape[0])
        check_prefill(cache, slot, T, start)
        logits = self._rows(cache, [(slot, start + i, t) for i, t in enumerate(tokens.tolist())], [T - 1], True)[0]
        cache.lengths[slot] = start + T
        return logits

    @torch.inference_mode()
    def prefill_many(self, cache: KVCache, jobs):
        """All prompts' rows together, up to max_rows a call; a prompt that does not fit, or a failing call,
        sends them one by one (so that only the bad prompt's caller gets its error)."""
        slots = [j[0] for j in jobs]
        rows, outs = [], []
        try:
            if len(set(slots)) != len(slots):
                raise ValueError("two prompts for one slot")
            for slot, tokens, start in jobs:
                check_prefill(cache, slot, int(tokens.shape[0]), start)
                rows += [(slot, start + i, t) for i, t in enumerate(tokens.tolist())]
                outs.append(len(rows) - 1)
            logits = self._rows(cache, rows, outs, True)
        except Exception:  # noqa: BLE001 - retried one by one, where each error reaches its own prompt
            return super().prefill_many(cache, jobs)
        for slot, tokens, start in jobs:
            cache.lengths[slot] = start + int(tokens.shape[0])
        return list(logits)

    @torch.inference_mode()
    def decode_step(self, cache: KVCache, slots, tokens: torch.Tensor) -> torch.Tensor:
        slots = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        pos = cache.next_positions(slots)
        logits = self._rows(cache, list(zip(slots, pos, tokens.tolist())), list(range(len(slots))), False)
        cache.advance(slots, pos)
        return logits
