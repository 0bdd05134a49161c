"""Split K of the fused decode ops (kernels/triton_fused.py, triton_fused_quant.py): how many splits a launch takes,
and how their partial sums are added up: by the launch's own last split of each output tile (merges(); the default
but on ROCm), or by a second launch (this module's sum kernels).

A one-row decode step at the Llama-3.2-1B shape gives norm_qkv_rope 48 heads x 2 column-pair tiles = 96 programs and
the o / down projections 64 column tiles each, fewer than an H100's 132 SMs, each streaming all of K (2048, the down
projection's 8192): the GPU is under-filled and the weight stream far from its bandwidth. Each split's programs store
their float32 partial dot products; the program that finishes a tile's last split (triton_fused_parts: last_split,
decode attention's ticket and memory ordering), or one more launch of the unsplit grid, adds them up in a fixed
order (deterministic) and runs the unsplit kernel's own epilogue, so the roundings are the unsplit kernel's; only
float32 summation order differs. The RMSNorm folds into a split as it folds into the whole K loop (RMSNorm(x) W =
rstd ((x g) W), rstd from the row's sum of squares): the norm-folded ops' splits also store their rows' partial sums
of squares (triton_fused_parts.store_partials), and the merge takes rstd of the sum before the epilogue
(qkv_epilogue: bias, Qwen3 head norms, rotary, cache writes, Q; gate_up_epilogue: silu(gate) * up); linear_residual's
adds the bias and the residual (residual_epilogue). The weight format only changes the K loop.

The rule (k_splits): a grid of fewer programs than the device has SMs splits into as many as bring it near
target_programs (two per SM: kernels/triton_decode_attention.py; 128 SMs assumed without a GPU), each split keeping
at least MIN_SPLIT_TILES (8) K tiles. A grid of at least one program per SM does not split (the partials' round
trip and the merge, run after the last split by one program, would buy less than they cost), nor does a short K: a
program's K loop of a few tiles is a few dependent loads, about what the merge that follows it costs. Programs of a
one-row step, on an H100 (132 SMs, target 264):

    one-row step (bf16; fp8, int8, int4 G 128 alike)   Llama-3.2-1B, K 2048       SmolLM2-135M, K 576
    norm_qkv_rope, 16 column pairs a program           96 -> 3 splits: 288        30: no split
    norm_qkv_rope, Qwen3 head norms (whole heads)      48 -> 4 splits: 192        15: no split
    norm_gate_up, 32 columns a program                 256: no split              48: no split
    linear_residual (o), 32 columns a program          64 -> 4 splits: 256        18: no split
    linear_residual (down; K 8192 / 1536)              64 -> 5 splits: 320        18 -> 3 splits: 54

(int4 in groups of 32 has K tiles of 32: SmolLM2's norm-folded ops split in 2.) Up to 16 rows (one row tile): the same
splits. The minimum is a reasoned guess until a GPU times it: `bench gpu --checks lm-fused` runs each step with the
rule, with SPLITS = 1 and with a minimum of 2 tiles at both shapes, and checks the one-launch merge against the second
launch on NaN-poisoned partial buffers (its memory ordering: only a GPU can test it).

`SPLITS` overrides the rule (1: no split; n: n splits, each at least one K tile, the tests' and the benchmarks'
knob: `bench gpu` times the steps with the rule and with SPLITS = 1); `ONE_LAUNCH` forces the merge on or off."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_fused_parts as fp
from . import triton_pdl as pdl
from .triton_decode_attention import PROGRAMS_PER_SM, counters, merge_options, target_programs

SPLITS: int | None = None  # None: the rule (k_splits); an int: that many splits of every fused op (1: none)
ONE_LAUNCH: bool | None = None  # None: the splits merge in their launch but on ROCm (merges()); True / False: forced
MIN_SPLIT_TILES = 8  # K tiles each split keeps at least, by the rule


def k_splits(tiles: int, K: int, bk: int, device=None, splits: int | None = None) -> tuple[int, int]:
    """(splits, columns of K per split, a multiple of the K tile bk: an int4 split starts at a group's tile) of a
    launch of `tiles` programs on `device`: `splits` when given (each keeping one K tile at least), else the rule
    (see the module's docstring)."""
    target = target_programs(device)
    if splits is None:
        splits = (
            min(triton.cdiv(target, tiles), K // (MIN_SPLIT_TILES * bk)) if tiles * PROGRAMS_PER_SM <= target else 1
        )
    k_split = triton.cdiv(triton.cdiv(K, max(1, splits)), bk) * bk
    return triton.cdiv(K, k_split), k_split


def partials(tiles: int, K: int, bk: int, M: int, width: int, out: torch.Tensor) -> tuple[int, int, dict]:
    """The K split of a norm-folded launch (SPLITS, else the rule) -> (splits, k_split, its partial buffers' kernel
    arguments: p_ptr [splits, M, width] and ss_ptr [splits, M] in float32; `out` in both places without a split)."""
    splits, k_split = k_splits(tiles, K, bk, out.device, SPLITS)
    if splits == 1:
        return 1, k_split, {"p_ptr": out, "ss_ptr": out}
    buf = torch.empty(splits * M * (width + 1), dtype=torch.float32, device=out.device)
    return splits, k_split, {"p_ptr": buf, "ss_ptr": buf[splits * M * width :]}


@triton.jit
def _sum_qkv_kernel(
    p_ptr, ss_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr,
    SPLITS, M, K, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """norm_qkv_rope's epilogue on its K splits' partial sums, on the unsplit grid (row blocks, heads, chunks)."""
    pdl.gate(PDL)
    rm, mm, head, d, dm, col, _, _ = fp.head_tile(M, HALF, BLOCK_M, BLOCK_HALF)
    like = tl.zeros((BLOCK_M, BLOCK_HALF), dtype=tl.float32)
    acc1, acc2, ss = fp.sum_partials(p_ptr, ss_ptr, SPLITS, like, rm, mm, col, dm, HALF, (H + 2 * HKV) * 2 * HALF, M)
    fp.qkv_epilogue(
        acc1, acc2, fp.rstd(ss, K, eps), rm, mm, head, d, dm, col, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr,
        q_ptr, kc_ptr, vc_ptr, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps, HAS_BIAS, QK_NORM,
    )  # fmt: skip


@triton.jit
def _sum_gate_up_kernel(
    p_ptr, ss_ptr, y_ptr, SPLITS, M, N, K, sym, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """norm_gate_up's epilogue on its K splits' partial sums, on the unsplit grid (row blocks, column blocks)."""
    pdl.gate(PDL)
    rm, rn = fp.row_col_tile(BLOCK_M, BLOCK_N)
    like = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_g, acc_u, ss = fp.sum_partials(p_ptr, ss_ptr, SPLITS, like, rm, rm < M, rn, rn < N, N, 2 * N, M)
    fp.gate_up_epilogue(acc_g, acc_u, fp.rstd(ss, K, eps), rm, rn, M, N, y_ptr, sym)


@triton.jit
def _sum_residual_kernel(
    p_ptr, b_ptr, r_ptr, y_ptr, SPLITS, M, N, srm, sym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """linear_residual's epilogue on split-K partial sums p [SPLITS, M, N], added in a fixed order (deterministic)."""
    pdl.gate(PDL)
    rm, rn = fp.row_col_tile(BLOCK_M, BLOCK_N)
    acc = fp.sum_splits(p_ptr, SPLITS, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), rm, rn, M, N)
    fp.residual_epilogue(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, srm, sym, HAS_BIAS)


def merges() -> bool:
    """Whether a split launch adds its splits up itself (ONE_LAUNCH; None: not on ROCm, as decode attention's merge,
    whose memory ordering this one shares and which is unverified on AMD)."""
    return ONE_LAUNCH if ONE_LAUNCH is not None else torch.version.hip is None


def merge_args(splits: int, tiles: int, out: torch.Tensor) -> dict:
    """A launch's cnt_ptr and MERGE: with several splits that merge in the launch, one counter per output tile (the
    thread's counters on the device, which decode attention's merges share: each is 0 between launches), and on
    NVIDIA the register cap (triton_decode_attention.MERGE_MAXNREG); else `out` in its place (not read)."""
    merge = splits > 1 and merges()
    args = {"cnt_ptr": counters(out.device, tiles) if merge else out, "MERGE": merge}
    return {**args, **merge_options(out.device)} if merge else args


def sum_qkv(grid, splits: int, parts: dict, c: dict, epilogue: dict) -> None:
    """Launches _sum_qkv_kernel on norm_qkv_rope's grid, with the epilogue's arguments of its first launch."""
    _sum_qkv_kernel[grid](
        **parts, SPLITS=splits, BLOCK_M=c["BLOCK_M"], BLOCK_HALF=c["BLOCK_HALF"], num_warps=4, **epilogue,
        **pdl.args(parts["p_ptr"].device),
    )  # fmt: skip


def sum_gate_up(grid, splits: int, parts: dict, c: dict, y: torch.Tensor, K: int, eps: float) -> None:
    """Launches _sum_gate_up_kernel on norm_gate_up's grid."""
    _sum_gate_up_kernel[grid](
        **parts, y_ptr=y, SPLITS=splits, M=y.shape[0], N=y.shape[1], K=K, sym=y.stride(0), eps=eps,
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], num_warps=4, **pdl.args(y.device),
    )  # fmt: skip


def sum_residual(grid, splits: int, parts: torch.Tensor, kw: dict, y: torch.Tensor, c: dict) -> None:
    """Launches _sum_residual_kernel on linear_residual's grid: `kw` its first launch's bias and residual arguments."""
    M, N = y.shape
    _sum_residual_kernel[grid](
        parts, kw["b_ptr"], kw["r_ptr"], y, splits, M, N, kw["srm"], y.stride(0), HAS_BIAS=kw["HAS_BIAS"],
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], **pdl.args(y.device),
    )  # fmt: skip
