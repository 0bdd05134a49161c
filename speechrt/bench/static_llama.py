"""The peer `torch-compile-static`: gpt-fast's recipe for a Llama-family decoder, written from the same config and
weights as models/llama.py, in plain torch.

gpt-fast (pytorch-labs/gpt-fast): a fixed-size key/value cache tensor per layer (module buffers, so CUDA graphs
see fixed addresses), the new key and value written at the step's position by index, attention (SDPA) over the
whole cache with a mask of the positions written so far, and `torch.compile(decode_one_token,
mode="max-autotune", fullgraph=True)` on those fixed shapes (inductor's GEMM autotuning and CUDA graphs); the
prompt's prefill runs eagerly (gpt-fast compiles it apart, with dynamic shapes, only optionally). Greedy: the
argmax is inside the compiled step. Rows of a batch may sit at different positions (a position per row), which is
gpt-fast's step with a per-row index instead of one.

`compile=False` runs the same step uncompiled (`torch-static`): what the CPU tests check against our runner, and
on a GPU the eager peer of the same code."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from speechrt.models.llama import LlamaConfig, rope_tables
from speechrt.models.llama_fused import KNOWN_FIELDS

COMPILE_MODE = "max-autotune"


def unsupported(cfg: LlamaConfig) -> str | None:
    """Why this peer cannot run a model of `cfg` (a field of another architecture: sliding windows, post-norms,
    GeGLU, soft caps), or None."""
    import dataclasses

    for f in dataclasses.fields(cfg):
        if f.name not in KNOWN_FIELDS and getattr(cfg, f.name) != f.default:
            return f"the static-cache peer does not implement {type(cfg).__name__}.{f.name}={getattr(cfg, f.name)!r}"
    return None


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x, cos, sin):  # the half-split layout (HF / GGUF order), as kernels.reference.rotary
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class KVCache(nn.Module):
    """One layer's keys and values [B, Hkv, S, D]: buffers of fixed shape and address."""

    def __init__(self, batch: int, seq: int, heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, heads, seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


class Layer(nn.Module):
    def __init__(self, cfg: LlamaConfig, w: dict, device, dtype):
        super().__init__()

        def p(t):
            return nn.Parameter(t.to(device, dtype).contiguous(), requires_grad=False)

        self.cfg = cfg
        self.attn_norm, self.ffn_norm = p(w["attn_norm"]), p(w["ffn_norm"])
        self.wqkv = p(torch.cat([w["wq"], w["wk"], w["wv"]]))
        self.bqkv = p(torch.cat([w["bq"], w["bk"], w["bv"]])) if cfg.qkv_bias else None
        self.q_norm = p(w["q_norm"]) if cfg.qk_norm else None
        self.k_norm = p(w["k_norm"]) if cfg.qk_norm else None
        self.wo, self.w_down = p(w["wo"]), p(w["w_down"])
        self.w_gate_up = p(torch.cat([w["w_gate"], w["w_up"]]))
        self.cache: KVCache | None = None

    def qkv(self, x, cos, sin):
        """x [B, T, dim] -> q [B, H, T, D], k and v [B, Hkv, T, D], q and k rotated."""
        c = self.cfg
        B, T, _ = x.shape
        qkv = F.linear(_rms(x, self.attn_norm, c.norm_eps), self.wqkv, self.bqkv)
        q, k, v = qkv.split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], -1)
        q, k = q.view(B, T, c.n_heads, c.head_dim), k.view(B, T, c.n_kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = _rms(q, self.q_norm, c.norm_eps), _rms(k, self.k_norm, c.norm_eps)
        q, k = _rope(q.transpose(1, 2), cos, sin), _rope(k.transpose(1, 2), cos, sin)
        return q, k, v.view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)

    def rest(self, h, a):
        """The attention output a [B, H, T, D] through the output projection and the MLP, residuals added to h."""
        B, _, T, _ = a.shape
        h = h + F.linear(a.transpose(1, 2).reshape(B, T, -1), self.wo)
        gate, up = F.linear(_rms(h, self.ffn_norm, self.cfg.norm_eps), self.w_gate_up).chunk(2, -1)
        return h + F.linear(F.silu(gate) * up, self.w_down)


