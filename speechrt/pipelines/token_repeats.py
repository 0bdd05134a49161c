"""Loops in generated tokens: the span of tokens an output ends with, repeated several times in a row — the
test of the language model's `stop_repeats` and of Whisper's loop cut (whisper_loops.py)."""

from __future__ import annotations

MAX_PERIOD = 32  # longest repeated span (tokens) that repeating() looks for


def repeat_period(tokens: list[int], times: int) -> int:
    """The length of the span of 1 to MAX_PERIOD tokens that `tokens` end with, repeated `times` times in a
    row (a span of one token needs 4 * times: a run of one character can be text); 0 if there is none.
    Output caught in such a loop never ends by itself: small (quantized) models fall into them."""
    n = len(tokens)
    for period in range(1, min(MAX_PERIOD, n // times) + 1):
        reps = times * 4 if period == 1 else times
        if period * reps > n:
            continue
        tail = tokens[n - period :]
        if period > 1 and len(set(tail)) == 1:  # a run of one token: the period-1 rule decides
            continue
        if all(tokens[n - (k + 1) * period : n - k * period] == tail for k in range(1, reps)):
            return period
    return 0


def repeating(tokens: list[int], times: int) -> bool:
    return repeat_period(tokens, times) > 0
