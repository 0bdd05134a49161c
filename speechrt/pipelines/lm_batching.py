"""The language model's token loop: continuous batching over one preallocated, slot-addressed KV cache.

Requests join as slots free up (their prompt is prefilled into the slot, which also samples their first
token) and leave when they stop; every decode step runs one token for all active sequences together,
whatever their lengths. The server's engine steps one batcher for all conversations; `stream()` (and
with it every `generate`/`chat` call of the Python API) is a thin loop over a batcher of its own.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from speechrt.backends.token_repeats import repeating

from .generation import GenerationOptions, Piece, Sampler, StreamEvent, TextStream, check_bias, check_prompts
from .grammar import Constraint, GrammarError, mask_rows
from .lm_blocks import check_block, decode_block
from .lm_slots import SlotPool

BLOCK = 8  # decode steps per replay where the runner runs them on the device (ContinuousBatcher.block)


@dataclass(eq=False)
class LMRequest:
    """One sequence to generate. `emit` receives each Piece (and an Exception if the batch fails), on the
    thread that steps the batcher. `key` names the conversation: its next request reuses the cached
    positions of this one that its prompt repeats (prefix caching)."""

    ids: list[int]
    options: GenerationOptions
    emit: Callable[[Piece | Exception], None] | None = None
    key: object = None
    cancelled: bool = False
    # while it runs
    slot: int = -1
    count: int = 0  # tokens sampled
    last: int = -1  # the last sampled token, to be fed at the next decode step
    fed: list[int] = field(default_factory=list, repr=False)  # generated tokens written to the cache
    reused: int = 0  # prompt positions found in the slot's cache (prefix caching)
    sampler: Sampler | None = field(default=None, repr=False)
    text: TextStream | None = field(default=None, repr=False)
    seen: torch.Tensor | None = field(default=None, repr=False)  # [vocab] bool, for the repetition penalty
    out: list[int] = field(default_factory=list, repr=False)  # the reply's tokens so far
    stop_ids: frozenset = frozenset()
    constraint: Constraint | None = field(default=None, repr=False)  # options.grammar's matcher, while it runs


class ContinuousBatcher:
    """Slots of one KV cache shared by requests that come and go. Not thread-safe: `submit` and
    `cancelled` flags may be set from another thread only under the caller's own lock (the engine's).
    `block`: decode steps per call of a runner that runs several on the device (1: one, the reference path)."""

    def __init__(
        self, runner, tokenizer, max_batch: int = 8, max_seq: int | None = None, cache=None, block: int = BLOCK
    ):
        self.runner, self.tokenizer, self.block = runner, tokenizer, check_block(block)
        max_seq = min(max_seq or 2048, runner.config.max_seq_len)
        if cache is None or cache.max_batch < max_batch or cache.max_seq < max_seq:
            cache = runner.new_cache(max_batch, max_seq)
        self.cache, self.max_batch, self.max_seq = cache, max_batch, cache.max_seq
        self.slots = SlotPool(runner, cache, max_batch)
        self.pending: collections.deque[LMRequest] = collections.deque()
        self.active: dict[int, LMRequest] = {}

    @property
    def free(self) -> list[int]:
        """The free slots (SlotPool.free)."""
        return self.slots.free

    @property
    def retained(self) -> dict[int, tuple[object, list[int]]]:
        """What the free slots keep for their conversations (SlotPool.retained)."""
        return self.slots.retained

    # -- queue --------------------------------------------------------------------------------------
    def submit(self, req: LMRequest) -> None:
        if len(req.ids) + 1 > self.max_seq:
            raise ValueError(f"a prompt of {len(req.ids)} tokens does not fit this batcher's {self.max_seq} positions")
        check_bias(req.options, self.runner.config.vocab_size)  # here, not on the worker when it starts
        self.pending.append(req)

    def has_work(self) -> bool:
        return bool(self.active) or (bool(self.pending) and bool(self.free))

    def size(self) -> int:
        """Requests running or waiting."""
        return len(self.active) + len(self.pending)

    def fail(self, error: Exception) -> None:
        """A step raised: every request running or waiting gets `error`, and every slot is free again
        (what the cache held is forgotten)."""
        for req in list(self.active.values()) + list(self.pending):
            if req.emit is not None:
                req.emit(error)
        self.active.clear()
        self.pending.clear()
        self.slots.reset()

    # -- steps --------------------------------------------------------------------------------------
    def step(self) -> None:
        """One scheduling step: drop cancelled requests, let one waiting request join, then one decode
        step for every running sequence."""
        self.admit()
        self.decode()

    @torch.inference_mode()
    def admit(self, all_pending: bool = False) -> None:
        """Prefill waiting requests into free slots (each prefill also samples the request's first token).
        One joins per call, so that joining never stalls the running sequences long; `all_pending`: every
        waiting request that has a free slot, their prompts handed to the runner together."""
        for req in [r for r in self.active.values() if r.cancelled]:
            self._finish(req, Piece("", "cancelled"))
        joining = []
        while self.pending and self.free:
            req = self.pending.popleft()
            if req.cancelled:
                self._emit(req, Piece("", "cancelled"))
                continue
            self._start(req)
            joining.append(req)
            if not all_pending:
                break
        if not joining:
            return
        with self.runner.loop():  # the prompts in one call: a runner may run them as one batch
            results = self.runner.prefill_many(
                self.cache, [(r.slot, torch.tensor(r.ids[r.reused :], dtype=torch.long), r.reused) for r in joining]
            )
        ok = []
        for req, res in zip(joining, results):
            if isinstance(res, Exception):  # this request's prompt failed: only it is told
                self._drop(req, res)
            else:
                ok.append((req, res))
        if ok:
            self._take([req for req, _ in ok], torch.stack([res for _, res in ok]))

    @torch.inference_mode()
    def decode(self) -> None:
        """One decode step: each running sequence's last token in, its next token sampled (or a block of several
        on the device where the runner offers one: lm_blocks.decode_block)."""
        rows = [s for s, r in self.active.items() if r.last >= 0 and not r.cancelled]
        if not rows:
            return
        reqs = [self.active[s] for s in rows]
        with self.runner.loop():
            if decode_block(self, rows, reqs):
                return
            for r in reqs:
                r.fed.append(r.last)
            logits = self.runner.decode_step(self.cache, rows, torch.tensor([r.last for r in reqs], dtype=torch.long))
            self._take(reqs, logits)

    def warm_up(self, ids: list[int]) -> None:
        """Run a prompt and one decode step through a free slot and free it again (the first calls on a
        thread pay for its thread pool, kernel choices and allocations), and let the runner prepare."""
        slot = self.free[0]
        with torch.inference_mode(), self.runner.loop():
            self.runner.prefill(self.cache, slot, torch.tensor(ids, dtype=torch.long), 0)
            self.runner.decode_step(self.cache, [slot], torch.tensor([0]))
            self.runner.prepare(self.cache, slot)
        self.runner.release(self.cache, slot)

    # -- per request ----------------------------------------------------------------------------------
    def _start(self, req: LMRequest) -> None:
        req.slot, req.reused = self.slots.take(req.key, req.ids)
        o, dev = req.options, self.runner.device
        req.sampler = Sampler(o, self.runner.config.vocab_size, dev)
        req.text = TextStream(self.tokenizer, o.stop)
        req.stop_ids = frozenset(self.tokenizer.stop_ids() if o.stop_token_ids is None else o.stop_token_ids)
        if o.grammar is not None:
            req.constraint = o.grammar.constraint(self.tokenizer, self.runner.config.vocab_size)
        if o.repetition_penalty != 1.0:
            req.seen = torch.zeros(self.runner.config.vocab_size, dtype=torch.bool, device=dev)
            req.seen[torch.tensor(req.ids, device=dev)] = True
        self.active[req.slot] = req

    def _take(self, reqs: list[LMRequest], logits: torch.Tensor) -> None:
        """Sample each request's next token from its row of logits [N, vocab] and deliver it. Rows of requests
        with a grammar are masked to the tokens it allows first (the others are left as they are)."""
        model = logits
        if any(r.constraint is not None for r in reqs):
            logits = mask_rows(logits, [r.constraint for r in reqs])
        if all(r.options.argmax for r in reqs):  # one argmax and one host sync for the whole batch
            toks = logits.argmax(dim=-1).tolist()
        else:
            toks = [
                int(r.sampler(logits[i : i + 1], None if r.seen is None else r.seen[None])[0])
                for i, r in enumerate(reqs)
            ]
        for i, (r, t) in enumerate(zip(reqs, toks)):
            self.deliver(r, t, None if r.options.logprobs is None else token_logprobs(model[i], t, r.options.logprobs))

    def deliver(self, req: LMRequest, t: int, lp: tuple | None = None) -> None:
        """`lp`: the token's log probability and the likeliest alternatives, for requests that ask (else None)."""
        lp = lp or (None, ())
        req.count += 1
        if req.seen is not None:
            req.seen[t] = True
        req.sampler.observe(t)
        st = req.text
        if req.constraint is not None and not req.constraint.take(t):  # cannot happen after the mask
            return self._drop(req, GrammarError(f"token {t} breaks the grammar: {req.constraint.m.get_error()}"))
        if t in req.stop_ids:
            text, _ = st.finish()
            return self._finish(req, Piece(text, "stop", t))
        text, hit = st.push(st.detok.add(t))
        if hit:
            return self._finish(req, Piece(text, "stop", t, *lp))
        if req.constraint is not None and req.constraint.done:  # the JSON is closed: nothing may follow
            rest, _ = st.finish()
            return self._finish(req, Piece(text + rest, "stop", t, *lp))
        # the token would be fed at position len(ids) + count - 1: past the cache, the context is full
        if req.count >= req.options.max_tokens or len(req.ids) + req.count > self.max_seq:
            rest, hit = st.finish()
            return self._finish(req, Piece(text + rest, "stop" if hit else "length", t, *lp))
        req.out.append(t)
        # a grammar's output may repeat on purpose (a list of equal items): cutting it would leave broken JSON
        if req.options.stop_repeats and req.constraint is None and repeating(req.out, req.options.stop_repeats):
            rest, hit = st.finish()
            return self._finish(req, Piece(text + rest, "stop" if hit else "repetition", t, *lp))
        req.last = t
        self._emit(req, Piece(text, None, t, *lp))

    def _drop(self, req: LMRequest, error: Exception) -> None:
        """`req` failed on its own: it gets the error and its slot is freed."""
        self._emit(req, error)
        self.active.pop(req.slot, None)
        self.slots.put_back(req.slot)
        req.slot = -1

    @staticmethod
    def _emit(req: LMRequest, piece: Piece | Exception) -> None:
        if req.emit is not None:
            req.emit(piece)

    def _finish(self, req: LMRequest, piece: Piece) -> None:
        """`req` is done (stopped, or cancelled between steps): its slot is free again and, for a request with
        a key, keeps the positions written for it, its prompt and the tokens fed, for the key's next request. A
        cancelled one too: a reply begun in a pause and dropped when speech resumed, or one the person barged into,
        read the conversation so far, which the next reply's prompt repeats (300 tokens of it are 0.5 s of prefill
        on a 2-core Zen 4, about 2 s at a Zen 1 VM's speed, emulated)."""
        self._emit(req, piece)
        if req.slot >= 0:
            self.active.pop(req.slot, None)
            self.slots.put_back(req.slot, req.key, req.ids + req.fed)
            req.slot = -1


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """A row of logits [V] -> the log probability of `token` and the `top` likeliest (id, log probability)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = lp.topk(top) if top else (lp[:0], lp[:0].long())
    return float(lp[token]), tuple(zip(ids.tolist(), values.tolist()))


def stream(
    runner, tokenizer, prompts: Sequence[Sequence[int]], options: GenerationOptions = GenerationOptions(), cache=None
) -> Iterator[StreamEvent]:
    """Generate for every prompt (token ids) at once; yields text deltas as they are decoded.

    One event per new token per sequence (text may be ''), and exactly one event with a finish_reason
    per sequence. All prompts are prefilled first; rows finish independently and leave the decode batch.
    `cache`: a KV cache of the runner's to reuse, if it is large enough."""
    cfg = runner.config
    check_prompts(prompts, cfg.vocab_size, cfg.max_seq_len)
    max_seq = min(max(len(p) for p in prompts) + options.max_tokens, cfg.max_seq_len)
    batcher = ContinuousBatcher(runner, tokenizer, max_batch=len(prompts), max_seq=max_seq, cache=cache)
    events: collections.deque[StreamEvent] = collections.deque()
    for i, p in enumerate(prompts):
        batcher.submit(
            LMRequest(
                list(p),
                options,
                lambda piece, i=i: events.append(
                    StreamEvent(i, piece.text, piece.token, piece.finish_reason, piece.logprob, piece.top)
                ),
            )
        )
    while batcher.has_work():
        batcher.admit(all_pending=True)
        while events:
            yield events.popleft()
        batcher.decode()
        while events:
            yield events.popleft()


def generate_text(runner, tokenizer, prompts, options: GenerationOptions = GenerationOptions()) -> list[str]:
    """Whole texts for a batch of token-id prompts (non-streaming convenience)."""
    out = [""] * len(prompts)
    for ev in stream(runner, tokenizer, prompts, options):
        out[ev.index] += ev.text
    return out
