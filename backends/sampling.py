"""Token sampling of a batch of rows as tensor ops that never wait on the host: what a captured decode loop
runs (backends/decode_loop.py), and what the language model pipeline's one-step Sampler runs too, so both
paths pick the same tokens.

Every row has its own options (temperature, top-k, top-p, logit bias, penalties) as tensors [rows] or
[rows, vocab]. Randomness: a per-request torch.Generator cannot live inside one graph that steps several
requests, so a token is drawn by the Gumbel-max trick, argmax(logits / T + G), G = -log(-log U), with U
uniform noise from a counter-based hash (murmur3's 32-bit finalizer, written in int64 torch ops) of the
request's seed, its token counter (how many tokens it has drawn) and the vocabulary index: the key of (seed,
counter) mixed, then one mix per token of key + index * the golden ratio's 32 bits. A request's
stream is thus a pure function of (seed, counter): the same whatever its batch neighbours, its slot, the
number of steps per replay or the device. U has 23 bits, so that its largest value, 1 - 2**-24, is a float32
below 1 (with 24 bits it rounded to 1.0: G was +inf, and that token won whatever its logit, a grammar's masked
ones included); G lies within about (-2.8, 16.6), plenty for sampling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's fmix32 on int64 values in [0, 2**32) (right shifts are logical: the values are positive). A
    product of two 32-bit values may pass 2**63: torch's int64 multiply wraps modulo 2**64 (two's complement, on the
    CPU and the GPU), which leaves the low 32 bits, all that is kept, exact."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64 in [0, 2**32)) -> float32 strictly inside (0, 1): their top 23 bits, centred."""
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def uniform(seed: torch.Tensor, counter: torch.Tensor, vocab: int) -> torch.Tensor:
    """Noise U [rows, vocab] float32 in (0, 1) of each row's seed [rows] int64 (>= 0) and counter [rows]."""
    key = mix32((seed & MASK32) ^ mix32((seed >> 32) & MASK32))
    key = mix32(key ^ (counter & MASK32))[:, None]
    v = torch.arange(vocab, device=seed.device, dtype=torch.int64)[None]
    return unit(mix32((v * GOLDEN + key) & MASK32))  # one mix per token (the vocabulary is the cost)


def new_seed(seed: int | None) -> int:
    """A request's seed as the noise takes it (>= 0, 63 bits); None -> a fresh random one."""
    return random.getrandbits(63) if seed is None else seed & ((1 << 63) - 1)


# the options of a row that are one value each, in SamplingRows' order, and their dtypes on the device
SCALARS = ("greedy", "temperature", "top_k", "top_p", "repetition", "frequency", "presence", "seed", "counter")
SCALAR_DTYPES = (torch.bool, torch.float32, torch.int64, *[torch.float32] * 4, torch.int64, torch.int64)
BIG = ("bias", "seen", "counts")  # the [rows, vocab] options (None where no row uses one)


