"""The repetition stop's rule on the device (backends/token_repeats.py, a step kernels.reference_repeats's or its
Triton kernel) stepped through whole outputs, against the host's repeat_period on every prefix: shared by
tests/backends/test_token_repeats.py and tests/kernels/test_repeats.py."""

from __future__ import annotations

import torch

from speechrt.backends.decode_loop import repeat_width
from speechrt.backends.token_repeats import MAX_PERIOD, repeat_needs, repeat_recent, repeat_runs, repeating
from speechrt.kernels.reference_repeats import repeat_advance


def device_flags(
    seqs: list[list[int]], times: list[int], seeded: list[int], advance=repeat_advance
) -> list[list[bool]]:
    """For each row, the device rule's answer after each of its tokens from `seeded[r]` on (the runs counted
    from its first seeded[r] tokens as a block's start does, then one step per token): [r][j] for the prefix
    seq[: seeded[r] + j + 1]."""
    recent = repeat_recent([s[:m] for s, m in zip(seqs, seeded)], repeat_width(times) or MAX_PERIOD)
    t_on = torch.tensor([t if repeat_width([t]) else 0 for t in times])
    need, run, last = repeat_needs(t_on), repeat_runs(recent), recent[:, :MAX_PERIOD]
    none, flags = torch.zeros(len(seqs), dtype=torch.bool), [[] for _ in seqs]
    for j in range(max(len(s) - m for s, m in zip(seqs, seeded))):
        # rows past their end carry on their last token (as a row done in a block does)
        t = torch.tensor([s[min(m + j, len(s) - 1)] for s, m in zip(seqs, seeded)])
        last, run, found = advance(last, run, need, t, none)
        for r, v in enumerate(found.tolist()):
            if seeded[r] + j < len(seqs[r]):
                flags[r].append(v)
    return flags


def check(seqs, times, seeded, advance=repeat_advance):
    flags = device_flags(seqs, times, seeded, advance)
    for s, t, m, f in zip(seqs, times, seeded, flags):
        want = [bool(t) and repeating(s[:i], t) for i in range(m + 1, len(s) + 1)]
        assert f == want, (s, t, m, [i + m + 1 for i, (a, b) in enumerate(zip(f, want)) if a != b])
    return sum(map(sum, flags))
