"""The Triton building blocks the fused decode-step kernels share (kernels/triton_fused.py, triton_fused_quant.py,
triton_fused_split.py, triton_fused_whisper.py): the rounding that mirrors the unfused ops, the programs' tiles, K
ranges and split partial sums, and the epilogues run after a K loop (Q/K/V: rotary and cache writes; residual;
silu(gate) * up).

A K split's partial sums are added up either by a second launch (kernels/triton_fused_split.py's sum kernels) or,
with MERGE, in the same launch: each program of a split stores its partials, then draws a ticket from its output
tile's int32 counter (last_split); the program that draws the last one (SPLITS - 1) adds every split's partials up in
split order, as the second launch would (sum_partials: the same result whichever program merges), runs the epilogue
and puts the counter back to 0 for the next launch or graph replay. The memory ordering is decode attention's
one-launch merge's (kernels/triton_decode_attention.py's docstring): a barrier, one acq_rel atomic at GPU scope, a
barrier, loads through L2. The interpreter runs programs one at a time, so it checks the arithmetic, the tickets and
the counters' reset, not the ordering; `speechrt bench gpu --checks lm-fused` checks that on NaN-poisoned buffers."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rnd(x, DT: tl.constexpr):
    """float32 x rounded to DT (to nearest even), kept in float32. bf16 by bit arithmetic: the Triton
    interpreter truncates float32 -> bf16 conversions (a GPU rounds), and the chains of roundings that mirror
    the unfused ops would drift by ulps there; on a GPU the same few integer ops per element."""
    if DT == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def rstd(ss, K, eps):
    """1 / rms of rows of K columns from their sums of squares."""
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def k_range(split, K_SPLIT, K, SPLIT: tl.constexpr):
    """The columns k_lo .. k_hi of x that a program's K loop covers: its split's with SPLIT, else all K (the loop of
    the unsplit kernels as it was: bounds the compiler knows start at 0)."""
    k_lo = 0
    k_hi = K
    if SPLIT:
        k_lo = split * K_SPLIT
        k_hi = tl.minimum(K, k_lo + K_SPLIT)
    return k_lo, k_hi


@triton.jit
def head_tile(M, HALF, BLOCK_M: tl.constexpr, BLOCK_HALF: tl.constexpr, SPLIT: tl.constexpr = False):
    """A norm_qkv_rope program's share, from its grid (row blocks, H + 2 HKV heads, chunks of D/2; with SPLIT, K
    splits x chunks): rows rm (mm: which exist), head `head`, its column pairs (d, d + D/2) (dm: which exist), the
    first ones' rows of W (col; + HALF for the second), its K split and its output tile's index (row block, head,
    chunk: what its splits share)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1)
    chunk = tl.program_id(2)
    chunks = tl.cdiv(HALF, BLOCK_HALF)
    split = 0
    if SPLIT:
        split = chunk // chunks
        chunk = chunk % chunks
    d = chunk * BLOCK_HALF + tl.arange(0, BLOCK_HALF)
    col = (head * 2 * HALF + d).to(tl.int64)
    tile = (tl.program_id(0) * tl.num_programs(1) + head) * chunks + chunk
    return rm, rm < M, head, d, d < HALF, col, split, tile


@triton.jit
def row_col_tile(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A program's rows and output columns in a (row blocks, column blocks) grid."""
    return tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M), tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def store_partials(p_ptr, ss_ptr, acc1, acc2, ss, split, rm, mm, cols, cm, second, NW, M):
    """A K split's share of a norm-folded pair of projections, for sum_partials to add up: acc1 and acc2 (W's rows
    cols and cols + second) into p [splits, M, NW] float32, and the rows' sums of squares into ss [splits, M]. Every
    program of a split computes those alike (the same loads in the same order: the same bits) and stores them, so a
    tile's merging program finds each split's sums stored by that split's program of its own tile."""
    pp = p_ptr + (split * M + rm[:, None]).to(tl.int64) * NW + cols[None, :]
    pm = mm[:, None] & cm[None, :]
    tl.store(pp, acc1, mask=pm)
    tl.store(pp + second, acc2, mask=pm)
    tl.store(ss_ptr + split * M + rm, ss, mask=mm)


@triton.jit
def sum_partials(p_ptr, ss_ptr, SPLITS, like, rm, mm, cols, cm, second, NW, M):
    """What store_partials left of SPLITS splits, added up in split order: the two projections' float32 sums at W's
    rows cols and cols + second (shaped `like`), and the rows' sums of squares. Loads through L2 (".cg"): other
    programs wrote them."""
    acc1 = tl.zeros_like(like)
    acc2 = tl.zeros_like(like)
    ss = tl.zeros([like.shape[0]], dtype=tl.float32)
    pm = mm[:, None] & cm[None, :]
    for s in range(0, SPLITS):
        pp = p_ptr + (s * M + rm[:, None]).to(tl.int64) * NW + cols[None, :]
        acc1 += tl.load(pp, mask=pm, other=0.0, cache_modifier=".cg")
        acc2 += tl.load(pp + second, mask=pm, other=0.0, cache_modifier=".cg")
        ss += tl.load(ss_ptr + s * M + rm, mask=mm, other=0.0, cache_modifier=".cg")
    return acc1, acc2, ss


