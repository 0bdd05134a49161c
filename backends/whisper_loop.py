"""Whisper's greedy decode loop on the device: K decoder steps in one call (one CUDA graph replay, one read by the
host), each step's logit rules and argmax on the device (one kernel on a GPU, kernels/triton_whisper_pick.py; its
torch reference elsewhere), each picked token fed back in.

The rules are those of speechrt.pipelines.whisper_decoding.LogitRules after a window's first token (the host picks
that one, with the first-token rules: blank, the initial timestamp and its bound): suppressed tokens, and with
timestamps <|notimestamps|> off, timestamps paired (after a closed pair text follows, after an open one a timestamp
or end of text), never decreasing, and forced when the timestamps are jointly more likely than any text token. A
row's sequence enters as four numbers (its last and second-to-last token, its last timestamp, its length), updated
on the device as it grows, so no step needs the host.

A row can enter with known tokens (`queue`): the first is fed, and the steps whose next token is already known take
it instead of the pick (the tail of a checked draft, fed again after a rewind). A row that ends (end of text, its
budget, a loop the host detects) goes on being fed within the block: rows are independent and share one position,
and the host drops the row after the block, keeping only the tokens up to its end. So the same ids as stepping one
token at a time, with at most K - 1 steps spent on a row that ended.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cuda_graphs import CapturedStep


@dataclass(frozen=True)
class BlockRules:
    """What a block needs of the window's logit rules (constants of the model and the options: one graph each)."""

    timestamps: bool  # the timestamp rules apply (not without_timestamps)
    timestamp_begin: int  # the first timestamp token; every token from it on is a timestamp
    eot: int
    suppress: tuple[int, ...]  # suppressed everywhere (with timestamps, <|notimestamps|> included)


@dataclass
class BlockRows:
    """The rows entering a block: each one's tokens to feed (the first fed now, the others known next tokens) and
    the rule state of its sequence so far (the fed token included): last and second-to-last token (-1: none),
    last timestamp (-1: none), length."""

    queue: list[list[int]]
    last: list[int]
    penult: list[int]
    last_ts: list[int]
    count: list[int]


def rule_state(heads: list[list[int]], timestamp_begin: int) -> list[list[int]]:
    """The rule state of sequences `heads` (each non-empty): their last tokens, second-to-last (-1: none), last
    timestamps (-1: none) and lengths."""
    return [
        [h[-1] for h in heads],
        [h[-2] if len(h) > 1 else -1 for h in heads],
        [next((t for t in reversed(h) if t >= timestamp_begin), -1) for h in heads],
        [len(h) for h in heads],
    ]


def block_rows(seqs: list[list[int]], pos: int, k: int, timestamp_begin: int) -> BlockRows:
    """BlockRows for sequences `seqs` (each longer than `pos`) whose token `pos` is fed next, with up to k known."""
    return BlockRows([s[pos : pos + k] for s in seqs], *rule_state([s[: pos + 1] for s in seqs], timestamp_begin))


def suppress_mask(rules: BlockRules, vocab: int, device) -> torch.Tensor:
    """[vocab] bool: the tokens `rules` suppress everywhere."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    if rules.suppress:
        mask[list(rules.suppress)] = True
    return mask


def pick_rows(pick, logits, rules: BlockRules, suppress, state) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy picks from logits [n, V] of rows in `state` ([4, n]: last, penult, last_ts, count) under `rules`,
    `suppress` its mask, through `pick` (kernels.reference_pick.whisper_pick or its Triton kernel) -> (ids [n],
    log-probabilities [n])."""
    return pick(logits, suppress, state, rules.timestamps, rules.timestamp_begin, rules.eot)


class DecodeBlock:
    """K greedy steps of `step(tokens [rows, 1], position [1]) -> logits [rows, V] float32` (a slot's decoder step
    on its buffers) from `position` on, on `rows` rows, under `rules`, each step's pick through `pick` (see
    pick_rows); captured as one graph unless `capture` is False (the CPU: the same ops run every call)."""

    def __init__(self, step, pick, rows: int, k: int, vocab: int, rules: BlockRules, device, capture: bool):
        self.step_fn, self.pick, self.k, self.rules = step, pick, k, rules
        self.queue = torch.zeros((rows, k), dtype=torch.long, device=device)
        self.qlen = torch.ones(rows, dtype=torch.long, device=device)
        self.state = torch.zeros((4, rows), dtype=torch.long, device=device)  # last, penult, last_ts, count
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.suppress = suppress_mask(rules, vocab, device)
        self.run = CapturedStep(self._run, capture)

    def _run(self) -> torch.Tensor:
        """-> [rows, 2K] float32: each row's K next tokens (exact: ids < 2^24), then their log-probabilities (of the
        picks; a known token's entry is the pick's, unused). Reads the buffers, writes only the decoder's caches."""
        tb = self.rules.timestamp_begin
        tok, pos = self.queue[:, 0], self.position
        last, penult, last_ts, count = self.state
        ids, lps = [], []
        for s in range(self.k):
            state = torch.stack([last, penult, last_ts, count])
            nxt, lp = pick_rows(self.pick, self.step_fn(tok[:, None], pos), self.rules, self.suppress, state)
            lps.append(lp)
            if s + 1 < self.k:
                nxt = torch.where(self.qlen > s + 1, self.queue[:, s + 1], nxt)
            ids.append(nxt)
            penult, last, count = last, nxt, count + 1
            last_ts = torch.where(nxt >= tb, nxt, last_ts)
            tok, pos = nxt, pos + 1
        return torch.cat([torch.stack(ids, dim=1).float(), torch.stack(lps, dim=1)], dim=1)

    def __call__(self, rows: BlockRows, position: int) -> tuple[list[list[int]], list[list[float]]]:
        """Run the block for the first len(rows.queue) rows from `position` -> (each row's K tokens, their
        log-probabilities). Rows past those are fed token 0 (their outputs are dropped)."""
        n, k = len(rows.queue), self.k
        q = torch.zeros(self.queue.shape, dtype=torch.long)
        ql = torch.ones(self.qlen.shape, dtype=torch.long)
        for i, toks in enumerate(rows.queue):
            q[i, : len(toks)] = torch.tensor(toks[:k])
            ql[i] = min(len(toks), k)
        st = torch.full(self.state.shape, -1, dtype=torch.long)
        st[:, :n] = torch.tensor([rows.last, rows.penult, rows.last_ts, rows.count])
        st[3, n:] = 0
        self.queue.copy_(q, non_blocking=True)
        self.qlen.copy_(ql, non_blocking=True)
        self.state.copy_(st, non_blocking=True)
        self.position.fill_(position)
        out = self.run()[:n].tolist()  # the one wait on the device per block
        return [[int(t) for t in r[:k]] for r in out], [r[k:] for r in out]