@dataclass
class SamplingRows:
    """Each row's sampling options as tensors on the device. [rows]: greedy (bool), temperature (1 where
    greedy), top_k (0 = off), top_p (1 = off), repetition / frequency / presence penalty, seed, counter (tokens
    the request has drawn); [rows, vocab] or None where no row uses them: bias, seen (prompt and output tokens,
    for the repetition penalty), counts (output tokens, for the frequency and presence penalties). The [rows]
    ones are None only in rows stacked for a decode block (stack(scalars=False)), which stages their host values."""

    greedy: torch.Tensor | None
    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    repetition: torch.Tensor | None
    frequency: torch.Tensor | None
    presence: torch.Tensor | None
    seed: torch.Tensor | None
    counter: torch.Tensor | None
    bias: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    # what the ops must compute (a captured graph is kept per set), host flags: (any row samples, bias, seen,
    # counts, any row filters with top-k / top-p)
    features: tuple[bool, ...] = field(default=(True, True, True, True, True))
    # each row's SCALARS as host values, where the rows were built from them (one(), stack()): what a decode block
    # stages for the device in one transfer (backends/decode_loop.py); None where they were built otherwise
    host: list[tuple] | None = field(default=None, repr=False)

    @staticmethod
    def one(
        vocab: int,
        device: torch.device,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition: float = 1.0,
        frequency: float = 0.0,
        presence: float = 0.0,
        seed: int = 0,
        bias: torch.Tensor | None = None,
        seen: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
    ) -> SamplingRows:
        """One request's row (bias, counts: [vocab] tensors or None; seen: [vocab], or [N, vocab] for N rows
        of logits with these options)."""

        greedy = temperature == 0.0
        k = top_k if 0 < top_k < vocab else 0
        values = (greedy, 1.0 if greedy else temperature, k, top_p, repetition, frequency, presence, seed, 0)
        rows = SamplingRows(
            *(torch.tensor([x], dtype=dt, device=device) for x, dt in zip(values, SCALAR_DTYPES)),
            None if bias is None else bias[None],
            None if seen is None or seen.dim() == 2 else seen[None],
            None if counts is None else counts[None],
            (not greedy, bias is not None, seen is not None, counts is not None, 0 < top_k < vocab or top_p < 1.0),
            [values],
        )
        if seen is not None and seen.dim() == 2:
            rows.seen = seen
        return rows

    @staticmethod
    def stack(rows: list[SamplingRows], counters: list[int], scalars: bool = True) -> SamplingRows:
        """The rows of several requests (their `counter`s given, host ints), in that order. Rows with their host
        values (one()) give the one-value options in one transfer per dtype, the others by concatenation; with
        `scalars` False, rows with host values give them as host values only (the [rows] tensors None: what a
        decode block takes, which stages those values itself and reads no other)."""
        dev = rows[0].greedy.device
        vocab = next((getattr(r, f).shape[1] for r in rows for f in BIG if getattr(r, f) is not None), 0)
        out = {"features": tuple(any(r.features[i] for r in rows) for i in range(5))}
        hosts = [h for r in rows for h in (r.host or [None] * r.greedy.shape[0])]
        out["host"] = host = None if None in hosts else [h[:-1] + (c,) for h, c in zip(hosts, counters)]
        for f in BIG:
            parts = [getattr(r, f) for r in rows]
            if all(p is None for p in parts):
                out[f] = None
                continue
            dt = torch.bool if f == "seen" else torch.float32
            out[f] = torch.cat([torch.zeros(1, vocab, dtype=dt, device=dev) if p is None else p for p in parts])
        if host is None:
            out.update({f: torch.cat([getattr(r, f) for r in rows]) for f in SCALARS[:-1]})
            out["counter"] = torch.tensor(counters, dtype=torch.int64, device=dev)
            return SamplingRows(**out)
        if not scalars:
            return SamplingRows(**dict.fromkeys(SCALARS), **out)
        for dt in dict.fromkeys(SCALAR_DTYPES):  # [options of this dtype, rows], a contiguous row per option
            at = [j for j, d in enumerate(SCALAR_DTYPES) if d == dt]
            t = torch.tensor([[h[j] for h in host] for j in at], dtype=dt, device=dev)
            out.update({SCALARS[j]: t[i] for i, j in enumerate(at)})
        return SamplingRows(**out)


def adjust(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """Logits [rows, vocab] float32 with OpenAI's logit bias, frequency and presence penalties (on the counts),
    then transformers' repetition penalty (on `seen`: logit / p where > 0, else * p)."""
    logits = logits.float()
    if rows.bias is not None:
        logits = logits + rows.bias
    if rows.counts is not None:
        c = rows.counts
        logits = logits - c * rows.frequency[:, None] - (c > 0).float() * rows.presence[:, None]
    if rows.seen is not None:
        p = rows.repetition[:, None]
        logits = torch.where(rows.seen, torch.where(logits > 0, logits / p, logits * p), logits)
    return logits


def filtered(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """Adjusted logits / temperature, with top-k (ties of the k-th kept) then top-p (the least likely tokens
    whose mass is at most 1 - p dropped, the likeliest always kept) masked to -inf, per row."""
    logits = logits / rows.temperature[:, None]
    if not rows.features[4]:
        return logits
    V = logits.shape[-1]
    sv, si = logits.sort(dim=-1, descending=True)
    k = torch.where(rows.top_k > 0, rows.top_k, V)
    kth = sv.gather(1, (k - 1)[:, None])
    sv = sv.masked_fill(sv < kth, float("-inf"))
    probs = sv.softmax(dim=-1)
    tail = 1.0 - (probs.cumsum(dim=-1) - probs)  # mass of this token and all less likely
    drop = (tail <= (1.0 - rows.top_p)[:, None]) & (rows.top_p < 1.0)[:, None]
    drop[:, 0] = False
    drop = drop.scatter(1, si, drop) | (logits < kth)
    return logits.masked_fill(drop, float("-inf"))


def pick(logits: torch.Tensor, rows: SamplingRows, counter: torch.Tensor | None = None) -> torch.Tensor:
    """The next token [rows] int64 of each row of logits [rows, vocab]: argmax of the adjusted logits for
    greedy rows, else a Gumbel-max draw with the noise of (seed, `counter`, default rows.counter)."""
    logits = adjust(logits, rows)
    best = logits.argmax(dim=-1)
    if not rows.features[0]:
        return best
    counter = rows.counter if counter is None else counter
    g = -torch.log(-torch.log(uniform(rows.seed, counter, logits.shape[-1])))
    drawn = (filtered(logits, rows) + g).argmax(dim=-1)
    return torch.where(rows.greedy, best, drawn)
