"""The repetition stop's step in one Triton launch (kernels/triton_repeats.py) against its torch reference
(kernels.reference_repeats), exactly: random states (runs at, below and past their needs, one-token runs, rows done
or not, rows with the stop off), the last tokens a strided view of a wider buffer (as a block reads them); and the
rule it completes equals the host's on crafted outputs (tests/repeat_rule.py)."""

from __future__ import annotations

import os
import random

import pytest
import torch
from repeat_rule import check  # tests/repeat_rule.py

from speechrt.backends.token_repeats import MAX_PERIOD, NEVER, repeat_needs
from speechrt.kernels.reference_repeats import repeat_advance as reference

pytestmark = pytest.mark.usefixtures("interpret")
DEVICE = os.environ.get("SPEECHRT_TEST_DEVICE", "cpu")


def test_step_kernel_equals_the_reference():
    from speechrt.kernels.triton_repeats import repeat_advance

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))  # fresh inputs every run
    n = 24
    wide = torch.randint(0, 3, (n, 128), generator=g)
    wide[:4, 10:] = -torch.arange(11, 129)  # short outputs: negative past their start
    last = wide[:, :MAX_PERIOD]
    times = torch.randint(2, 6, (n,), generator=g)
    times[-3:] = 0  # the stop off
    need = repeat_needs(times)
    run = (need * torch.rand(n, MAX_PERIOD, generator=g) * 1.3).long().clamp(max=200)  # below, at and past the need
    run[5, 0] = 40  # a long run of one token
    t = torch.randint(0, 3, (n,), generator=g)
    done = torch.rand(n, generator=g) < 0.2
    done[6:8] = False  # whatever the draw: row 6 ends in a loop now (its one-token run reaches its need), row 7
    t[6], run[6, 0], t[7] = last[6, 0], need[6, 0] - 1, 3  # does not (a token its output never had)
    want = reference(last, run, need, t, done)
    dev = torch.device(DEVICE)
    got = repeat_advance(last.to(dev), run.to(dev), need.to(dev), t.to(dev), done.to(dev))
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b)
    assert want[2].any() and not want[2].all() and (want[2] & ~done).any()  # loops found, and not everywhere
    assert (need == NEVER).any() and repeat_advance(last[:0], run[:0], need[:0], t[:0], done[:0])[2].shape == (0,)


def test_step_kernel_keeps_the_rule():
    """Outputs crafted at the edges (every rule's case: one-token runs, a span of one token repeated, runs inside a
    span, enough and one short copies) stepped through the kernel end where the host's repeat_period ends them."""
    from speechrt.kernels.triton_repeats import repeat_advance

    dev = torch.device(DEVICE)

    def on_device(*a):
        return [x.cpu() for x in repeat_advance(*(x.to(dev) for x in a))]

    rng = random.Random(3)
    seqs = [[8] * 9, [1] + [5, 5] * 5, [4] + [3, 3, 6] * 3, [2] + [7, 8, 9] * 2 + [7, 8], [1] + list(range(10, 42)) * 2]
    seqs += [[rng.randrange(2) for _ in range(24)] for _ in range(3)]
    assert check(seqs, [2] * len(seqs), [0, 3, 1, 0, 30, 5, 0, 9], on_device) >= 5