@triton.jit
def sum_splits(p_ptr, SPLITS, like, rm, rn, M, N):
    """linear_residual's split-K partial sums p [SPLITS, M, N] at rows rm, columns rn, added up in split order
    (float32, shaped `like`; loads through L2)."""
    pp = p_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
    pm = (rm < M)[:, None] & (rn < N)[None, :]
    acc = tl.zeros_like(like)
    for s in range(0, SPLITS):
        acc += tl.load(pp + s * M * N, mask=pm, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def last_split(cnt_ptr, tile, SPLITS):
    """Whether this program, having stored its split's partials, is the last of output tile `tile`'s SPLITS programs
    to do so (the module docstring: a barrier, a ticket from the tile's counter, a barrier)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    return ticket == SPLITS - 1


@triton.jit
def qkv_epilogue(
    acc1, acc2, rstd, rm, mm, head, d, dm, col, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr,
    vc_ptr, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr,
):  # fmt: skip
    """norm_qkv_rope after its K loop: the float32 projections of the column pairs (acc1, acc2) scaled by rstd, +
    bias, the Qwen3 head norm, rotary, and the stores: Q, or K / V into the cache at each row's (slot, position)."""
    DT: tl.constexpr = q_ptr.dtype.element_ty
    # the projection's output, rounded to the activation dtype as the unfused linear leaves it
    y1 = rnd(acc1 * rstd[:, None], DT)
    y2 = rnd(acc2 * rstd[:, None], DT)
    if HAS_BIAS:
        y1 = rnd(y1 + tl.load(b_ptr + col, mask=dm, other=0.0).to(tl.float32)[None, :], DT)
        y2 = rnd(y2 + tl.load(b_ptr + col + HALF, mask=dm, other=0.0).to(tl.float32)[None, :], DT)
    om = mm[:, None] & dm[None, :]
    pos = tl.load(pos_ptr + rm, mask=mm, other=0).to(tl.int64)
    slot = (s0 + rm).to(tl.int64)
    if head < H + HKV:
        if QK_NORM:  # the whole head is in this program (one chunk): its RMSNorm, weight [D] of q or k
            r = 1.0 / tl.sqrt(tl.sum(y1 * y1 + y2 * y2, axis=1) / (2 * HALF) + eps)
            # the weight of q's norm or of k's (both tiny, both read)
            n1 = tl.where(head < H, tl.load(qn_ptr + d, mask=dm, other=0.0), tl.load(kn_ptr + d, mask=dm, other=0.0))
            n2 = tl.load(qn_ptr + HALF + d, mask=dm, other=0.0)
            n2 = tl.where(head < H, n2, tl.load(kn_ptr + HALF + d, mask=dm, other=0.0))
            n1, n2 = n1.to(tl.float32), n2.to(tl.float32)
            y1 = rnd(rnd(y1 * r[:, None], DT) * n1[None, :], DT)
            y2 = rnd(rnd(y2 * r[:, None], DT) * n2[None, :], DT)
        pc = pos[:, None] * sct + d[None, :]
        c = tl.load(cos_ptr + pc, mask=om, other=0.0)
        s = tl.load(sin_ptr + pc, mask=om, other=0.0)
        o1 = rnd(y1 * c - y2 * s, DT).to(DT)
        o2 = rnd(y2 * c + y1 * s, DT).to(DT)
        if head < H:
            po = q_ptr + rm[:, None].to(tl.int64) * sqm + head * sqh + d[None, :]
        else:
            po = kc_ptr + slot[:, None] * skb + (head - H) * skh + pos[:, None] * skt + d[None, :]
        tl.store(po, o1, mask=om)
        tl.store(po + HALF, o2, mask=om)
    else:
        po = vc_ptr + slot[:, None] * svb + (head - H - HKV) * svh + pos[:, None] * svt + d[None, :]
        tl.store(po, y1.to(DT), mask=om)
        tl.store(po + HALF, y2.to(DT), mask=om)


@triton.jit
def residual_epilogue(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, srm, sym, HAS_BIAS: tl.constexpr):
    """linear_residual after its K loop: y = r + (acc + bias), the product (with its bias, Whisper's) rounded to the
    activation dtype first (as the unfused linear leaves it)."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    om = (rm < M)[:, None] & (rn < N)[None, :]
    r = tl.load(r_ptr + rm[:, None].to(tl.int64) * srm + rn[None, :], mask=om, other=0.0).to(tl.float32)
    y = rnd(rnd(acc, DT) + r, DT)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], y.to(DT), mask=om)


@triton.jit
def residual_out(
    acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, p_ptr, cnt_ptr, srm, sym,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, MERGE: tl.constexpr,
):  # fmt: skip
    """The end of linear_residual's K loop (float or quantized) on a (row blocks, column blocks, K splits) grid:
    residual_epilogue; with SPLIT, the split's float32 partial sums into p [splits, M, N], added up by a second launch
    (triton_fused_split._sum_residual_kernel) or, with MERGE, by the tile's last split here."""
    if SPLIT:
        splits = tl.num_programs(2)
        pp = p_ptr + (tl.program_id(2) * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(pp, acc, mask=(rm < M)[:, None] & (rn < N)[None, :])
        if MERGE:
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            if last_split(cnt_ptr, tile, splits):
                acc = sum_splits(p_ptr, splits, acc, rm, rn, M, N)
                residual_epilogue(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, srm, sym, HAS_BIAS)
                tl.store(cnt_ptr + tile, 0)
    else:
        residual_epilogue(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, srm, sym, HAS_BIAS)


@triton.jit
def qkv_out(
    acc1, acc2, ss, rm, mm, head, d, dm, col, split, tile, p_ptr, ss_ptr, cnt_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr,
    sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, M, K, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, SPLIT: tl.constexpr, MERGE: tl.constexpr,
):  # fmt: skip
    """The end of norm_qkv_rope's K loop (float or quantized; head_tile's share): qkv_epilogue; with SPLIT, the
    split's partial sums (store_partials), added up by a second launch (triton_fused_split._sum_qkv_kernel) or, with
    MERGE, by the tile's last split here."""
    if SPLIT:
        NW = (H + 2 * HKV) * 2 * HALF
        store_partials(p_ptr, ss_ptr, acc1, acc2, ss, split, rm, mm, col, dm, HALF, NW, M)
        if MERGE:
            splits = tl.num_programs(2) // tl.cdiv(HALF, d.shape[0])  # the grid's axis 2: splits x chunks
            if last_split(cnt_ptr, tile, splits):
                acc1, acc2, ss = sum_partials(p_ptr, ss_ptr, splits, acc1, rm, mm, col, dm, HALF, NW, M)
                qkv_epilogue(
                    acc1, acc2, rstd(ss, K, eps), rm, mm, head, d, dm, col, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr,
                    pos_ptr, q_ptr, kc_ptr, vc_ptr, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt,
                    eps, HAS_BIAS, QK_NORM,
                )  # fmt: skip
                tl.store(cnt_ptr + tile, 0)
    else:
        qkv_epilogue(
            acc1, acc2, rstd(ss, K, eps), rm, mm, head, d, dm, col, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr,
            q_ptr, kc_ptr, vc_ptr, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps, HAS_BIAS,
            QK_NORM,
        )  # fmt: skip


@triton.jit
def gate_up_out(
    acc_g, acc_u, ss, rm, rn, M, N, K, p_ptr, ss_ptr, cnt_ptr, y_ptr, sym, eps,
    SPLIT: tl.constexpr, MERGE: tl.constexpr,
):  # fmt: skip
    """The end of norm_gate_up's K loop (float or quantized) on a (row blocks, column blocks, K splits) grid:
    gate_up_epilogue; with SPLIT, the split's partial sums (store_partials), added up by a second launch
    (triton_fused_split._sum_gate_up_kernel) or, with MERGE, by the tile's last split here."""
    if SPLIT:
        splits = tl.num_programs(2)
        store_partials(p_ptr, ss_ptr, acc_g, acc_u, ss, tl.program_id(2), rm, rm < M, rn, rn < N, N, 2 * N, M)
        if MERGE:
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            if last_split(cnt_ptr, tile, splits):
                acc_g, acc_u, ss = sum_partials(p_ptr, ss_ptr, splits, acc_g, rm, rm < M, rn, rn < N, N, 2 * N, M)
                gate_up_epilogue(acc_g, acc_u, rstd(ss, K, eps), rm, rn, M, N, y_ptr, sym)
                tl.store(cnt_ptr + tile, 0)
    else:
        gate_up_epilogue(acc_g, acc_u, rstd(ss, K, eps), rm, rn, M, N, y_ptr, sym)


@triton.jit
def gate_up_epilogue(acc_g, acc_u, rstd, rm, rn, M, N, y_ptr, sym):
    """norm_gate_up after its K loop: silu(gate) * up of the float32 projections scaled by rstd."""
    DT: tl.constexpr = y_ptr.dtype.element_ty
    nm = rn < N
    g = rnd(acc_g * rstd[:, None], DT)
    u = rnd(acc_u * rstd[:, None], DT)
    s = rnd(g / (1.0 + tl.exp(-g)), DT)  # the reference rounds silu(g) before the product
    om = (rm < M)[:, None] & nm[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], rnd(s * u, DT).to(DT), mask=om)
