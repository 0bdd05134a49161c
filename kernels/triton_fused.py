"""Fused kernels of the Llama-family decode step: a layer in four launches plus decode attention, one before the
layers and one after them.

    token_inputs    the embeddings of the step's tokens (the residual stream) and each row's key count (int32)
    norm_qkv_rope   RMSNorm -> packed Q/K/V projection (+ Qwen2 bias) (+ Qwen3 per-head q/k RMSNorm)
                    -> rotary at each row's position -> K/V written into the cache; returns Q
    linear_residual output (or down) projection (+ Whisper's bias) + residual add: the new residual stream
    norm_gate_up    RMSNorm -> gate/up projection -> silu(gate) * up
    norm_logits     the final RMSNorm -> the output projection, float32 logits (rounded to the activations' dtype)

The "next norm" is folded into the kernel that consumes it, not the one that produces the residual: an RMSNorm
needs the sum of squares of the whole row, which spans every column program of the producer (a second pass or
a grid-wide sync), while the consumer streams that whole row through its K loop anyway. The norm is
x * rstd * g with rstd one scalar per row, so the consumer multiplies x by g going in, accumulates sum(x^2)
next to the dot products and scales its accumulator by rstd at the end (rstd commutes with the matmul). The
roundings differ from the unfused path's only there (normalized x is not rounded to the activation dtype
before the weight multiply): within 16-bit tolerance, exact in float32 up to summation order.

Projection tiles: a program holds BLOCK_M rows and, for Q/K/V, BLOCK_HALF column pairs (d, d + D/2) of one
head, so the rotary pairs meet in registers (with per-head norms, the whole head: its sum of squares). A grid of
fewer programs than the GPU has SMs (a one-row step: the 1B shape's Q/K/V, 96 programs) splits K among programs
(SPLIT): each split stores its partial sums and sums of squares, and the last split of each output tile to finish
adds them up and runs the same epilogue in the same launch (MERGE; on ROCm a second launch:
kernels/triton_fused_split.py, which decides the splits). The pieces the kernels share with their quantized, split
and Whisper twins (rounding, tiles, epilogues) are kernels/triton_fused_parts.py's. The references are
kernels.reference.token_inputs / norm_qkv_rope / linear_residual / norm_gate_up / norm_logits."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from . import triton_fused_split as fs
from . import triton_pdl as pdl
from .triton_fused_parts import gate_up_out, head_tile, k_range, qkv_out, residual_out, rnd, row_col_tile, rstd
from .triton_matmul import precision, tile_dot, upcast

# None: config()'s tiles. A dict of BLOCK_N, BLOCK_K, num_warps, num_stages (BLOCK_HALF: Q/K/V's column pairs a
# program, but where a per-head norm needs whole heads): its entries replace config()'s in the float ops while set
# (bench gpu's gemv-tiles sweep; the K split is the rule's for those tiles, SPLITS aside)
TILES: dict | None = None
TILE_KEYS = ("BLOCK_N", "BLOCK_K", "BLOCK_HALF", "num_warps", "num_stages")


@triton.jit
def _norm_dot_pair(
    x_ptr, g_ptr, w_ptr, rm, cols, rmask, cmask, second, k_lo, k_hi, sxm, sxk, swn, swk,
    DT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PAIR: tl.constexpr = True,
):  # fmt: skip
    """RMSNorm folded into two projections that share their input: (x[rm] * g) @ W[cols].T and @ W[cols +
    second].T in float32 over the columns k_lo .. k_hi of x (all K, or a split's share), and each row's sum of
    squares there (rstd() of the whole row's scales them). The normed input is rounded to DT, as the unfused norm
    leaves it. PAIR False: the first projection only (the second's sums stay 0)."""
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + (k_lo + rk)[None, :] * sxk  # [BLOCK_M, BLOCK_K]
    pw = w_ptr + cols[None, :] * swn + (k_lo + rk)[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        km = (k0 + rk) < k_hi
        x = tl.load(px, mask=rmask[:, None] & km[None, :], other=0.0)
        xf = x.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        a = rnd(xf * tl.load(g_ptr + k0 + rk, mask=km, other=0.0).to(tl.float32)[None, :], DT).to(DT)
        wm = km[:, None] & cmask[None, :]
        w1 = tl.load(pw, mask=wm, other=0.0)
        if UPCAST:
            a, w1 = a.to(tl.float32), w1.to(tl.float32)
        acc1 = tl.dot(a, w1, acc1, input_precision=PRECISION)
        if PAIR:
            w2 = tl.load(pw + second * swn, mask=wm, other=0.0)
            if UPCAST:
                w2 = w2.to(tl.float32)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    return acc1, acc2, ss


@triton.jit
def _norm_qkv_rope_kernel(
    x_ptr, g_ptr, w_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, p_ptr, ss_ptr,
    cnt_ptr, M, K, K_SPLIT, H, HKV, HALF, s0, sxm, sxk, swn, swk, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # SPLIT: this program's K split's partial sums go to p / ss, added up by a second launch or (MERGE) the last split
    DT: tl.constexpr = q_ptr.dtype.element_ty  # the activations' (and the cache's) dtype
    rm, mm, head, d, dm, col, split, tile = head_tile(M, HALF, BLOCK_M, BLOCK_HALF, SPLIT)
    k_lo, k_hi = k_range(split, K_SPLIT, K, SPLIT)
    acc1, acc2, ss = _norm_dot_pair(
        x_ptr, g_ptr, w_ptr, rm, col, mm, dm, HALF, k_lo, k_hi, sxm, sxk, swn, swk,
        DT, PRECISION, UPCAST, BLOCK_M, BLOCK_HALF, BLOCK_K,
    )  # fmt: skip
    qkv_out(
        acc1, acc2, ss, rm, mm, head, d, dm, col, split, tile, p_ptr, ss_ptr, cnt_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr,
        sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, M, K, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt,
        eps, HAS_BIAS, QK_NORM, SPLIT, MERGE,
    )  # fmt: skip


@triton.jit
def _linear_residual_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, p_ptr, cnt_ptr, M, N, K, K_SPLIT, sxm, sxk, swn, swk, srm, sym,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # grid (row blocks, column blocks, K splits): y = r + (x @ W.T + bias), the product (with its bias, Whisper's)
    # rounded to the activation dtype first (as the unfused linear leaves it); SPLIT: the split's partial sums
    rm, rn = row_col_tile(BLOCK_M, BLOCK_N)
    k_lo, k_hi = k_range(tl.program_id(2), K_SPLIT, K, SPLIT)
    acc = tile_dot(
        x_ptr + k_lo * sxk, w_ptr + k_lo * swk, rm, rn, M, N, k_hi - k_lo, sxm, sxk, swn, swk, PRECISION, UPCAST,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    residual_out(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, p_ptr, cnt_ptr, srm, sym, HAS_BIAS, SPLIT, MERGE)


@triton.jit
def _norm_gate_up_kernel(
    x_ptr, g_ptr, w_ptr, y_ptr, p_ptr, ss_ptr, cnt_ptr, M, N, K, K_SPLIT, sxm, sxk, swn, swk, sym, eps,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # W [2N, K]: gate rows 0..N-1, up rows N..2N-1; y [M, N] = silu(gate) * up of rmsnorm(x) * g. Grid (row blocks,
    # column blocks, K splits); SPLIT: the partial sums go to p / ss, added up by a second launch or (MERGE) the last
    rm, rn = row_col_tile(BLOCK_M, BLOCK_N)
    k_lo, k_hi = k_range(tl.program_id(2), K_SPLIT, K, SPLIT)
    acc_g, acc_u, ss = _norm_dot_pair(
        x_ptr, g_ptr, w_ptr, rm, rn.to(tl.int64), rm < M, rn < N, N, k_lo, k_hi, sxm, sxk,
        swn, swk, y_ptr.dtype.element_ty, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    gate_up_out(acc_g, acc_u, ss, rm, rn, M, N, K, p_ptr, ss_ptr, cnt_ptr, y_ptr, sym, eps, SPLIT, MERGE)


def config(M: int, dtype: torch.dtype, half: int | None = None, whole_head: bool = False) -> dict:
    """Tiles of the decode step (M rows, 1..64). Row tile: 16 (the dot's minimum) up to 16 rows, else 32 (64-row
    tiles also compile without spills on every target, untimed; the two programs of a column tile run side by side,
    so its second read of the weights is likely an L2 hit). Columns: 32 per program
    (16 column pairs of a head), so that even a small layer spreads over many programs that stream W; a
    whole head when its norm needs it. K tile 64 and two stages; wider K tiles and deeper pipelines, which put more
    bytes in flight per program, also compile without spills on every target with the launches' unit K strides:
    `bench gpu --checks gemv-tiles` times them against these (TILES)."""
    cfg = {"BLOCK_M": 16 if M <= 16 else 32, "BLOCK_K": 64 if dtype != torch.float32 or M <= 16 else 32}
    cfg.update(num_warps=4, num_stages=2)
    if half is None:
        cfg["BLOCK_N"] = 32
    else:
        cfg["BLOCK_HALF"] = max(16, triton.next_power_of_2(half)) if whole_head else 16
    return cfg


def tiles(M: int, dtype: torch.dtype, half: int | None = None, whole_head: bool = False) -> dict:
    """The float ops' tiles: config()'s, with TILES' entries in their place while it is set."""
    c = config(M, dtype, half, whole_head)
    for k, v in (TILES or {}).items():
        if k not in TILE_KEYS:
            raise ValueError(f"triton_fused.TILES: unknown tile {k!r}; valid: {', '.join(TILE_KEYS)}")
        if k in c and not (k == "BLOCK_HALF" and whole_head):
            c[k] = v
    return c


@contextmanager
def using_tiles(t: dict | None):
    """TILES = t inside the block, restored after it (an exception too)."""
    global TILES
    prev, TILES = TILES, t
    try:
        yield
    finally:
        TILES = prev


def as_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def weight_args(w: torch.Tensor) -> dict:
    """A float weight [N, K] as the kernels take it: its pointer and both strides."""
    return {"w_ptr": w, "swn": w.stride(0), "swk": w.stride(1)}


def launch_qkv(
    kernel, w: dict, x, norm_w, eps, n_heads, cos, sin, pos, k_cache, v_cache, s0, bias, q_norm, k_norm, cfg
):
    """Checks and launches a norm_qkv_rope kernel (this module's, or a quantized one's: kernels/triton_fused_quant.py)
    with the weight's arguments `w`, K split among programs as kernels/triton_fused_split.py decides; cfg(M, dtype,
    half, whole_head) gives its tiles. Returns Q [M, H, D]."""
    x = as_rows(x)
    M, K = x.shape
    Hkv, D = k_cache.shape[1], k_cache.shape[3]
    half = D // 2
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("norm_qkv_rope: the caches and the cos/sin tables need a unit last stride")
    if cos.stride(0) != sin.stride(0):
        raise ValueError("norm_qkv_rope: cos and sin need the same row stride")
    q = torch.empty((M, n_heads, D), dtype=x.dtype, device=x.device)
    if not M:
        return q
    qk_norm = q_norm is not None
    c = cfg(M, x.dtype, half, qk_norm)
    grid = (triton.cdiv(M, c["BLOCK_M"]), n_heads + 2 * Hkv, triton.cdiv(half, c["BLOCK_HALF"]))
    tiles = grid[0] * grid[1] * grid[2]
    splits, k_split, parts = fs.partials(tiles, K, c["BLOCK_K"], M, grid[1] * D, q)
    merge = fs.merge_args(splits, tiles, q)
    epilogue = dict(
        b_ptr=bias if bias is not None else norm_w, qn_ptr=q_norm if qk_norm else norm_w,
        kn_ptr=k_norm if qk_norm else norm_w, cos_ptr=cos, sin_ptr=sin, pos_ptr=pos, q_ptr=q, kc_ptr=k_cache,
        vc_ptr=v_cache, M=M, K=K, H=n_heads, HKV=Hkv, HALF=half, s0=s0, sct=cos.stride(0), sqm=q.stride(0),
        sqh=q.stride(1), skb=k_cache.stride(0), skh=k_cache.stride(1), skt=k_cache.stride(2), svb=v_cache.stride(0),
        svh=v_cache.stride(1), svt=v_cache.stride(2), eps=eps, HAS_BIAS=bias is not None, QK_NORM=qk_norm,
    )  # fmt: skip
    kernel[(grid[0], grid[1], grid[2] * splits)](
        x_ptr=x, g_ptr=norm_w, K_SPLIT=k_split, sxm=x.stride(0), sxk=x.stride(1), SPLIT=splits > 1,
        PRECISION=precision(x.dtype), UPCAST=upcast(x.dtype), **parts, **merge, **w, **c, **epilogue,
        **pdl.args(x.device),
    )  # fmt: skip
    if splits > 1 and not merge["MERGE"]:
        fs.sum_qkv(grid, splits, parts, c, epilogue)
    return q


def row_tiles(x: torch.Tensor, n: int, cfg, dtype: torch.dtype | None = None):
    """What a (row blocks, column blocks) launch of n output columns starts from: (x as rows [M, K], its output y
    [M, n] in `dtype` (default x's), the tiles cfg(M, dtype), the grid; None without rows)."""
    x = as_rows(x)
    M = x.shape[0]
    y = torch.empty((M, n), dtype=dtype or x.dtype, device=x.device)
    if not M:
        return x, y, None, None
    c = cfg(M, x.dtype)
    return x, y, c, (triton.cdiv(M, c["BLOCK_M"]), triton.cdiv(n, c["BLOCK_N"]))


def launch_gate_up(kernel, w: dict, x, norm_w, eps, n: int, cfg) -> torch.Tensor:
    """Launches a norm_gate_up kernel (this module's or a quantized one's) with the weight's arguments `w`, K split
    among programs as kernels/triton_fused_split.py decides; cfg(M, dtype) gives its tiles. Returns y [M, n]."""
    x, y, c, grid = row_tiles(x, n, cfg)
    if grid is None:
        return y
    M, K = x.shape
    splits, k_split, parts = fs.partials(grid[0] * grid[1], K, c["BLOCK_K"], M, 2 * n, y)
    merge = fs.merge_args(splits, grid[0] * grid[1], y)
    kernel[(*grid, splits)](
        x_ptr=x, g_ptr=norm_w, y_ptr=y, M=M, N=n, K=K, K_SPLIT=k_split, sxm=x.stride(0), sxk=x.stride(1),
        sym=y.stride(0), eps=eps, SPLIT=splits > 1, PRECISION=precision(x.dtype), UPCAST=upcast(x.dtype), **parts,
        **merge, **w, **c, **pdl.args(x.device),
    )  # fmt: skip
    if splits > 1 and not merge["MERGE"]:
        fs.sum_gate_up(grid, splits, parts, c, y, K, eps)
    return y


def launch_rows(kernel, w: dict, x, n: int, cfg, **kw) -> torch.Tensor:
    """Launches linear_residual's kernel (float, or triton_fused_quant's: `w` its weight's arguments, `kw` the
    others) on a (row blocks, column blocks, K splits) grid writing y [M, n] from x [M, K]; cfg(M, dtype) gives its
    tiles. With K split (triton_fused_split.k_splits: a one-row step of few column tiles, the 1B shape's o / down
    projections) each split stores float32 partial sums and the tile's last split (or, where the launch does not
    merge, a second launch) adds them up with the bias and the residual."""
    x, y, c, grid = row_tiles(x, n, cfg)
    if grid is None:
        return y
    M, K = x.shape
    splits, k_split = fs.k_splits(grid[0] * grid[1], K, c["BLOCK_K"], x.device, fs.SPLITS)
    parts = torch.empty((splits, M, n), dtype=torch.float32, device=x.device) if splits > 1 else y
    merge = fs.merge_args(splits, grid[0] * grid[1], y)
    kernel[(*grid, splits)](
        x_ptr=x, y_ptr=y, p_ptr=parts, M=M, N=n, K=K, K_SPLIT=k_split, sxm=x.stride(0), sxk=x.stride(1),
        sym=y.stride(0), SPLIT=splits > 1, PRECISION=precision(x.dtype), UPCAST=upcast(x.dtype), **w, **kw, **c,
        **merge, **pdl.args(x.device),
    )  # fmt: skip
    if splits > 1 and not merge["MERGE"]:
        fs.sum_residual(grid, splits, parts, kw, y, c)
    return y


def residual_args(residual: torch.Tensor, bias: torch.Tensor | None, w: torch.Tensor) -> dict:
    """linear_residual's arguments besides x and the weight."""
    residual = as_rows(residual)
    if residual.stride(-1) != 1:
        residual = residual.contiguous()
    return {
        "b_ptr": bias if bias is not None else w,
        "r_ptr": residual,
        "srm": residual.stride(0),
        "HAS_BIAS": bias is not None,
    }


def norm_qkv_rope(
    x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0=0, bias=None, q_norm=None, k_norm=None
):
    """See kernels.reference.norm_qkv_rope."""
    return launch_qkv(
        _norm_qkv_rope_kernel, weight_args(wqkv), x, norm_w, eps, n_heads, cos, sin, pos, k_cache, v_cache, s0, bias,
        q_norm, k_norm, tiles,
    )  # fmt: skip


def linear_residual(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """See kernels.reference.linear_residual."""
    kw = residual_args(residual, bias, weight)
    return launch_rows(_linear_residual_kernel, weight_args(weight), x, weight.shape[0], tiles, **kw)


def norm_gate_up(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w_gate_up: torch.Tensor) -> torch.Tensor:
    """See kernels.reference.norm_gate_up."""
    return launch_gate_up(_norm_gate_up_kernel, weight_args(w_gate_up), x, norm_w, eps, w_gate_up.shape[0] // 2, tiles)


@triton.jit
def _norm_logits_kernel(
    x_ptr, g_ptr, w_ptr, y_ptr, M, N, K, sxm, sxk, swn, swk, sym, eps,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # grid (row blocks, column blocks): y [M, N] float32 = RMSNorm(x) * g @ W.T, rounded to x's dtype first (as the
    # unfused linear leaves the logits before their conversion to float32)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rm, rn = row_col_tile(BLOCK_M, BLOCK_N)
    acc, _, ss = _norm_dot_pair(
        x_ptr, g_ptr, w_ptr, rm, rn.to(tl.int64), rm < M, rn < N, 0, 0, K, sxm, sxk, swn, swk,
        DT, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, False,
    )  # fmt: skip
    y = rnd(acc * rstd(ss, K, eps)[:, None], DT)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], y, mask=(rm < M)[:, None] & (rn < N)[None, :])


def norm_logits(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
    """See kernels.reference.norm_logits: the final norm and the output projection in one launch, float32 out."""
    x, y, c, grid = row_tiles(x, w.shape[0], tiles, torch.float32)
    if grid is not None:
        M, K = x.shape
        _norm_logits_kernel[grid](
            x, norm_w, w, y, M, w.shape[0], K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), eps,
            PRECISION=precision(x.dtype), UPCAST=upcast(x.dtype), **c, **pdl.args(x.device),
        )  # fmt: skip
    return y


@triton.jit
def _token_inputs_kernel(
    tok_ptr, emb_ptr, pos_ptr, s_ptr, len_ptr, d, stok, se, spos, ssm, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl.gate(PDL)
    # grid (rows,): s[b] = emb[tok[b]]; len[b] = pos[b] + 1 as int32
    b = tl.program_id(0).to(tl.int64)
    t = tl.load(tok_ptr + b * stok).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    for c0 in range(0, d, BLOCK):
        c = c0 + cols
        tl.store(s_ptr + b * ssm + c, tl.load(emb_ptr + t * se + c, mask=c < d), mask=c < d)
    tl.store(len_ptr + b, (tl.load(pos_ptr + b * spos) + 1).to(tl.int32))


def token_inputs(tokens: torch.Tensor, tok_emb: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See kernels.reference.token_inputs: one launch for what the torch ops take three (gather, add, convert)."""
    N, d = tokens.shape[0], tok_emb.shape[1]
    if tok_emb.stride(1) != 1:
        raise ValueError("token_inputs: the embeddings need a unit column stride")
    s = torch.empty((N, d), dtype=tok_emb.dtype, device=tok_emb.device)
    lengths = torch.empty((N,), dtype=torch.int32, device=tok_emb.device)
    if N:
        block = min(triton.next_power_of_2(d), 1024)
        _token_inputs_kernel[(N,)](
            tokens, tok_emb, pos, s, lengths, d, tokens.stride(0), tok_emb.stride(0), pos.stride(0), s.stride(0),
            BLOCK=block, num_warps=4 if block >= 256 else 1, **pdl.args(tok_emb.device),
        )  # fmt: skip
    return s, lengths


OPS = {
    "token_inputs": token_inputs,
    "norm_qkv_rope": norm_qkv_rope,
    "linear_residual": linear_residual,
    "norm_gate_up": norm_gate_up,
    "norm_logits": norm_logits,
}
