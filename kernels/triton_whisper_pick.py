"""Whisper's greedy pick in one launch: the logit rules after a window's first token, the argmax and its
log-probability, one program per row (reference: kernels.reference_pick.whisper_pick).

The torch ops take some twenty launches over the row (masks, log-softmax, the timestamps' log-sum-exp, the text's
max, another mask, argmax, log-softmax, gather): in a decode step of Whisper tiny replayed from a graph, a sizeable
part of the step. Here one pass over the row keeps, for the text tokens and for the timestamps apart, a running max,
its first index and a running sum of exponentials (online log-sum-exp), the rules' masks computed from the row's
state as the columns stream by. Text is ruled out ("forced timestamps") where the timestamps' log-sum-exp exceeds the
text's max (the reference's comparison, both sides shifted by the row's log-sum-exp); the pick is then the
timestamps' argmax, else the larger of the two maxima (the text's on a tie: the first index, as torch's argmax), and
its log-probability its logit less the log-sum-exp of what the rules leave. Ties and roundings aside (the sums'
order), the reference's ids and log-probabilities."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
def _whisper_pick_kernel(
    x_ptr, sup_ptr, st_ptr, ids_ptr, lp_ptr, V, sx, n, tb, eot, TIMESTAMPS: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0)
    last = tl.load(st_ptr + row)
    penult = tl.load(st_ptr + n + row)
    last_ts = tl.load(st_ptr + 2 * n + row)
    count = tl.load(st_ptr + 3 * n + row)
    last_is_ts = (count >= 1) & (last >= tb)
    penult_is_ts = (count < 2) | (penult >= tb)
    open_pair = last_is_ts & (penult_is_ts == 0)
    kill_ts = last_is_ts & penult_is_ts
    upto = tl.where(open_pair, last_ts, last_ts + 1)
    zero = tl.sum(tl.zeros((BLOCK,), dtype=tl.float32), axis=0)
    m_t, s_t, m_s, s_s = zero - float("inf"), zero, zero - float("inf"), zero  # text; timestamps
    a_t, a_s = (zero * 0).to(tl.int32), (zero * 0).to(tl.int32)
    for c0 in range(0, V, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        inside = cols < V
        x = tl.load(x_ptr + row.to(tl.int64) * sx + cols, mask=inside, other=float("-inf"))
        off = tl.load(sup_ptr + cols, mask=inside, other=1) != 0
        if TIMESTAMPS:
            ts = cols >= tb
            off = off | (kill_ts & ts) | (open_pair & (cols < eot)) | ((last_ts >= 0) & ts & (cols < upto))
            xt = tl.where(off | ts, float("-inf"), x)
            xs = tl.where(off | (ts == 0), float("-inf"), x)
            m_s, a_s, s_s = _online(xs, cols, m_s, a_s, s_s)
        else:
            xt = tl.where(off, float("-inf"), x)
        m_t, a_t, s_t = _online(xt, cols, m_t, a_t, s_t)
    # a sum holds exp(0) = 1 for its max when any column counted; none (no timestamps): -inf, so no force and no pick
    lse_s = m_s + tl.log(tl.maximum(s_s, 1e-30))
    force = lse_s > m_t
    both = tl.maximum(m_t, m_s)
    shift = tl.where(both == float("-inf"), 0.0, both)
    lse = shift + tl.log(tl.maximum(s_t * tl.exp(m_t - shift) + s_s * tl.exp(m_s - shift), 1e-30))
    take_s = force | (m_s > m_t)
    pick = tl.where(take_s, a_s, a_t)
    best = tl.where(take_s, m_s, m_t)
    lp = best - tl.where(force, lse_s, lse)
    tl.store(ids_ptr + row, pick.to(tl.int64))
    tl.store(lp_ptr + row, lp)


def config(V: int) -> dict:
    return {"BLOCK": min(triton.next_power_of_2(max(V, 16)), 2048), "num_warps": 8}


def whisper_pick(logits, suppress, state, timestamps: bool, tb: int, eot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] float32 (rows of unit column stride), `suppress` [V] bool, `state` [4, n] int64 (last,
    penult, last_ts, count) -> (ids [n] int64, log-probabilities [n] float32)."""
    n, V = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    st = state.contiguous()
    ids = torch.empty(n, dtype=torch.long, device=x.device)
    lp = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        sup = suppress.view(torch.uint8) if suppress.dtype == torch.bool else suppress
        _whisper_pick_kernel[(n,)](x, sup, st, ids, lp, V, x.stride(0), n, tb, eot, TIMESTAMPS=timestamps, **config(V))
    return ids, lp
