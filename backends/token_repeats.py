"""Loops in generated tokens: the span of tokens an output ends with, repeated several times in a row — the
test of the language model's `stop_repeats` (on the host at delivery, and as tensor ops inside a decode block
on the device: backends/decode_loop.py) and of Whisper's loop cut (speechrt/pipelines/whisper_loops.py).

The rule: an output of n tokens repeats when, for some span length p in 1..MAX_PERIOD, its last p * reps
tokens are one span of p repeated reps times, where reps = `times`, or ONE_TOKEN * `times` for p = 1 (a run
of one character can be text); a span of p > 1 made of one token repeated is left to the p = 1 rule.

On the device the same rule is kept per row as run lengths: run[p] counts the output's last tokens that equal
the token p before them (within the output). The last p * reps tokens are p repeated reps times exactly when
run[p] >= (reps - 1) * p (so the n >= p * reps the host checks is implied), and the last p tokens are one token
when run[1] >= p - 1. A new token t extends run[p] when it equals the token p back, else resets it to 0: a
step compares t with the last MAX_PERIOD tokens, whatever the period (kernels.reference_repeats.repeat_advance;
one launch on a GPU, kernels/triton_repeats.py). The runs at a block's start are counted once from each row's
last `repeat_window(times)` output tokens (repeat_runs).
"""

from __future__ import annotations

import array
import functools

import torch

MAX_PERIOD = 32  # longest repeated span (tokens) that repeating() looks for
ONE_TOKEN = 4  # a span of one token must repeat this many times `times`
NEVER = 1 << 40  # a run no output reaches: the need of rows with the stop off


def reps(period: int, times: int) -> int:
    """How many copies of a span of `period` tokens in a row make a loop."""
    return times * ONE_TOKEN if period == 1 else times


def repeat_period(tokens: list[int], times: int) -> int:
    """The length of the span of 1 to MAX_PERIOD tokens that `tokens` end with, repeated `times` times in a
    row (a span of one token needs ONE_TOKEN * times: a run of one character can be text); 0 if there is none.
    Output caught in such a loop never ends by itself: small (quantized) models fall into them."""
    n = len(tokens)
    for period in range(1, min(MAX_PERIOD, n // times) + 1):
        r = reps(period, times)
        if period * r > n:
            continue
        tail = tokens[n - period :]
        if period > 1 and len(set(tail)) == 1:  # a run of one token: the period-1 rule decides
            continue
        if all(tokens[n - (k + 1) * period : n - k * period] == tail for k in range(1, r)):
            return period
    return 0


def repeating(tokens: list[int], times: int) -> bool:
    return repeat_period(tokens, times) > 0


# -- the same rule as tensor ops (no host sync, static shapes: a CUDA graph captures them) ---------------------


@functools.cache  # (asked per row per block)
def repeat_window(times: int) -> int:
    """Output tokens the device rule reads back at a block's start for `times`: the longest loop it can find,
    reps(p) * p over p (at least MAX_PERIOD, the tokens a step compares with)."""
    return max(MAX_PERIOD, *(reps(p, times) * p for p in range(1, MAX_PERIOD + 1)))


def repeat_needs(times: torch.Tensor) -> torch.Tensor:
    """Each row's `times` [rows] int64 (0: the stop is off) -> the run each span length needs [rows, MAX_PERIOD]:
    (reps - 1) * p, NEVER for rows with the stop off."""
    p = torch.arange(1, MAX_PERIOD + 1, device=times.device)
    r = torch.where(p == 1, times[:, None] * ONE_TOKEN, times[:, None])
    return torch.where(times[:, None] > 0, (r - 1) * p, NEVER)


def repeat_recent(outputs: list[list[int]], w: int) -> torch.Tensor:
    """Outputs -> [rows, w] int64 (host): each one's last w tokens newest first, then distinct negative values
    (-1 - position: no token, and no other position, equals them)."""
    if not (outputs and w):
        return torch.empty((len(outputs), w), dtype=torch.long)
    pads, flat = list(range(-1, -w - 1, -1)), array.array("q")
    for out in outputs:  # (an array of int64, not a nested list: torch.tensor of lists is ~10x slower)
        tail = out[: -w - 1 : -1]
        flat.extend(tail)
        flat.extend(pads[len(tail) :])
    return torch.frombuffer(flat, dtype=torch.long).reshape(len(outputs), w)


def repeat_runs(recent: torch.Tensor) -> torch.Tensor:
    """Rows of recent output tokens (repeat_recent) [rows, W] -> run[p] for p in 1..MAX_PERIOD [rows, MAX_PERIOD]
    int64 (true up to W - p: enough when W >= repeat_window(times))."""
    rows, w = recent.shape
    pad = recent.new_full((rows, MAX_PERIOD), -1 - w) - torch.arange(MAX_PERIOD, device=recent.device)
    earlier = torch.cat([recent, pad], dim=1).unfold(1, w, 1)[:, 1:]  # [rows, P, W]: the token p before each
    # the first mismatch (max returns the first of equal maxima): one there is, at W - p at the latest (the pad)
    return (earlier != recent[:, None, :]).max(dim=-1).indices
