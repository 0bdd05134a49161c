"""Continuous batching of language-model generation across conversations.

One preallocated KV cache with `max_batch` slots. Requests join as slots free up (their prompt is
prefilled into the slot) and leave when they stop; every `step()` runs one decode step for all active
sequences together, whatever their lengths. Runs on the engine's worker thread only; `submit` and
`cancel` are called from the event loop under the engine's lock.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch

from speechrt.models.generate import GenerationOptions, Sampler, _Text


@dataclass
class LMRequest:
    ids: list[int]
    options: GenerationOptions
    emit: callable  # emit((text, finish_reason or None)) -> delivered to the waiting session
    cancelled: bool = False
    slot: int = -1
    count: int = 0
    last: int = -1
    sampler: Sampler | None = field(default=None, repr=False)
    text: _Text | None = field(default=None, repr=False)
    key: object = None  # the conversation: its next request can reuse this one's cached positions
    fed: list[int] = field(default_factory=list, repr=False)  # generated tokens written to the cache
    reused: int = 0  # prompt positions found in the slot's cache (prefix caching)


class ContinuousBatcher:
    def __init__(self, lm, max_batch: int = 8, max_seq: int | None = None):
        self.lm = lm
        self.runner = lm.runner
        cfg = self.runner.config
        self.max_seq = min(max_seq or 2048, cfg.max_seq_len)
        self.cache = self.runner.new_cache(max_batch, self.max_seq)
        self.free = list(range(max_batch))
        # prefix caching: a free slot keeps the positions of the request that last used it, so that the
        # same conversation's next turn (whose prompt starts with the previous prompt and answer) only
        # prefills what is new. slot -> (key, token ids in its cache); the least recently freed is
        # taken first by requests without a slot of their own.
        self.retained: dict[int, tuple[object, list[int]]] = {}
        self.pending: collections.deque[LMRequest] = collections.deque()
        self.active: dict[int, LMRequest] = {}
        self.stop_ids = set(lm.tokenizer.stop_ids())
        self.vocab = cfg.vocab_size

    def has_work(self) -> bool:
        return bool(self.active) or (bool(self.pending) and bool(self.free))

    def submit(self, req: LMRequest):
        room = self.max_seq - req.options.max_tokens
        if len(req.ids) > room:  # keep the end of the conversation
            req.ids = req.ids[-room:]
        self.pending.append(req)

    def _slot_for(self, req: LMRequest) -> tuple[int, int]:
        """A free slot for `req` and how many of its prompt's positions that slot already holds."""
        for slot in reversed(self.free):
            key, ids = self.retained.get(slot, (None, None))
            if key is not None and key == req.key:
                self.free.remove(slot)
                del self.retained[slot]
                n = 0
                for a, b in zip(ids, req.ids[:-1]):  # the last prompt token is always run: its logits
                    if a != b:
                        break
                    n += 1
                return slot, n
        slot = self.free.pop(0)
        self.retained.pop(slot, None)
        return slot, 0

    def _finish(self, req: LMRequest, text: str, reason: str):
        req.emit((text, reason))
        if req.slot >= 0:
            self.active.pop(req.slot, None)
            if req.key is not None and reason != "cancelled":
                self.retained[req.slot] = (req.key, req.ids + req.fed)
            elif hasattr(self.runner, "release"):
                self.runner.release(self.cache, req.slot)
            self.free.append(req.slot)
            req.slot = -1

    def _take(self, req: LMRequest, logits: torch.Tensor):
        """Sample the next token of `req` from its logits [vocab] and deliver the text it completes."""
        t = int(req.sampler(logits[None], None)[0])
        req.count += 1
        st = req.text
        if t in self.stop_ids:
            text, _ = st.finish()
            return self._finish(req, text, "stop")
        text, hit = st.push(st.detok.add(t))
        if hit:
            return self._finish(req, text, "stop")
        if req.count >= req.options.max_tokens or len(req.ids) + req.count >= self.max_seq:  # context full
            rest, hit = st.finish()
            return self._finish(req, text + rest, "stop" if hit else "length")
        req.last = t
        if text:
            req.emit((text, None))

    @torch.inference_mode()
    def step(self):
        for slot, req in list(self.active.items()):
            if req.cancelled:
                self._finish(req, "", "cancelled")
        # admit waiting requests into free slots (each prefill also yields its first token)
        while self.pending and self.free:
            req = self.pending.popleft()
            if req.cancelled:
                req.emit(("", "cancelled"))
                continue
            req.slot, req.reused = self._slot_for(req)
            req.sampler = Sampler(req.options, self.vocab, self.runner.device)
            req.text = _Text(self.lm.tokenizer, req.options.stop)
            self.active[req.slot] = req
            logits = self.runner.prefill(self.cache, req.slot, torch.tensor(req.ids[req.reused:], dtype=torch.long),
                                         req.reused)
            self._take(req, logits)
            if self.active:  # decode the others before the next prefill: joining never stalls them long
                break
        rows = [s for s, r in self.active.items() if r.last >= 0 and not r.cancelled]
        if not rows:
            return
        for s in rows:
            self.active[s].fed.append(self.active[s].last)
        toks = torch.tensor([self.active[s].last for s in rows], dtype=torch.long)
        logits = self.runner.decode_step(self.cache, rows, toks)
        for i, s in enumerate(rows):
            self._take(self.active[s], logits[i])
