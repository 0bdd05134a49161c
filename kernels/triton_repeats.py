"""The repetition stop's step in a decode block in one launch, one program per row (reference:
kernels.reference_repeats.repeat_advance): the torch ops take some ten launches of a few elements each, a
sizeable part of a decode step replayed from a graph."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl


@triton.jit
def _repeat_step_kernel(
    last_ptr, run_ptr, need_ptr, t_ptr, done_ptr, last_out, run_out, done_out, sl, sr, sn, P: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, P)
    t = tl.load(t_ptr + row)
    last = tl.load(last_ptr + row * sl + p)
    before = tl.load(last_ptr + row * sl + p - 1, mask=p > 0, other=0)
    run = tl.where(last == t, tl.load(run_ptr + row * sr + p) + 1, 0)
    need = tl.load(need_ptr + row * sn + p)
    run1 = tl.sum(tl.where(p == 0, run, 0), axis=0)
    loop = (run >= need) & ((p == 0) | (run1 < p))
    done = (tl.load(done_ptr + row) != 0) | (tl.max(loop.to(tl.int32), axis=0) > 0)
    tl.store(last_out + row * P + p, tl.where(p == 0, t, before))
    tl.store(run_out + row * P + p, run)
    tl.store(done_out + row, done.to(tl.uint8))


def repeat_advance(last, run, need, t, done) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As kernels.reference_repeats.repeat_advance (last, run, need: [rows, P] int64 of unit column stride, P a
    power of two; t [rows] int64; done [rows] bool)."""
    rows, P = last.shape
    last_new = torch.empty((rows, P), dtype=torch.long, device=t.device)
    run_new = torch.empty_like(last_new)
    done_new = torch.empty(rows, dtype=torch.bool, device=t.device)
    if rows:
        _repeat_step_kernel[(rows,)](
            last, run, need, t.contiguous(), done.view(torch.uint8), last_new, run_new, done_new.view(torch.uint8),
            last.stride(0), run.stride(0), need.stride(0), P=P, num_warps=1, **pdl.args(t.device),
        )  # fmt: skip
    return last_new, run_new, done_new
