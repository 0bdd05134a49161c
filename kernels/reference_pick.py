"""The torch reference of Whisper's greedy pick on the device (kernels/triton_whisper_pick.py): the logit rules after
a window's first token, then the argmax and its log-probability.

The rules (speechrt.pipelines.whisper_decoding.LogitRules, first token aside): suppressed tokens; with timestamps, a
closed timestamp pair is followed by text, an open one by a timestamp or end of text, timestamps never decrease (a
new pair starts strictly later), and text is ruled out where the timestamps are jointly more likely than any text
token. A row's sequence enters as four numbers: its last and second-to-last token, last timestamp (-1: none) and
length."""

from __future__ import annotations

import torch


def whisper_rules(logits, suppress, state, timestamps: bool, tb: int, eot: int) -> torch.Tensor:
    """logits [n, V] float32, `suppress` [V] bool, `state` [4, n] int64 (last, penult, last_ts, count) -> the logits
    with every entry the rules rule out at -inf."""
    last, penult, last_ts, count = state
    x = logits.masked_fill(suppress, float("-inf"))
    if not timestamps:
        return x
    col = torch.arange(x.shape[-1], device=x.device)
    is_ts = col >= tb
    last_is_ts = (count >= 1) & (last >= tb)
    penult_is_ts = (count < 2) | (penult >= tb)
    open_pair = last_is_ts & ~penult_is_ts
    upto = torch.where(open_pair, last_ts, last_ts + 1)  # timestamps before the last (and, after a pair, it too)
    mask = ((last_is_ts & penult_is_ts)[:, None] & is_ts) | (open_pair[:, None] & (col < eot))
    mask |= ((last_ts >= 0)[:, None] & is_ts) & (col < upto[:, None])
    x = x.masked_fill(mask, float("-inf"))
    lp = torch.log_softmax(x, dim=-1)
    force = torch.logsumexp(lp[:, tb:], dim=-1) > lp[:, :tb].max(dim=-1).values
    return x.masked_fill(force[:, None] & ~is_ts, float("-inf"))


def whisper_pick(logits, suppress, state, timestamps: bool, tb: int, eot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy picks under whisper_rules -> (ids [n] int64, their log-probabilities [n] float32)."""
    x = whisper_rules(logits, suppress, state, timestamps, tb, eot)
    ids = x.argmax(dim=-1)
    return ids, torch.log_softmax(x, dim=-1).gather(1, ids[:, None])[:, 0]
