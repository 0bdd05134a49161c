"""Several decode steps in one call that stay on the device: each sampled token fed back in, the stop
conditions a per-row mask, one CUDA graph replay (and one read by the host) for all of them.

A block of K steps runs over slots 0..n-1 of the cache on static buffers, as the one-step graph does
(backends/triton/lm.py): the rows stepped feed their token at their position, sample the next one
(backends/sampling.py: greedy, temperature / top-k / top-p, logit bias, penalties, with a counter-based
noise per request) and write it to a [rows, K] buffer; a row whose token is one of its stop ids, whose
budget of tokens (`left`) is spent, or whose output now ends in a loop (the repetition stop, `stop_repeats`:
backends/token_repeats.py's rule as tensor ops over each row's last output tokens given at the block's
start, its step one launch with the Triton kernels, kernels/triton_repeats.py) is done: from the next step
on it feeds nothing (it writes at its length, past what it holds, as the rows not stepped do) and its
position, counter and step count stop. The `seen` and `counts` of the penalties are updated inside the
block on copies; the caller keeps its own. What needs the host per token stays out: stop strings are
checked by the caller as it delivers the block's tokens, which then rewinds the cache's length of a row it
ended early (the caller checks the repetition stop there too, and finds the rows the device ended by it
ended at the same token); grammars and logprobs run in the one-step path.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from speechrt.kernels.reference_repeats import repeat_advance

from .cuda_graphs import CapturedStep
from .sampling import SamplingRows, pick
from .token_repeats import MAX_PERIOD, repeat_needs, repeat_recent, repeat_runs, repeat_window

# values of the rows not stepped (and of the options no row uses): greedy, no bias, no penalty
NEUTRAL = dict(greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition=1.0, frequency=0.0, presence=0.0)


def stop_width(stops: list[tuple[int, ...]]) -> int:
    """The stop-id columns of a block's buffer: a power of two (at least 4) that holds every row's."""
    n = max((len(s) for s in stops), default=0)
    return max(4, 1 << max(0, n - 1).bit_length())


MAX_WINDOW = 1024  # output tokens a block reads back for the repetition stop (stop_repeats up to 32)


def repeat_width(times: list[int]) -> int:
    """The output tokens per row a block reads back for the rows' repetition stops (`times`: each row's
    stop_repeats, 0 = off): a power of two that holds every row's repeat_window; 0 where no row has the stop
    on (the block runs no repetition ops). A row whose window is past MAX_WINDOW gets no stop on the device
    (the caller's check at delivery ends it, as it does stop strings)."""
    need = [repeat_window(t) for t in times if 0 < t and repeat_window(t) <= MAX_WINDOW]
    return 1 << (max(need) - 1).bit_length() if need else 0


class DecodeLoop:
    """K decode steps of `decode_range` (the model's, or the fused kernels') over slots 0..n-1 of `cache`,
    sampling with the options `features` names (SamplingRows.features), up to `width` stop ids per row and
    the repetition stop over `window` output tokens per row (repeat_width; 0: none), its step `advance`
    (kernels.reference_repeats.repeat_advance or its Triton kernel); captured as one graph unless `capture` is
    False (the CPU: the same ops run every call)."""

    def __init__(
        self,
        decode_range,
        cache,
        n: int,
        k: int,
        features: tuple,
        vocab: int,
        width: int,
        capture: bool,
        window: int = 0,
        advance=repeat_advance,
    ):
        dev = cache.k.device
        self.decode_range, self.cache, self.k, self.window, self.advance = decode_range, cache, k, window, advance
        self.recent = torch.full((n, window), -1, dtype=torch.long, device=dev)
        self.times = torch.zeros(n, dtype=torch.long, device=dev)
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
        if self.window:  # each row's runs of its output so far (backends/token_repeats.py)
            need, run, last = repeat_needs(self.times), repeat_runs(self.recent), self.recent[:, :MAX_PERIOD]
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
            if self.window:  # (a row not live carries on its own token: what it finds no longer matters)
                last, run, done = self.advance(last, run, need, t, done)
            tok = t  # a row done now keeps its last token: its later entries repeat it
            live = live & ~done
        return torch.cat([torch.stack(ids, dim=1), ran[:, None]], dim=1)

    def __call__(
        self, slots: list[int], tokens: torch.Tensor, lengths: list[int], rows: SamplingRows, left, stops, repeats=None
    ) -> tuple[list[list[int]], list[int]]:
        """Run the block for `slots` fed `tokens` [N] (device), every row's length `lengths` [n], the stepped
        rows' sampling options `rows` (N rows), budgets `left` [N], stop ids `stops` (N tuples) and repetition
        stops `repeats` (N pairs (stop_repeats, output tokens so far), or None: none) -> (each stepped row's K
        tokens, how many of them it fed: the first that many are its output)."""
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
        if self.window:
            self._seed_repeats(slots, repeats or [(0, [])] * len(slots))
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

    def _seed_repeats(self, slots: list[int], repeats) -> None:
        """Each stepped row's stop_repeats (0 where its window is past the block's) and last output tokens."""
        outputs, times = [[] for _ in range(self.times.shape[0])], torch.zeros(self.times.shape, dtype=torch.long)
        for s, (t, out) in zip(slots, repeats):
            if 0 < t and repeat_window(t) <= self.window:
                outputs[s], times[s] = out, t
        self.recent.copy_(repeat_recent(outputs, self.window), non_blocking=True)
        self.times.copy_(times, non_blocking=True)
