"""The repetition stop's rule (backends/token_repeats.py): on the host (repeat_period) and as the tensor ops a
decode block runs on the device (seeded from a row's recent output, then one step per token), which must find a
loop at exactly the tokens the host does, for every prefix of crafted and random outputs and mixed `times`."""

from __future__ import annotations

import random

from repeat_rule import check, device_flags  # tests/repeat_rule.py

from speechrt.backends.decode_loop import MAX_WINDOW, repeat_width
from speechrt.backends.token_repeats import MAX_PERIOD, repeat_period, repeating


def test_the_host_rule_on_crafted_outputs():
    """Absolute answers (the device is checked against these): a one-token span needs 4 * times copies, a longer
    one `times`, one token short of that is no loop, and a span of one token repeated is left to the former."""
    for times in (2, 3, 4):
        assert repeat_period([7] * (4 * times), times) == 1 and repeat_period([7] * (4 * times - 1), times) == 0
        for p in (2, 5, MAX_PERIOD):
            span = list(range(10, 10 + p))
            assert repeat_period([1] + span * times, times) == p
            assert repeat_period((span * times)[1:], times) == 0
        assert repeat_period([5, 5] * (2 * times - 1), times) == 0  # a run of 4 * times - 2: not for p = 2
        assert repeat_period([3, 3, 3, 9] * times, times) == 4  # a run inside the span
        assert repeat_period(list(range(MAX_PERIOD + 1)) * times, times) == 0  # longer than any span looked for


def test_the_device_rule_is_the_host_rule_on_crafted_outputs():
    """Every span length 1..32 at the edge of enough copies (each prefix of the copies, behind random lead-ins and
    seeded from anywhere in it), runs of one token, spans of one token repeated, runs inside longer spans, with
    times 2..5 in one batch beside rows without the stop."""
    rng = random.Random(5)
    seqs, times = [], []
    for p in range(1, MAX_PERIOD + 1):
        for t in (2, 3, 4, 5):
            span = [rng.randrange(50, 60) for _ in range(p)]
            if p > 1 and len(set(span)) == 1:
                span[0] += 1
            lead = [rng.randrange(0, 9) for _ in range(rng.randrange(0, 6))]
            seqs.append(lead + span * (4 * t if p == 1 else t + 1))
            times.append(t)
    for t in (2, 3, 4):
        for p in (2, 3, 7, 16):
            seqs.append([1, 2] + [8] * p * (t + 2))  # one token: only the p = 1 rule may end it
            seqs.append([4] + ([3] * (p - 1) + [6]) * (t + 1))  # a run inside the span
            seqs.append([4] + ([3] * (p - 1) + [6, 6]) * (t + 1))
            times += [t, t, t]
    seqs += [[1] * 40, [2, 3] * 20]  # rows without the stop
    times += [0, 0]
    seeded = [rng.randrange(0, len(s)) for s in seqs]
    seeded[:8] = [0] * 8  # from an empty output
    assert check(seqs, times, seeded) > 200  # loops found (rows go on past them: every prefix is checked)


def test_the_device_rule_is_the_host_rule_on_random_outputs():
    """Random outputs over 2 to 4 tokens (loops of every length come and go), up to 400 tokens (past the window
    read at a block's start), seeded at random points, with times 2..6 mixed in one batch."""
    rng = random.Random(11)
    seqs, times = [], []
    for i in range(48):
        k = 2 + i % 3
        seqs.append([rng.randrange(k) for _ in range(rng.randrange(20, 400))])
        times.append(2 + i % 5)
    seeded = [rng.randrange(0, len(s)) for s in seqs]
    assert check(seqs, times, seeded) > 100
    # periodic outputs with a few random changes: long runs that break
    seqs = []
    for _ in range(24):
        p = rng.randrange(1, MAX_PERIOD + 1)
        span = [rng.randrange(100) for _ in range(p)]
        s = (span * (400 // p + 1))[: rng.randrange(60, 400)]
        for _ in range(3):
            s[rng.randrange(len(s))] = rng.randrange(100)
        seqs.append(s)
    check(seqs, [2 + i % 3 for i in range(24)], [rng.randrange(0, len(s)) for s in seqs])


def test_the_window_a_block_reads():
    """A power of two that holds the longest loop of the largest `times` (32 * times); none without the stop;
    a `times` whose window is past MAX_WINDOW gets no device stop (the host's check at delivery ends it)."""
    assert repeat_width([0, 0]) == 0 and repeat_width([4]) == 128 and repeat_width([2, 5, 0]) == 256
    assert repeat_width([MAX_WINDOW // MAX_PERIOD]) == MAX_WINDOW and repeat_width([MAX_WINDOW // MAX_PERIOD + 1]) == 0
    big = MAX_WINDOW // MAX_PERIOD + 1
    assert repeating([1] * 400, big) and not any(device_flags([[1] * 400, [2] * 400], [big, 2], [0, 0])[0])
