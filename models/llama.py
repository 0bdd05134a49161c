"""Llama-family decoder (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3): config, rotary tables, KV cache.

RMSNorm -> grouped-query attention with rotary embedding -> residual -> RMSNorm -> SwiGLU MLP -> residual,
repeated `n_layers` times, then a final RMSNorm and the output head (tied to the embedding or not). The
architectures differ by config switches, not by model classes: `qkv_bias` (Qwen2: biases on the Q/K/V
projections), `qk_norm` (Qwen3: an RMSNorm over each head of Q and K before the rotary embedding) and the
rotary scaling (Llama 3.x's 'llama3'); Phi-3's fused qkv_proj / gate_up_proj are split by the loaders, and
a sliding window (Mistral, Phi-3) bounds the context length instead (within it, attention is the same).

Every op comes from the KernelSet the model is built with (kernels.select), so the same module runs the
pure-torch reference or faster kernels. Linear layers hold their weights in one of a few storage
formats chosen once at build time (`WEIGHT_FORMATS`): float32 / bfloat16 / float16, or int8 weight-only
(per-output-channel scales, activations in bfloat16). Q/K/V and gate/up projections are fused into one
matrix each, so a decode step is four matmuls per layer. The layers are in llama_layers.py; this file holds
the config, the rotary tables, the KV cache and the model.

The KV cache is preallocated: [layers, slots, Hkv, max_seq, D] for keys and values, addressed by slot, so
sequences of different lengths share one batch (continuous batching by a scheduler that owns the slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .llama_layers import WEIGHT_FORMATS, Block, Linear


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched. kind: 'linear' (positions / factor) or 'freq_factors'
    (per-frequency divisors, as GGUF files of Llama 3.1 carry in rope_freqs.weight) or 'llama3'."""

    kind: str
    factor: float = 1.0
    freq_factors: tuple[float, ...] = ()
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    head_dim: int = 0  # 0 -> dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 2048
    tie_embeddings: bool = True
    qkv_bias: bool = False  # Qwen2: layers.{i}.bq / bk / bv added to the Q/K/V projections
    qk_norm: bool = False  # Qwen3: layers.{i}.q_norm / k_norm, RMSNorm over each head's D before the rotary
    arch: str = "llama"  # the architecture the file named (for messages; the switches above decide the math)
    # Gemma 3: the MLP's activation ('silu': SwiGLU, 'gelu_tanh': GeGLU), the embedding scaled by sqrt(dim),
    # RMSNorms after attention and after the MLP too (layers.{i}.post_attn_norm / post_ffn_norm), sliding-window
    # layers (`sliding_window` positions, the layers `sliding_layers`) with their own rotary base
    # (`rope_local_theta`, no scaling), and the final logits' soft cap (cap * tanh(x / cap); 0: none). The (1 + w)
    # norms and query_pre_attn_scalar are folded into the weights by the loaders (lm_file.fold_gemma). Gemma 3
    # has no attention-score soft cap: transformers' Gemma3Attention and llama.cpp leave attn_logit_softcapping out.
    act: str = "silu"
    embed_scale: float = 1.0
    post_norms: bool = False
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: float = 0.0
    final_softcap: float = 0.0

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "head_dim", "max_seq_len"):
            if getattr(self, k) <= 0:
                raise ValueError(f"LlamaConfig.{k} must be positive, got {getattr(self, k)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LlamaConfig: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim must be even for rotary embedding, got {self.head_dim}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"LlamaConfig.act {self.act!r} is not one of {', '.join(ACTIVATIONS)}")
        if any(not 0 <= i < self.n_layers for i in self.sliding_layers) or (
            self.sliding_layers and self.sliding_window < 1
        ):
            raise ValueError("LlamaConfig: sliding_layers must be layer indexes, with a positive sliding_window")

    def window(self, layer: int) -> int:
        """The positions layer `layer` attends over (the query's and the window - 1 before it), 0: all."""
        return self.sliding_window if layer in self.sliding_layers else 0

    def local_rope(self) -> LlamaConfig | None:
        """The config whose rotary tables the sliding-window layers use, where their base differs (Gemma 3)."""
        if not self.sliding_layers or not self.rope_local_theta:
            return None
        return replace(self, rope_theta=self.rope_local_theta, rope_scaling=None)

    def replace(self, **kw) -> LlamaConfig:
        return replace(self, **kw)


LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
ACTIVATIONS = ("silu", "gelu_tanh")


def layer_tensors(cfg: LlamaConfig) -> tuple[str, ...]:
    """The tensors of one decoder layer of a model of `cfg` (models.llama names)."""
    extra = (("bq", "bk", "bv") if cfg.qkv_bias else ()) + (("q_norm", "k_norm") if cfg.qk_norm else ())
    extra += ("post_attn_norm", "post_ffn_norm") if cfg.post_norms else ()
    return ("attn_norm", "ffn_norm") + LINEAR + extra


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] float64 with the config's scaling applied."""
    D = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    s = cfg.rope_scaling
    if s is None:
        return inv
    if s.kind == "linear":
        return inv / s.factor
    if s.kind == "freq_factors":
        if len(s.freq_factors) != D // 2:
            raise ValueError(f"rope freq_factors has {len(s.freq_factors)} entries, expected head_dim/2 = {D // 2}")
        return inv / torch.tensor(s.freq_factors, dtype=torch.float64)
    if s.kind == "llama3":  # as in Meta's reference and transformers' _compute_llama3_parameters
        low_wl = s.original_max_seq_len / s.low_freq_factor
        high_wl = s.original_max_seq_len / s.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (s.original_max_seq_len / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        scaled = torch.where(wl > low_wl, inv / s.factor, inv)
        mid = (wl <= low_wl) & (wl >= high_wl)
        return torch.where(mid, (1 - smooth) * inv / s.factor + smooth * inv, scaled)
    raise ValueError(f"unknown rope scaling kind {s.kind!r}; valid: linear, freq_factors, llama3")


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq_len, D/2] float32 of every position's rotary angles (computed in float64)."""
    t = torch.arange(cfg.max_seq_len, dtype=torch.float64)[:, None] * rope_inv_freq(cfg)[None]
    return t.cos().float(), t.sin().float()


