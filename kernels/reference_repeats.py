"""The torch reference of the repetition stop's step in a decode block on the device (kernels/triton_repeats.py):
one new token per row against the run each span length has (the rule: backends/token_repeats.py)."""

from __future__ import annotations

import torch


def repeat_advance(last, run, need, t, done) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One new token per row. last [rows, P] int64: the output's last P tokens, newest first (negative past its
    start); run [rows, P] int64: for the span length p + 1 of column p, how many of the output's last tokens equal
    the token p + 1 before them; need [rows, P]: the run that makes a loop; t [rows] int64: the new tokens; done
    [rows] bool -> (last, run, done) after t, done also where the output now ends in a loop: a span length whose run
    reaches its need, unless (p > 0) its last span is one token repeated (run[:, 0] >= p: the one-token rule's)."""
    run = torch.where(last == t[:, None], run + 1, 0)
    last = torch.cat([t[:, None], last[:, :-1]], dim=1)
    p = torch.arange(run.shape[1], device=run.device)
    kept = (p == 0) | (run[:, :1] < p)
    return last, run, done | ((run >= need) & kept).any(dim=-1)
