"""Several decode steps in one call that stay on the device: each sampled token fed back in, the stop
conditions a per-row mask, one CUDA graph replay (and one read by the host) for all of them.

A block of K steps runs over slots 0..n-1 of the cache on static buffers, as the one-step graph does
(backends/triton/lm.py): the rows stepped feed their token at their position, sample the next one
(backends/sampling.py: greedy, temperature / top-k / top-p, logit bias, penalties, with a counter-based
noise per request) and write it to a [rows, K] buffer; a row whose token is one of its stop ids, or whose
budget of tokens (`left`) is spent, is done: from the next step on it feeds nothing (it writes at its length,
past what it holds, as the rows not stepped do) and its position, counter and step count stop. The
`seen` and `counts` of the penalties are updated inside the block on copies; the caller keeps its own.
What needs the host per token stays out: stop strings and the repetition stop (`token_repeats`) are
checked by the caller as it delivers the block's tokens, which then rewinds the cache's length of a row it
ended early; grammars and logprobs run in the one-step path.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from .cuda_graphs import CapturedStep
from .sampling import SamplingRows, pick

# values of the rows not stepped (and of the options no row uses): greedy, no bias, no penalty
NEUTRAL = dict(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition=1.0, frequency=0.0, presence=0.0)


def stop_width(stops: list[tuple[int, ...]]) -> int:
    """The stop-id columns of a block's buffer: a power of two (at least 4) that holds every row's."""
    n = max((len(s) for s in stops), default=0)
    return max(4, 1 << max(0, n - 1).bit_length())


class DecodeLoop:
    """K decode steps of `decode_range` (the model's, or the fused kernels') over slots 0..n-1 of `cache`,
    sampling with the options `features` names (SamplingRows.features) and up to `width` stop ids per row;
    captured as one graph unless `capture` is False (the CPU: the same ops run every call)."""

    def __init__(self, decode_range, cache, n: int, k: int, features: tuple, vocab: int, width: int, capture: bool):
        dev = cache.k.device
        self.decode_range, self.cache, self.k = decode_range, cache, k
        self.tok = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.zeros(n, dtype=torch.long, device=dev)
        self.live = torch.zeros(n, dtype=torch.bool, device=dev)
        self.left = torch.zeros(n, dtype=torch.long, device=dev)
        self.stops = torch.full((n, width), -1, dtype=torch.long, device=dev)
        _, bias, seen, counts, _ = features
        self.rows = SamplingRows(
            greedy=torch.ones(n, dtype=torch.bool, device=dev),
            temperature=torch.ones(n, device=dev),
            top_k=torch.zeros(n, dtype=torch.long, device=dev),
            top_p=torch.ones(n, device=dev),
            repetition=torch.ones(n, device=dev),
            frequency=torch.zeros(n, device=dev),
            presence=torch.zeros(n, device=dev),
            seed=torch.zeros(n, dtype=torch.long, device=dev),
            counter=torch.zeros(n, dtype=torch.long, device=dev),
            bias=torch.zeros(n, vocab, device=dev) if bias else None,
            seen=torch.zeros(n, vocab, dtype=torch.bool, device=dev) if seen else None,
            counts=torch.zeros(n, vocab, device=dev) if counts else None,
            features=features,
        )
        self.step = CapturedStep(self._run, capture)

    def _run(self) -> torch.Tensor:
        """-> [n, K + 1] int64: each row's K tokens (a row's entries after it is done repeat its last one;
        rows not stepped: their input token), then how many steps it fed."""
        tok, pos, live, left, rows = self.tok, self.pos, self.live, self.left, self.rows
        counter, seen, counts = rows.counter, rows.seen, rows.counts
        ran = torch.zeros_like(pos)
        ids = []
        for _ in range(self.k):
            logits = self.decode_range(self.cache, 0, tok, pos, self.cache.max_seq)
            t = pick(logits, replace(rows, seen=seen, counts=counts), counter)
            t = torch.where(live, t, tok)
            ids.append(t)
            fed = live.long()
            if seen is not None:
                seen = seen | torch.zeros_like(seen).scatter(1, t[:, None], live[:, None])
            if counts is not None:
                counts = counts.scatter_add(1, t[:, None], live[:, None].float())
            pos, counter, ran, left = pos + fed, counter + fed, ran + fed, left - fed
            done = (t[:, None] == self.stops).any(dim=-1) | (left <= 0)
            tok = t  # a row done now keeps its last token: its later entries repeat it
            live = live & ~done
        return torch.cat([torch.stack(ids, dim=1), ran[:, None]], dim=1)

    def __call__(
        self, slots: list[int], tokens: torch.Tensor, lengths: list[int], rows: SamplingRows, left, stops
    ) -> tuple[list[list[int]], list[int]]:
        """Run the block for `slots` fed `tokens` [N] (device), every row's length `lengths` [n], the stepped
        rows' sampling options `rows` (N rows), budgets `left` [N] and stop ids `stops` (N tuples) ->
        (each stepped row's K tokens, how many of them it fed: the first that many are its output)."""
        dev = self.tok.device
        idx = torch.tensor(slots, device=dev)
        self.tok.zero_().index_copy_(0, idx, tokens)
        self.pos.copy_(torch.tensor(lengths), non_blocking=True)
        self.live.zero_().index_fill_(0, idx, True)
        host_left = torch.zeros(self.left.shape, dtype=torch.long)
        host_left[slots] = torch.tensor(left)
        self.left.copy_(host_left, non_blocking=True)
        host_stops = torch.full(self.stops.shape, -1, dtype=torch.long)
        for s, ids in zip(slots, stops):
            host_stops[s, : len(ids)] = torch.tensor(sorted(ids), dtype=torch.long)
        self.stops.copy_(host_stops, non_blocking=True)
        for f in fields(SamplingRows):
            buf = getattr(self.rows, f.name)
            if f.name == "features" or buf is None:
                continue
            buf.fill_(NEUTRAL.get(f.name, 0))
            src = getattr(rows, f.name)
            if src is not None:
                buf.index_copy_(0, idx, src.to(buf.dtype))
        out = self.step().index_select(0, idx).tolist()  # the one wait on the device per block
        return [r[: self.k] for r in out], [r[self.k] for r in out]