class StaticLlama(nn.Module):
    """models.llama's weights (named as Llama takes them) in plain torch, with static caches (setup_caches)."""

    def __init__(self, cfg: LlamaConfig, weights: dict, device, dtype):
        super().__init__()
        why = unsupported(cfg)
        if why:
            raise ValueError(why)
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.layers = nn.ModuleList(
            Layer(cfg, {n.split(".", 2)[2]: t for n, t in _layer(weights, i)}, device, dtype)
            for i in range(cfg.n_layers)
        )
        self.tok = nn.Parameter(weights["tok_embeddings"].to(device, dtype), requires_grad=False)
        out = weights["tok_embeddings" if cfg.tie_embeddings else "output"]
        self.output = self.tok if cfg.tie_embeddings else nn.Parameter(out.to(device, dtype), requires_grad=False)
        self.norm = nn.Parameter(weights["norm"].to(device, dtype), requires_grad=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        self.register_buffer("positions", torch.zeros(0, dtype=torch.long, device=device), persistent=False)
        self.batch = self.seq = 0

    def setup_caches(self, batch: int, seq: int) -> None:
        """Fresh caches of `batch` rows x `seq` positions (a new shape: the compiled step compiles again)."""
        c = self.cfg
        if seq > c.max_seq_len:
            raise ValueError(f"{seq} cache positions exceed the model's context length {c.max_seq_len}")
        for layer in self.layers:
            layer.cache = KVCache(batch, seq, c.n_kv_heads, c.head_dim, self.dtype, self.device)
        self.positions = torch.arange(seq, device=self.device)
        self.batch, self.seq = batch, seq

    def _logits(self, h):
        return F.linear(_rms(h, self.norm, self.cfg.norm_eps), self.output).float()

    def prefill(self, row: int, tokens: torch.Tensor) -> torch.Tensor:
        """A prompt tokens [T] into cache row `row` from position 0 -> logits [vocab] float32 of its last token."""
        T, g = tokens.shape[0], self.cfg.n_heads // self.cfg.n_kv_heads
        h = self.tok[tokens.to(self.device)][None]
        cos, sin = self.cos[:T][None, None], self.sin[:T][None, None]
        for layer in self.layers:
            q, k, v = layer.qkv(h, cos, sin)
            layer.cache.k[row, :, :T], layer.cache.v[row, :, :T] = k[0], v[0]
            if g > 1:
                k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            h = layer.rest(h, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return self._logits(h[:, -1])[0]

    def decode_logits(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token per row: tokens [B], pos [B] (where each row's token goes) -> logits [B, vocab] float32. Fixed
        shapes, no host reads: each row's key/value written at its position by index, attention over the whole cache
        masked to the positions up to it."""
        g = self.cfg.n_heads // self.cfg.n_kv_heads
        B = tokens.shape[0]
        h = self.tok[tokens][:, None]  # [B, 1, dim]
        cos, sin = self.cos[pos][:, None, None], self.sin[pos][:, None, None]  # [B, 1, 1, D/2]
        mask = (self.positions[None] <= pos[:, None])[:, None, None]  # [B, 1, 1, S]
        rows = torch.arange(B, device=tokens.device)
        for layer in self.layers:
            q, k, v = layer.qkv(h, cos, sin)
            kc, vc = layer.cache.k[:B], layer.cache.v[:B]
            kc[rows, :, pos] = k[:, :, 0]
            vc[rows, :, pos] = v[:, :, 0]
            if g > 1:
                kc, vc = kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1)
            h = layer.rest(h, F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask))
        return self._logits(h[:, 0])


def _layer(weights, i):
    pre = f"layers.{i}."
    return [(n, weights[n]) for n in list(weights) if n.startswith(pre)]


def decode_one_token(model: StaticLlama, tokens: torch.Tensor, pos: torch.Tensor):
    """gpt-fast's step: -> (the greedy next tokens [B], the logits [B, vocab])."""
    logits = model.decode_logits(tokens, pos)
    return logits.argmax(-1), logits


def compiled_step(compile: bool = True):
    """decode_one_token compiled as gpt-fast compiles it (max-autotune, fullgraph; compiled on its first calls, which
    run under gpt_fast_inductor()), or as it is."""
    if not compile:
        return decode_one_token
    # dynamic=False: another batch size compiles its own fixed-shape step, not a dynamic-shape one
    return torch.compile(decode_one_token, mode=COMPILE_MODE, fullgraph=True, dynamic=False)


def gpt_fast_inductor():
    """A context with gpt-fast's inductor settings (coordinate-descent tuning of the generated kernels, unique kernel
    names): around the calls that compile, so that no other torch.compile of the process gets them."""
    import torch._inductor.config as inductor

    opts = {"coordinate_descent_tuning": True}
    if hasattr(inductor.triton, "unique_kernel_names"):
        opts["triton.unique_kernel_names"] = True
    return inductor.patch(opts)


class StaticGenerator:
    """Greedy generation for a batch of prompts on a StaticLlama: prefill each row eagerly, then the (compiled)
    step; the new tokens stay on the device until the end, as gpt-fast keeps them."""

    def __init__(self, model: StaticLlama, compile: bool = True):
        self.model, self.step = model, compiled_step(compile)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float, float]:
        """-> (n tokens per prompt, seconds to the first tokens on the host, seconds of the n - 1 steps)."""
        m, B = self.model, len(prompts)
        size = max(map(len, prompts)) + n
        if m.batch != B or m.seq < size:
            m.setup_caches(B, max(size, m.seq))
        sync = torch.cuda.synchronize if m.device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        first = torch.stack([m.prefill(b, torch.tensor(p)) for b, p in enumerate(prompts)]).argmax(-1)
        out = [first.tolist()]
        t1 = time.perf_counter()
        tok, pos, new = first, torch.tensor([len(p) for p in prompts], device=m.device), []
        with gpt_fast_inductor():  # (a new batch size compiles again)
            for _ in range(n - 1):
                nxt, _ = self.step(m, tok, pos)
                tok, pos = nxt.clone(), pos + 1  # (a CUDA graph's output is overwritten by its next replay)
                new.append(tok)
        ids = torch.stack(new).tolist() if new else []
        sync()
        t2 = time.perf_counter()
        return [[out[0][b]] + [r[b] for r in ids] for b in range(B)], t1 - t0, t2 - t1


class StaticPeer:
    """`bench lm`'s engine of this peer (lm_engines.start_engine): the model's own file (its float weights) on the
    device given, bf16 on a GPU (float16 where bf16 is not supported) and float32 on the CPU unless --dtype names a
    float format; `compile=False`: the step uncompiled (`torch-static`)."""

    def __init__(self, model, device, dtype, threads, compile: bool = True):
        from speechrt.backends.torch.lm import load_file
        from speechrt.models import registry

        torch.set_num_threads(threads)
        dev = torch.device(device)
        floats = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype in floats:
            dt = floats[dtype]
        elif dev.type == "cuda":
            dt = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            dt = torch.float32
        f = load_file(registry.resolve(model, "lm"))
        self.gen = StaticGenerator(StaticLlama(f.config, f.weights, dev, dt), compile)
        self.name = "torch-compile-static" if compile else "torch-static"
        how = f'torch.compile(mode="{COMPILE_MODE}", fullgraph=True)' if compile else "eager"
        prec = str(dt).removeprefix("torch.")
        self.note = f"gpt-fast recipe: static cache, decode step {how}, prefill eager; {prec} on {dev}"
        self.note += f" (torch {torch.__version__})"
        self.meta = {"backend": "inductor" if compile else "torch", "precision": prec, "device": str(dev)}

    def run(self, prompts, n):
        _, ttft, steps = self.gen.generate(prompts, n)
        return ttft, len(prompts) * (n - 1) / steps
