"""Language-model runner of the `onnxruntime` backend: the exported Llama graph (export/llama_onnx.py,
variant 'ort') over a slot-addressed KV cache held in torch tensors and bound in place.

The cache is [layers] x [slots, Hkv, max_seq + 1, D] for keys and values (the last position a scratch
column). A step binds, per layer, the rows of a contiguous range of slots as both past_* and present_*;
GroupQueryAttention writes each row's new keys at its position (`seqlens_k`) and attends over its own
length. Slots inside the range that are not in the step ride along as filler rows: they write at their own
length (past what they hold, so nothing they keep is touched) or, for a full slot, at the scratch column.
Bindings of decode steps are kept per (first slot, rows): a step writes its token ids, positions and total
length into tensors those bindings already point at, and runs.

A block-quantized export has a second graph for prompts (`prefill`: the same blocks, shared on disk with the
decode graph, dequantized to float32 weights when the session loads, export/llama_onnx.py LlamaGraph rows);
decode steps run the quantized blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from speechrt.errors import UserError

from ..base import LMRunner, RunnerInfo, check_cache_size, check_prefill
from ..dtypes import TORCH
from ..threads import ThreadPolicy, cpu_threads
from .binding import bind, providers_device, run_bound


@dataclass
class OrtKVCache:
    k: torch.Tensor  # [layers, slots, Hkv, max_seq + 1, D]
    v: torch.Tensor
    lengths: list[int] = field(default_factory=list)
    bindings: dict = field(default_factory=dict, repr=False)  # (first slot, rows) -> _Step

    @property
    def max_batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_seq(self) -> int:
        return self.k.shape[3] - 1


class _Step:
    """An IOBinding for `rows` slots from `s0`, one token each, with its input tensors."""

    def __init__(self, session, cache: OrtKVCache, s0: int, rows: int, vocab: int):
        dev = cache.k.device
        self.ids = torch.zeros(rows, 1, dtype=torch.int64, device=dev)
        self.seqlens = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.total = torch.zeros((), dtype=torch.int32)  # on the CPU: GroupQueryAttention reads it there on every EP
        self.logits = torch.empty(rows, vocab, dtype=torch.float32, device=dev)
        self.io = bind_step(session, cache, s0, rows, self.ids, self.seqlens, self.total, self.logits)


def bind_step(session, cache, s0, rows, ids, seqlens, total, logits):
    io = session.io_binding()
    bind(io, "input_ids", ids)
    bind(io, "seqlens_k", seqlens)
    bind(io, "total_sequence_length", total)
    for i in range(cache.k.shape[0]):
        for kind, buf in (("key", cache.k), ("value", cache.v)):
            rows_view = buf[i, s0 : s0 + rows]
            bind(io, f"past_{kind}.{i}", rows_view)
            bind(io, f"present_{kind}.{i}", rows_view, output=True)
    bind(io, "logits", logits, output=True)
    return io


class OrtLMRunner(LMRunner):
    def __init__(
        self,
        directory: Path,
        manifest,
        providers,
        threads: ThreadPolicy,
        model_name: str = "",
        intra_op_threads: int | None = None,
    ):
        from speechrt.export.lm_export import config_from_dict
        from speechrt.models.lm_text import LMTokenizer

        from .providers import session

        if manifest.variant != "ort":
            raise UserError(
                f"{directory}: a '{manifest.variant}' graph is for TensorRT; the onnxruntime runner "
                "runs the 'ort' variant (speechrt export lm --variant ort)"
            )
        self.manifest = manifest
        self.config = config_from_dict(manifest.config)
        self.tokenizer = LMTokenizer.load(directory, manifest.extra["tokenizer"])
        self.chat_template = manifest.extra.get("chat_template")
        # decode steps come back to back: the pool's threads spin between them instead of sleeping (a step is
        # ~670 small nodes, and waking a sleeping thread for each cost ~1.5 ms of a ~9 ms step: SmolLM2-135M
        # int4, AMD EPYC AVX2, 2 threads); loop() keeps the caller's torch ops off the spinning core
        self.session = session(str(directory / manifest.graph("model").file), providers, intra_op_threads, spin=True)
        # prompts run a graph of their own where the export has one (the blocks dequantized to float32 weights
        # as it loads); its threads sleep when it ends, so that they do not spin beside the decode steps that follow
        self.prefill_session = (
            session(
                str(directory / manifest.graph("prefill").file),
                providers,
                intra_op_threads,
                spin=False,
                fold_dequantize=True,
            )
            if "prefill" in manifest.graphs
            else self.session
        )
        self.device = providers_device(self.session.get_providers())
        self.cache_dtype = TORCH[manifest.cache["dtype"]]
        self.threads = threads
        self.info = RunnerInfo(
            "onnxruntime",
            model_name or manifest.model,
            "speechrt-onnx",
            manifest.precision,
            str(self.device),
            f"{intra_op_threads or 'all'} ORT threads; " + ", ".join(self.session.get_providers()),
        )

    def loop(self):
        """One torch thread for the sampling between steps on the CPU: a second one would share a core with
        the decode session's spinning thread (2 cores: 13.9 ms a step instead of 5.5)."""
        return cpu_threads(1) if self.threads.cpu else self.threads.small()

    def new_cache(self, max_batch: int, max_seq: int) -> OrtKVCache:
        cfg = self.config
        check_cache_size(max_batch, max_seq)
        if max_seq > cfg.max_seq_len:
            raise ValueError(f"max_seq {max_seq} exceeds the model's context length {cfg.max_seq_len}")
        shape = (cfg.n_layers, max_batch, cfg.n_kv_heads, max_seq + 1, cfg.head_dim)
        return OrtKVCache(
            torch.zeros(shape, dtype=self.cache_dtype, device=self.device),
            torch.zeros(shape, dtype=self.cache_dtype, device=self.device),
            [0] * max_batch,
        )

    @torch.inference_mode()
    def prefill(self, cache: OrtKVCache, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = tokens.shape[0]
        end = start + T
        check_prefill(cache, slot, T, start)
        dev = self.device
        ids = tokens.to(dev, torch.int64).reshape(1, T).contiguous()
        seqlens = torch.tensor([end - 1], dtype=torch.int32, device=dev)
        total = torch.tensor(end, dtype=torch.int32)  # on the CPU, as in _Step
        logits = torch.empty(1, self.config.vocab_size, dtype=torch.float32, device=dev)
        io = bind_step(self.prefill_session, cache, slot, 1, ids, seqlens, total, logits)
        run_bound(self.prefill_session, io, dev)
        cache.lengths[slot] = end
        return logits[0]

    @torch.inference_mode()
    def decode_step(self, cache: OrtKVCache, slots, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        slots = list(slots)
        S = cache.max_seq
        if any(cache.lengths[s] >= S for s in slots):
            raise ValueError(f"a sequence reached the cache's {S} positions per slot")
        s0, s1 = min(slots), max(slots) + 1
        key = (s0, s1 - s0)
        step = cache.bindings.get(key)
        if step is None:
            step = cache.bindings[key] = _Step(self.session, cache, s0, s1 - s0, self.config.vocab_size)
        # filler rows (slots in the range that do not step) write at their own length, or the scratch column
        pos = [min(cache.lengths[s], S) for s in range(s0, s1)]
        rows = [s - s0 for s in slots]
        ids = [0] * (s1 - s0)
        for r, t in zip(rows, tokens.tolist()):
            ids[r] = t
        step.ids.copy_(torch.tensor(ids).view(-1, 1))
        step.seqlens.copy_(torch.tensor(pos, dtype=torch.int32))
        step.total.fill_(max(pos) + 1)
        run_bound(self.session, step.io, self.device)
        for s in slots:
            cache.lengths[s] += 1
        if rows == list(range(s1 - s0)):
            return step.logits.clone()
        return step.logits[torch.tensor(rows, device=self.device)]
