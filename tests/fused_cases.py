"""Inputs of the fused decode-step kernels' tests (tests/kernels/test_triton_fused.py, test_fused_merge.py): odd
widths (dim 72, head_dim 24, hidden 200), grouped heads (3 / 1), strided rows, an odd cache length, quantized
weights with their dequantized values."""

from __future__ import annotations

import torch
from kernel_checks import DEVICE, rand

from speechrt.kernels import reference as ref

DIM, H, HKV, D, HIDDEN, SLOTS, S = 72, 3, 1, 24, 200, 6, 13  # S: the cache's (odd) length


def strided_rows(m, n, dtype, seed):
    """[m, n] with a row stride of n + 5 (a view of a wider buffer, as a slice of a packed output is)."""
    return rand(m, n + 5, dtype=dtype, seed=seed)[:, 2 : 2 + n]


def qkv_case(M, dtype, bias=False, qk_norm=False, seed=0, dim=DIM):
    cos, sin = (t.to(DEVICE) for t in tables())
    kw = dict(
        norm_w=rand(dim, dtype=dtype, seed=seed + 1, scale=0.5) + 1,
        eps=1e-5,
        wqkv=rand((H + 2 * HKV) * D, dim, dtype=dtype, seed=seed + 2, scale=dim**-0.5),
        n_heads=H,
        cos=cos,
        sin=sin,
        pos=torch.tensor([12, 0, 7, 3, 11][:M], device=DEVICE),  # the cache's last position, its first, ...
        s0=1,
        bias=rand((H + 2 * HKV) * D, dtype=dtype, seed=seed + 3) if bias else None,
        q_norm=rand(D, dtype=dtype, seed=seed + 4, scale=0.3) + 1 if qk_norm else None,
        k_norm=rand(D, dtype=dtype, seed=seed + 5, scale=0.3) + 1 if qk_norm else None,
    )
    return strided_rows(M, dim, dtype, seed), kw


def tables():
    t = torch.arange(S, dtype=torch.float64)[:, None] / (10000 ** (torch.arange(0, D, 2) / D))[None]
    return t.cos().float(), t.sin().float()


def caches(dtype):
    k = rand(SLOTS, HKV, S, D, dtype=dtype, seed=90)
    return k, rand(SLOTS, HKV, S, D, dtype=dtype, seed=91)


def quantized(fmt, G, N, K, seed):
    """A random weight [N, K] as the fused ops take it (weight, scale), its float32 values dequantized."""
    from speechrt.kernels import reference_quant as rq

    if fmt == "int4":  # AWQ / GPTQ-style groups: float16 scales, integer zero points
        from speechrt.kernels.triton_int4_matmul import pack_int4

        g = torch.Generator().manual_seed(seed)
        q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
        scale = (torch.rand(N, K // G, generator=g) + 0.5).half() * K**-0.5 / 8
        q, s, z = ref.int4_from_zero_points(q, scale, torch.randint(0, 16, (N, K // G), generator=g))
        w = pack_int4(q.to(DEVICE), s.to(DEVICE), z.to(DEVICE))
    elif fmt == "fp8":
        w = tuple(t.to(DEVICE) for t in ref.quantize_fp8(rand(N, K, seed=seed, scale=K**-0.5).cpu()))
    else:
        f = rand(N, K, seed=seed, scale=K**-0.5)
        scale = f.abs().amax(1) / 127
        w = (torch.round(f / scale[:, None]).to(torch.int8), scale.to(torch.bfloat16))
    return w, rq.dequantize(w, K, torch.float32)
