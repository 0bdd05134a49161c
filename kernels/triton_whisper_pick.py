"""Whisper's greedy pick in one pass over the vocabulary: the logit rules after a window's first token, the argmax
and its log-probability (reference: kernels.reference_pick.whisper_pick).

The torch ops take some twenty launches over the row (masks, log-softmax, the timestamps' log-sum-exp, the text's
max, another mask, argmax, log-softmax, gather): in a decode step of Whisper tiny replayed from a graph, a sizeable
part of the step. Here one pass over the row keeps, for the text tokens and for the timestamps apart, a running max,
its first index and a running sum of exponentials (online log-sum-exp), the rules' masks computed from the row's
state as the columns stream by (every mask is elementwise: a column's fate depends on its index and the row's state
only). Text is ruled out ("forced timestamps") where the timestamps' log-sum-exp exceeds the text's max (the
reference's comparison, both sides shifted by the row's log-sum-exp); the pick is then the timestamps' argmax, else
the larger of the two maxima (the text's on a tie: the first index, as torch's argmax), and its log-probability its
logit less the log-sum-exp of what the rules leave. Ties and roundings aside (the sums' order), the reference's ids
and log-probabilities.

Two launch shapes. Many rows: one program per row streams the whole row. Few rows (batch 1, the real-time case):
one program would stream ~200 KB on one SM, so each row's columns are split into chunks over several programs
(rows x chunks near the device's SM count), each writing its chunk's six numbers (both maxima, their first indices,
both sums) to a small workspace; the row's chunk that finishes last merges them (the maxima exactly, the first index
among the chunks that hold the max: the same ids as one program; the sums rescaled to the common max) and decides
the forced rule on the merged row, as the one-program kernel does. The last is the program that draws the row's
last ticket from its counter, decode attention's one-launch merge (its memory ordering, its counters: see
kernels/triton_decode_attention.py); on ROCm (merges_in_launch) a second launch, one program per row, merges. No
host sync: the workspace is allocated per call (fixed addresses under a CUDA graph capture, as the outputs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .triton_decode_attention import counters, merges_in_launch, multiprocessors

SPLIT_BLOCK = 512  # columns a split program loads at once (4 warps, 4 floats a thread)


@triton.jit
def _online(x, cols, m, arg, s):
    """Fold a block of (masked) logits into a running max, its first index and sum of exp(x - max)."""
    bm = tl.max(x, axis=0)
    barg = tl.min(tl.where(x == bm, cols, 2147483647), axis=0)
    new = tl.maximum(m, bm)
    shift = tl.where(new == float("-inf"), 0.0, new)
    s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
    arg = tl.where(bm > m, barg, arg)
    return new, arg, s


@triton.jit
def _row_rules(st_ptr, row, n, tb):
    """A row's rule state ([4, n]: last, penult, last_ts, count) -> (timestamps ruled out: after a closed pair, text
    ruled out: an open pair, a timestamp came before, the first timestamp still allowed)."""
    last = tl.load(st_ptr + row)
    penult = tl.load(st_ptr + n + row)
    last_ts = tl.load(st_ptr + 2 * n + row)
    count = tl.load(st_ptr + 3 * n + row)
    last_is_ts = (count >= 1) & (last >= tb)
    penult_is_ts = (count < 2) | (penult >= tb)
    open_pair = last_is_ts & (penult_is_ts == 0)
    return last_is_ts & penult_is_ts, open_pair, last_ts >= 0, tl.where(open_pair, last_ts, last_ts + 1)


@triton.jit
def _fold_block(x_ptr, sup_ptr, row, sx, cols, V, tb, eot, st, acc, TIMESTAMPS: tl.constexpr):
    """Fold columns `cols` of `row` into acc = (text max, its index, its sum, timestamps' max, index, sum), the rules'
    masks (st: _row_rules) applied elementwise."""
    kill_ts, open_pair, had_ts, upto = st
    m_t, a_t, s_t, m_s, a_s, s_s = acc
    inside = cols < V
    x = tl.load(x_ptr + row.to(tl.int64) * sx + cols, mask=inside, other=float("-inf"))
    off = tl.load(sup_ptr + cols, mask=inside, other=1) != 0
    if TIMESTAMPS:
        ts = cols >= tb
        off = off | (kill_ts & ts) | (open_pair & (cols < eot)) | (had_ts & ts & (cols < upto))
        xt = tl.where(off | ts, float("-inf"), x)
        xs = tl.where(off | (ts == 0), float("-inf"), x)
        m_s, a_s, s_s = _online(xs, cols, m_s, a_s, s_s)
    else:
        xt = tl.where(off, float("-inf"), x)
    m_t, a_t, s_t = _online(xt, cols, m_t, a_t, s_t)
    return m_t, a_t, s_t, m_s, a_s, s_s


@triton.jit
def _empty_acc(BLOCK: tl.constexpr):
    zero = tl.sum(tl.zeros((BLOCK,), dtype=tl.float32), axis=0)
    none = (zero * 0).to(tl.int32)
    return zero - float("inf"), none, zero, zero - float("inf"), none, zero


@triton.jit
def _finish(m_t, a_t, s_t, m_s, a_s, s_s):
    """A whole row's text and timestamp (max, first index, sum of exp(x - max)) -> (the pick, its log-probability)."""
    # a sum holds exp(0) = 1 for its max when any column counted; none (no timestamps): -inf, so no force and no pick
    lse_s = m_s + tl.log(tl.maximum(s_s, 1e-30))
    force = lse_s > m_t
    both = tl.maximum(m_t, m_s)
    shift = tl.where(both == float("-inf"), 0.0, both)
    lse = shift + tl.log(tl.maximum(s_t * tl.exp(m_t - shift) + s_s * tl.exp(m_s - shift), 1e-30))
    take_s = force | (m_s > m_t)
    pick = tl.where(take_s, a_s, a_t)
    best = tl.where(take_s, m_s, m_t)
    return pick, best - tl.where(force, lse_s, lse)


@triton.jit
def _whisper_pick_kernel(
    x_ptr, sup_ptr, st_ptr, ids_ptr, lp_ptr, V, sx, n, tb, eot, TIMESTAMPS: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    row = tl.program_id(0)
    st = _row_rules(st_ptr, row, n, tb)
    acc = _empty_acc(BLOCK)
    for c0 in range(0, V, BLOCK):
        acc = _fold_block(x_ptr, sup_ptr, row, sx, c0 + tl.arange(0, BLOCK), V, tb, eot, st, acc, TIMESTAMPS)
    pick, lp = _finish(*acc)
    tl.store(ids_ptr + row, pick.to(tl.int64))
    tl.store(lp_ptr + row, lp)


@triton.jit
def _whisper_pick_part_kernel(
    x_ptr, sup_ptr, st_ptr, pf_ptr, pi_ptr, cnt_ptr, ids_ptr, lp_ptr, V, sx, n, tb, eot, CHUNK,
    TIMESTAMPS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, MERGE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (row, chunk): columns [chunk * CHUNK, (chunk + 1) * CHUNK) of the row -> its partial state at
    pf [4, n, chunks] (text max, text sum, timestamps' max, their sum), pi [2, n, chunks] (the maxima's indices);
    with MERGE, the row's last chunk to finish (its ticket from cnt [n]) merges them into ids / lp."""
    pdl.gate(PDL)
    row, chunk, chunks = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    st = _row_rules(st_ptr, row, n, tb)
    acc = _empty_acc(BLOCK)
    start = chunk * CHUNK
    for c0 in range(start, tl.minimum(start + CHUNK, V), BLOCK):
        acc = _fold_block(x_ptr, sup_ptr, row, sx, c0 + tl.arange(0, BLOCK), V, tb, eot, st, acc, TIMESTAMPS)
    m_t, a_t, s_t, m_s, a_s, s_s = acc
    at, parts = row * chunks + chunk, n * chunks
    tl.store(pf_ptr + at, m_t)
    tl.store(pf_ptr + parts + at, s_t)
    tl.store(pf_ptr + 2 * parts + at, m_s)
    tl.store(pf_ptr + 3 * parts + at, s_s)
    tl.store(pi_ptr + at, a_t)
    tl.store(pi_ptr + parts + at, a_s)
    if MERGE:  # the module docstring: stores, a barrier, a ticket, a barrier, loads through L2
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
        if ticket == chunks - 1:
            tl.debug_barrier()
            _combine(pf_ptr, pi_ptr, ids_ptr, lp_ptr, row, n, chunks, BLOCK_C)
            tl.store(cnt_ptr + row, 0)


@triton.jit
def _merge(m, a, s):
    """Chunks' (max, first index, sum of exp(x - max)) in column order -> the row's: the first index among the chunks
    holding the max (each chunk's own is its first), the sums rescaled to the common max."""
    big = tl.max(m, axis=0)
    arg = tl.min(tl.where(m == big, a, 2147483647), axis=0)
    shift = tl.where(big == float("-inf"), 0.0, big)
    return big, arg, tl.sum(s * tl.exp(m - shift), axis=0)


@triton.jit
def _whisper_pick_combine_kernel(
    pf_ptr, pi_ptr, ids_ptr, lp_ptr, n, CHUNKS, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False
):
    """Program row: its chunks' partial states (the part kernel's) -> the pick and its log-probability (the second
    launch, where the part kernel does not merge)."""
    pdl.gate(PDL)
    _combine(pf_ptr, pi_ptr, ids_ptr, lp_ptr, tl.program_id(0), n, CHUNKS, BLOCK_C)


@triton.jit
def _combine(pf_ptr, pi_ptr, ids_ptr, lp_ptr, row, n, CHUNKS, BLOCK_C: tl.constexpr):
    """Row `row`'s chunks' partial states -> its pick and log-probability (loads through L2: other programs wrote
    them)."""
    c = tl.arange(0, BLOCK_C)
    ok = c < CHUNKS
    at, parts = row * CHUNKS + c, n * CHUNKS
    m_t = tl.load(pf_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
    s_t = tl.load(pf_ptr + parts + at, mask=ok, other=0.0, cache_modifier=".cg")
    m_s = tl.load(pf_ptr + 2 * parts + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
    s_s = tl.load(pf_ptr + 3 * parts + at, mask=ok, other=0.0, cache_modifier=".cg")
    a_t = tl.load(pi_ptr + at, mask=ok, other=2147483647, cache_modifier=".cg")
    a_s = tl.load(pi_ptr + parts + at, mask=ok, other=2147483647, cache_modifier=".cg")
    m_t, a_t, s_t = _merge(m_t, a_t, s_t)
    m_s, a_s, s_s = _merge(m_s, a_s, s_s)
    pick, lp = _finish(m_t, a_t, s_t, m_s, a_s, s_s)
    tl.store(ids_ptr + row, pick.to(tl.int64))
    tl.store(lp_ptr + row, lp)


def config(V: int) -> dict:
    """The one-program kernel's launch: a row in blocks of up to 2048 columns."""
    return {"BLOCK": min(triton.next_power_of_2(max(V, 16)), 2048), "num_warps": 8}


def split_config(n: int, V: int, programs: int, chunks: int | None = None, block: int | None = None) -> dict:
    """How `n` rows of `V` columns split: chunks of CHUNK columns (a multiple of BLOCK) per row, CHUNKS of them, so
    that rows x chunks reaches `programs` (the device's SM count) with chunks of at least SPLIT_BLOCK columns;
    CHUNKS 1 (many rows, a short row): the one-program kernel. `chunks` and `block` force a split (tests, the bench:
    `block` sets the columns a program loads at once, `chunks` the count asked for, rounded to whole blocks)."""
    want = chunks if chunks is not None else triton.cdiv(max(programs, 1), max(n, 1))
    per = triton.cdiv(V, max(1, min(want, V)))
    block = block or (min(SPLIT_BLOCK, max(16, triton.next_power_of_2(per))) if chunks is not None else SPLIT_BLOCK)
    chunk = triton.cdiv(per, block) * block
    count = triton.cdiv(V, chunk)
    return {"CHUNK": chunk, "CHUNKS": count, "BLOCK": block, "BLOCK_C": max(16, triton.next_power_of_2(count))}


def whisper_pick(
    logits,
    suppress,
    state,
    timestamps: bool,
    tb: int,
    eot: int,
    chunks: int | None = None,
    block: int | None = None,
    one_launch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] float32 (rows of unit column stride), `suppress` [V] bool, `state` [4, n] int64 (last,
    penult, last_ts, count) -> (ids [n] int64, log-probabilities [n] float32). Few rows split each row over several
    programs (split_config; `chunks` / `block` force a split, chunks=1 one program a row), merged in the same launch
    (`one_launch`; None: merges_in_launch(), not on ROCm) or by a second."""
    n, V = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    st = state.contiguous()
    ids = torch.empty(n, dtype=torch.long, device=x.device)
    lp = torch.empty(n, dtype=torch.float32, device=x.device)
    if not n:
        return ids, lp
    sup = suppress.view(torch.uint8) if suppress.dtype == torch.bool else suppress
    args = (V, x.stride(0), n, tb, eot)
    sc = split_config(n, V, multiprocessors(x.device), chunks, block)
    on = pdl.args(x.device)
    if sc["CHUNKS"] == 1:
        _whisper_pick_kernel[(n,)](x, sup, st, ids, lp, *args, TIMESTAMPS=timestamps, **config(V), **on)
        return ids, lp
    k = sc["CHUNKS"]
    pf = torch.empty((4, n, k), dtype=torch.float32, device=x.device)
    pi = torch.empty((2, n, k), dtype=torch.int32, device=x.device)
    bw = sc["BLOCK"]
    merge = merges_in_launch() if one_launch is None else one_launch
    cnt = counters(x.device, n) if merge else pi
    _whisper_pick_part_kernel[(n, k)](
        x, sup, st, pf, pi, cnt, ids, lp, *args, sc["CHUNK"], TIMESTAMPS=timestamps, BLOCK=bw,
        BLOCK_C=sc["BLOCK_C"], MERGE=merge, num_warps=4 if bw >= 512 else 2, **on,
    )  # fmt: skip
    if not merge:
        _whisper_pick_combine_kernel[(n,)](pf, pi, ids, lp, n, k, BLOCK_C=sc["BLOCK_C"], num_warps=1, **on)
    return ids, lp