@dataclass
class KVCache:
    """k, v: [n_layers, slots, Hkv, max_seq, D]. `lengths` (host list) is how many positions each slot
    holds; it lives on the host so that planning a step (slicing, masks) never waits on the device."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: list[int] = field(default_factory=list)

    @property
    def max_batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_seq(self) -> int:
        return self.k.shape[3]

    def next_positions(self, slots: list[int]) -> list[int]:
        """Where each slot's next token goes (its length), checked against the cache's size."""
        pos = [self.lengths[s] for s in slots]
        if max(pos) + 1 > self.max_seq:
            raise ValueError(f"a sequence reached the cache's {self.max_seq} positions per slot")
        return pos

    def advance(self, slots: list[int], pos: list[int]) -> None:
        """The slots hold one more position each, after a step that wrote position `pos` of each."""
        for s, p in zip(slots, pos):
            self.lengths[s] = p + 1

    # Where a step writes its keys and values and what it attends over: (write(c, x), read(c)) for one layer's
    # cache c [slots, Hkv, max_seq, D], x the step's new keys or values [N, Hkv, T, D].
    def span(self, slot: int, start: int, end: int):
        """Positions start..end-1 of one slot (a prompt, or its next part), reading all of its first `end`."""

        def write(c, x):  # x [1, Hkv, T, D]
            c[slot, :, start:end] = x[0]

        def read(c):
            return c[slot : slot + 1, :, :end]

        return write, read

    def rows(self, index, T: int):
        """The first T positions of the slots `index` (a slice or a device tensor), row i a prompt from 0."""

        def write(c, x):  # x [N, Hkv, T, D] -> c[index[i], :, :T]
            c[index, :, :T] = x

        def read(c):
            return c[index, :, :T]

        return write, read

    def position(self, slot: int, p: int, tk: int):
        """Position p of one slot (a decode step), reading its first `tk`."""

        def write(c, x):  # x [1, Hkv, 1, D]
            c[slot, :, p] = x[0, :, 0]

        def read(c):
            return c[slot : slot + 1, :, :tk]

        return write, read

    def positions(self, index, pos: torch.Tensor, tk: int):
        """Position pos[i] of slot index[i] (device tensors; a decode step), reading the first `tk` of each."""

        def write(c, x):  # x [N, Hkv, 1, D]
            c[index, :, pos] = x[:, :, 0]

        def read(c):
            return c[index, :, :tk]

        return write, read

    def range_positions(self, s0: int, pos: torch.Tensor, tk: int):
        """Position pos[i] of the contiguous slots s0 + i, i < len(pos) (fixed shapes for a CUDA graph), reading
        the first `tk` of each."""
        sl = slice(s0, s0 + pos.shape[0])
        ar = torch.arange(pos.shape[0], device=pos.device)

        def write(c, x):  # x [N, Hkv, 1, D] -> c[s0 + i, :, pos[i]]
            c[sl][ar, :, pos] = x[:, :, 0]

        def read(c):
            return c[sl, :, :tk]

        return write, read


def contiguous(slots: list[int]) -> bool:
    """Whether `slots` are s0, s0 + 1, ... in order: a range of the cache a step addresses as a slice."""
    return bool(slots) and slots == list(range(slots[0], slots[0] + len(slots)))


class Llama(nn.Module):
    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict[str, torch.Tensor],
        ops,
        device: torch.device,
        weight_format: str = "float32",
        q4: dict | None = None,
        dense_prefill: torch.dtype | None = None,
    ):
        """weights: float tensors named as models.gguf_loader produces them; q4: the file's 4-bit blocks
        (lm_file.LMFile.q4) for weight_format 'int4' — without any, int4 quantizes the float weights.
        dense_prefill (int4 / int8): the blocks' weights also in this dtype for prompts (see Linear)."""
        super().__init__()
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weight_format!r}; valid: {', '.join(WEIGHT_FORMATS)}")
        names = layer_tensors(cfg)
        need = ["tok_embeddings", "norm"] + [f"layers.{i}.{n}" for i in range(cfg.n_layers) for n in names]
        if not cfg.tie_embeddings:
            need.append("output")
        missing = [n for n in need if n not in weights]
        if missing:
            raise ValueError(f"Llama weights are missing {len(missing)} tensor(s), e.g. {', '.join(missing[:4])}")
        self.cfg, self.ops, self.device, self.weight_format = cfg, ops, device, weight_format
        self.dtype = WEIGHT_FORMATS[weight_format]  # activation dtype
        emb = weights["tok_embeddings"]
        if emb.shape != (cfg.vocab_size, cfg.dim):
            raise ValueError(f"token embedding has shape {tuple(emb.shape)}, config says {(cfg.vocab_size, cfg.dim)}")
        self.tok_embeddings = nn.Parameter(emb.to(device, self.dtype), requires_grad=False)
        q4 = q4 or "quantize"  # no 4-bit blocks in the file: quantize (used by int4 only)

        def layer_q4(i):
            return q4 if isinstance(q4, str) else {n: q4[f"layers.{i}.{n}"] for n in names if f"layers.{i}.{n}" in q4}

        self.layers = nn.ModuleList(
            Block(
                cfg,
                i,
                ops,
                {n: weights[f"layers.{i}.{n}"] for n in names},
                weight_format,
                device,
                self.dtype,
                layer_q4(i),
                dense_prefill,
            )
            for i in range(cfg.n_layers)
        )
        self.norm = nn.Parameter(weights["norm"].to(device, self.dtype), requires_grad=False)
        # the head stays int8 under fp8 weights (as under int4): the same bytes, and E4M3's 3 mantissa bits over a
        # tied embedding's rows changed SmolLM2's first greedy token where int8 did not
        head_format = "int8" if weight_format == "fp8" else weight_format
        self.output = Linear(ops, weights["tok_embeddings" if cfg.tie_embeddings else "output"], head_format, device)
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        local = cfg.local_rope()  # Gemma 3's sliding-window layers: a rotary base of their own
        self._two_ropes = local is not None
        cos_l, sin_l = rope_tables(local) if local else (cos, sin)
        self.register_buffer("cos_local", cos_l.to(device), persistent=False)
        self.register_buffer("sin_local", sin_l.to(device), persistent=False)

    def _angles(self, index, shape) -> dict:
        """The rotary angles at positions `index` (a slice or a device tensor) viewed as `shape`, for the global
        (False) and the sliding-window (True) layers, which Block.forward picks by its own kind."""
        g = (self.cos[index].view(shape), self.sin[index].view(shape))
        if not self._two_ropes:
            return {False: g, True: g}
        return {False: g, True: (self.cos_local[index].view(shape), self.sin_local[index].view(shape))}

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings[tokens]
        return h * self.cfg.embed_scale if self.cfg.embed_scale != 1.0 else h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output head on final-normed h -> float32 logits, soft-capped where the config says (Gemma 2)."""
        y = self.output(h).float()
        cap = self.cfg.final_softcap
        return torch.tanh(y / cap) * cap if cap else y

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        cfg = self.cfg
        if max_seq > cfg.max_seq_len:
            raise ValueError(f"max_seq {max_seq} exceeds the model's context length {cfg.max_seq_len}")
        shape = (cfg.n_layers, max_batch, cfg.n_kv_heads, max_seq, cfg.head_dim)
        return KVCache(
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            [0] * max_batch,
        )

    def _run(self, h, rope, cache, write, read, lengths):
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, rope, cache.k[i], cache.v[i], write, read, lengths)
        h = self.ops.rms_norm(h, self.norm, self.cfg.norm_eps, residual=residual)[0]
        return self._logits(h)

    def prefill(
        self, cache: KVCache, slot: int, tokens: torch.Tensor, start: int = 0, all_logits: bool = False
    ) -> torch.Tensor:
        """tokens [T] into `slot` at positions start..start+T-1 -> logits [vocab] float32 of the last
        position (or [T, vocab] with all_logits). Earlier positions of the slot must already be cached."""
        T = tokens.shape[0]
        end = start + T
        if end > cache.max_seq:
            raise ValueError(f"sequence of {end} tokens does not fit the cache ({cache.max_seq} positions per slot)")
        h = self._embed(tokens)[None]  # [1, T, dim]
        rope = self._angles(slice(start, end), (1, 1, T, -1))  # [1, 1, T, D/2]
        write, read = cache.span(slot, start, end)
        if not all_logits:
            # only the last position's logits are needed: run the head on one row
            residual = None
            for i, layer in enumerate(self.layers):
                h, residual = layer(h, residual, rope, cache.k[i], cache.v[i], write, read, None)
            h = self.ops.rms_norm(h[:, -1:], self.norm, self.cfg.norm_eps, residual=residual[:, -1:])[0]
            cache.lengths[slot] = end
            return self._logits(h)[0, 0]
        logits = self._run(h, rope, cache, write, read, None)[0]
        cache.lengths[slot] = end
        return logits

    def prefill_range(self, cache: KVCache, s0: int, prompts: list[torch.Tensor]) -> torch.Tensor:
        """N prompts [T_i] into the contiguous slots s0..s0+N-1 from position 0, as one batch -> logits
        [N, vocab] float32 of each one's last position. Right-padded to the longest: causal attention keeps
        every real position from seeing the padding after it, and the padding's keys land beyond each
        slot's length, where no step reads them (a decode step writes a position before it attends to it)."""
        N, lens = len(prompts), [int(p.shape[0]) for p in prompts]
        T = max(lens)
        if min(lens) < 1 or T > cache.max_seq or s0 < 0 or s0 + N > cache.max_batch:
            raise ValueError(
                f"prompts of {min(lens)}..{T} tokens into slots {s0}..{s0 + N - 1} do not fit the "
                f"cache ({cache.max_batch} slots of {cache.max_seq} positions)"
            )
        tokens = torch.nn.utils.rnn.pad_sequence([p.to(self.device) for p in prompts], batch_first=True)
        sl = slice(s0, s0 + N)
        write, read = cache.rows(sl, T)
        logits = self._prefill_batch(cache, tokens, torch.tensor(lens, device=self.device) - 1, write, read)
        cache.lengths[sl] = lens
        return logits

    def prefill_rows(
        self, cache: KVCache, rows: torch.Tensor, tokens: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        """Right-padded prompts tokens [N, T] into the slots `rows` [N] from position 0 -> logits [N, vocab]
        float32 at the positions `last` [N] (each prompt's length - 1). All three are device tensors and
        nothing is read on the host: with T fixed (a bucket the prompts are padded to), what a CUDA graph
        captures for any slots and lengths (backends.triton.lm). Leaves cache.lengths to the caller."""
        write, read = cache.rows(rows, tokens.shape[1])
        return self._prefill_batch(cache, tokens, last, write, read)

    def _prefill_batch(self, cache, tokens, last, write, read):
        N, T = tokens.shape
        h = self._embed(tokens)  # [N, T, dim]
        rope = self._angles(slice(0, T), (1, 1, T, -1))
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, rope, cache.k[i], cache.v[i], write, read, None)
        at = torch.arange(N, device=self.device)
        h = self.ops.rms_norm(h[at, last][:, None], self.norm, self.cfg.norm_eps, residual=residual[at, last][:, None])[
            0
        ]
        return self._logits(h)[:, 0]

    def decode_step(self, cache: KVCache, slots: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """One new token per slot: tokens [N] (device tensor) for `slots` (host list of N distinct slot
        indices, sequences of any lengths) -> logits [N, vocab] float32."""
        N = len(slots)
        pos_host = cache.next_positions(slots)
        tk = max(pos_host) + 1
        dev = self.device
        if N > 1 and contiguous(slots):
            logits = self.decode_range(cache, slots[0], tokens, torch.tensor(pos_host, device=dev), tk)
        else:
            h = self._embed(tokens)[:, None]  # [N, 1, dim]
            if N == 1:
                p = pos_host[0]
                rope = self._angles(slice(p, p + 1), (1, 1, 1, -1))
                write, read = cache.position(slots[0], p, tk)
                lengths = None
            else:
                pos = torch.tensor(pos_host, device=dev)
                rope = self._angles(pos, (N, 1, 1, -1))  # [N, 1, 1, D/2]
                write, read = cache.positions(torch.tensor(slots, device=dev), pos, tk)
                lengths = pos + 1
            logits = self._run(h, rope, cache, write, read, lengths)[:, 0]
        cache.advance(slots, pos_host)
        return logits

    def decode_range(self, cache: KVCache, s0: int, tokens: torch.Tensor, pos: torch.Tensor, tk: int) -> torch.Tensor:
        """One new token for each of the N contiguous slots s0..s0+N-1: tokens [N] and pos [N] (device
        tensors: each slot's position) -> logits [N, vocab] float32, attending over the first `tk` cache
        positions, masked by pos + 1. Fixed shapes and no reads on the host for a given (s0, N, tk): what a
        CUDA graph captures (backends.triton.lm). Leaves cache.lengths to the caller."""
        h = self._embed(tokens)[:, None]  # [N, 1, dim]
        rope = self._angles(pos, (pos.shape[0], 1, 1, -1))  # [N, 1, 1, D/2]
        write, read = cache.range_positions(s0, pos, tk)
        return self._run(h, rope, cache, write, read, pos + 1)[:, 0]
