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

from dataclasses import replace

import torch

from speechrt.kernels.reference_repeats import repeat_advance

from .cuda_graphs import CapturedStep
from .sampling import BIG, SCALARS, SamplingRows, pick
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


# a block's int64 inputs, one row of the staging buffers each (a column per slot), then the stop ids and the
# repetition stop's last output tokens: fed token, position, stepped?, budget, the repetition stop's count, then
# the int64 sampling options (backends.sampling.SCALARS); the float32 ones in a second buffer
INTS = ("tok", "pos", "live", "left", "times", "greedy", "top_k", "seed", "counter")
FLOATS = ("temperature", "top_p", "repetition", "frequency", "presence")
AT = {name: j for j, name in enumerate(INTS)} | {name: j for j, name in enumerate(FLOATS)}  # each one's row
# (place in a row's host values (SamplingRows.host), row of the staging buffer): the int64 options, the float32 ones
INT_OPTIONS = [(j, AT[name]) for j, name in enumerate(SCALARS) if name in INTS]
FLOAT_OPTIONS = [(j, AT[name]) for j, name in enumerate(SCALARS) if name in FLOATS]


class DecodeLoop:
    """K decode steps of `decode_range` (the model's, or the fused kernels') over slots 0..n-1 of `cache`,
    sampling with the options `features` names (SamplingRows.features), up to `width` stop ids per row and
    the repetition stop over `window` output tokens per row (repeat_width; 0: none), its step `advance`
    (kernels.reference_repeats.repeat_advance or its Triton kernel); captured as one graph unless `capture` is
    False (the CPU: the same ops run every call). A call stages every per-row value on the host and sends them
    in two transfers (pinned memory on a GPU); the graph reads them from there."""

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
        self.features, self.width = features, width
        pin = dev.type == "cuda"
        rows_i = len(INTS) + width + window
        self.host_i = torch.empty((rows_i, n), dtype=torch.long, pin_memory=pin)
        self.host_f = torch.empty((len(FLOATS), n), dtype=torch.float32, pin_memory=pin)
        # what every slot holds before the stepped ones are written: not stepped (token 0, no budget), greedy
        # and neutral options, no stop id (-1), no recent token (-1)
        self.blank_i = torch.zeros((rows_i, n), dtype=torch.long)
        self.blank_i[AT["greedy"]] = 1
        self.blank_i[len(INTS) :] = -1
        self.blank_f = torch.tensor([[NEUTRAL[f]] * n for f in FLOATS], dtype=torch.float32)
        self.ints = torch.zeros((rows_i, n), dtype=torch.long, device=dev)
        self.floats = torch.zeros((len(FLOATS), n), dtype=torch.float32, device=dev)
        _, bias, seen, counts, _ = features
        self.big = {
            "bias": torch.zeros(n, vocab, device=dev) if bias else None,
            "seen": torch.zeros(n, vocab, dtype=torch.bool, device=dev) if seen else None,
            "counts": torch.zeros(n, vocab, device=dev) if counts else None,
        }
        self.step = CapturedStep(self._run, capture)

    def _inputs(self):
        """The block's inputs, read from the staged buffers (inside the graph): the fed tokens, positions, which
        rows step, their budgets, their stop ids [n, width], the sampling rows, the repetition stop's counts and
        last output tokens [n, window]."""
        i, f = self.ints, self.floats
        col = {name: i[j] for j, name in enumerate(INTS)} | {name: f[j] for j, name in enumerate(FLOATS)}
        one = {name: col[name] for name in SCALARS}
        rows = SamplingRows(**{**one, "greedy": col["greedy"] != 0}, **self.big, features=self.features)
        stops = i[len(INTS) : len(INTS) + self.width].T
        recent = i[len(INTS) + self.width :].T.contiguous()
        return col["tok"], col["pos"], col["live"] != 0, col["left"], stops, rows, col["times"], recent

    def _run(self) -> torch.Tensor:
        """-> [n, K + 1] int64: each row's K tokens (a row's entries after it is done repeat its last one;
        rows not stepped: their input token), then how many steps it fed."""
        tok, pos, live, left, stops, rows, times, recent = self._inputs()
        counter, seen, counts = rows.counter, rows.seen, rows.counts
        ran = torch.zeros_like(pos)
        ids = []
        if self.window:  # each row's runs of its output so far (backends/token_repeats.py)
            need, run, last = repeat_needs(times), repeat_runs(recent), recent[:, :MAX_PERIOD]
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
            done = (t[:, None] == stops).any(dim=-1) | (left <= 0)
            if self.window:  # (a row not live carries on its own token: what it finds no longer matters)
                last, run, done = self.advance(last, run, need, t, done)
            tok = t  # a row done now keeps its last token: its later entries repeat it
            live = live & ~done
        return torch.cat([torch.stack(ids, dim=1), ran[:, None]], dim=1)

    def __call__(
        self, slots: list[int], tokens, lengths: list[int], rows: SamplingRows, left, stops, repeats=None
    ) -> tuple[list[list[int]], list[int]]:
        """Run the block for `slots` fed `tokens` [N] (host values: a list or a CPU tensor), every row's length
        `lengths` [n], the stepped rows' sampling options `rows` (N rows, built by SamplingRows.one / stack: their
        host values are what is staged), budgets `left` [N], stop ids `stops` (N tuples) and repetition stops
        `repeats` (N pairs (stop_repeats, output tokens so far), or None: none) -> (each stepped row's K tokens,
        how many of them it fed: the first that many are its output)."""
        if rows.host is None:
            raise ValueError("DecodeLoop: the sampling rows need their host values (build them with SamplingRows.one)")
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        hi, hf = self.host_i.numpy(), self.host_f.numpy()
        hi[:], hf[:] = self.blank_i.numpy(), self.blank_f.numpy()
        hi[AT["pos"]] = lengths
        for s, tok, budget, ids, values in zip(slots, tokens, left, stops, rows.host):
            hi[AT["tok"], s], hi[AT["live"], s], hi[AT["left"], s] = tok, 1, budget
            hi[len(INTS) : len(INTS) + len(ids), s] = sorted(ids)
            for j, r in INT_OPTIONS:
                hi[r, s] = values[j]
            for j, r in FLOAT_OPTIONS:
                hf[r, s] = values[j]
        if self.window:
            self._stage_repeats(hi, slots, repeats or [(0, [])] * len(slots))
        self.ints.copy_(self.host_i, non_blocking=True)
        self.floats.copy_(self.host_f, non_blocking=True)
        big = [f for f in BIG if self.big[f] is not None]
        if big:  # (the rows' own [N, vocab] options, where the block uses them)
            idx = torch.tensor(slots, device=self.ints.device)
            for f in big:
                self.big[f].fill_(NEUTRAL.get(f, 0))
                if getattr(rows, f) is not None:
                    self.big[f].index_copy_(0, idx, getattr(rows, f).to(self.big[f].dtype))
        out = self.step().tolist()  # the one wait on the device per block
        return [out[s][: self.k] for s in slots], [out[s][self.k] for s in slots]

    def _stage_repeats(self, hi, slots: list[int], repeats) -> None:
        """Each stepped row's stop_repeats (0 where its window is past the block's) and last output tokens, into
        the staged int64 rows."""
        outputs = [[] for _ in range(hi.shape[1])]
        for s, (t, out) in zip(slots, repeats):
            if 0 < t and repeat_window(t) <= self.window:
                outputs[s], hi[AT["times"], s] = out, t
        hi[len(INTS) + self.width :] = repeat_recent(outputs, self.window).numpy().T
