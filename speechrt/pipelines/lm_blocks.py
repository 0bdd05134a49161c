"""Blocks of several decode steps on the device for the continuous batcher (lm_batching.py): when one applies,
the runner call, and the delivery of each row's tokens in the order the one-step path delivers them."""

from __future__ import annotations

import torch

from speechrt.backends.sampling import SamplingRows


def check_block(block) -> int:
    """`block` (decode steps per call) if it is an integer >= 1, else a ValueError saying so."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1 (decode steps per call), got {block!r}")
    return block


def budget(batcher, r) -> int:
    """Tokens request `r` may still sample: its max_tokens, and the positions left in its slot."""
    return min(r.options.max_tokens, batcher.max_seq - len(r.ids) + 1) - r.count


def decode_block(batcher, rows: list[int], reqs: list) -> bool:
    """Up to `batcher.block` decode steps of the running requests `reqs` (in `rows`) in one runner call
    (`decode_loop`; a power of two no more than any request's remaining budget) -> False where none applies,
    and the caller steps once: the runner has no loop, or a request needs the host per token (a grammar's
    mask, logprobs). The device ends a row at a stop id, its budget or the repetition stop (stop_repeats, on
    each row's output so far: backends/token_repeats.py); each row's tokens are delivered in order as the
    one-step path delivers them, whose checks stay the authority: a row the host ends before the device did (a
    stop string, a cancel, the repetition stop of a stop_repeats past decode_loop.MAX_WINDOW) has its cache
    length put back to the tokens it fed."""
    loop = getattr(batcher.runner, "decode_loop", None)
    if (
        loop is None
        or batcher.block < 2
        or any(r.constraint is not None or r.options.logprobs is not None for r in reqs)
    ):
        return False
    budgets = [budget(batcher, r) for r in reqs]
    k = min(batcher.block, *budgets)
    if k < 2:
        return False
    k = 1 << (k.bit_length() - 1)  # a power of two: a few captured blocks serve every budget
    sampling = SamplingRows.stack([r.sampler.row(r.seen) for r in reqs], [r.sampler.drawn for r in reqs], False)
    tokens = torch.tensor([r.last for r in reqs], dtype=torch.long)
    repeats = [(r.options.stop_repeats, r.out) for r in reqs] if any(r.options.stop_repeats for r in reqs) else None
    res = loop(batcher.cache, rows, tokens, sampling, k, budgets, [tuple(r.stop_ids) for r in reqs], repeats)
    if res is None:
        return False
    lengths = batcher.cache.lengths
    for slot, r, ids, ran in zip(rows, reqs, *res):
        start = lengths[slot] - ran
        for j in range(ran):
            if r.cancelled:  # while its tokens were delivered (by an emit): the next admit() finishes it
                break
            r.fed.append(r.last)
            lengths[slot] = start + j + 1  # what the tokens delivered so far fed (before _finish frees the slot)
            r.sampler.drawn += 1
            batcher.deliver(r, ids[j])
            if r.slot < 0:  # finished
                break
    return True
