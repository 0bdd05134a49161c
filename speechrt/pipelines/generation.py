"""Generation options, sampling and incremental text for the language model pipeline, written once
against the LMRunner interface (backends/base.py). The token loop itself is the continuous batcher
(lm_batching.py).

Sampling: OpenAI's logit bias and frequency / presence penalties (on the tokens this reply sampled so far),
then transformers' order: repetition penalty -> temperature -> top-k -> top-p -> sample. temperature == 0 is
greedy (argmax of the logits so adjusted). The ops are backends/sampling.py's, shared with the decode loops
that stay on the device (a seeded request draws the same tokens either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from speechrt.backends import sampling
from speechrt.backends.sampling import SamplingRows, new_seed
from speechrt.errors import UserError
from speechrt.models.lm_text import Detokenizer, LMTokenizer

from .grammar import Grammar


class GenerationError(UserError, ValueError):
    """Bad generation options or prompts; the message says what is valid."""


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int = 256  # new tokens per sequence, the stop token included
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    repetition_penalty: float = 1.0  # 1 -> off; >1 discourages tokens already in prompt or output
    stop: tuple[str, ...] = ()  # strings that end generation (not included in the text)
    stop_token_ids: tuple[int, ...] | None = None  # None -> the tokenizer's EOS and end-of-turn tokens
    seed: int | None = None  # sampling seed; None -> nondeterministic
    stop_repeats: int = 4  # end a reply whose last tokens are one span repeated this many times (0 -> off)
    # OpenAI's: added to the logits of these token ids (a dict {id: bias} or (id, bias) pairs; bias in [-100, 100])
    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0  # OpenAI's, in [-2, 2]: minus this times the count of each token sampled so far
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]: minus this from each token sampled so far
    # OpenAI's top_logprobs: None -> off; 0-20 -> each token's log probability (the model's distribution, before
    # bias, penalties and temperature) and that many of the likeliest tokens at its place (Piece.logprob, .top)
    logprobs: int | None = None
    # constrained decoding: every token the sequence samples keeps its text inside this grammar (a JSON schema, a
    # tool call; grammar.py), and the sequence stops when the grammar is complete. None -> free text
    grammar: Grammar | None = None

    def __post_init__(self):
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise GenerationError(
                f"grammar must be None or a Grammar (speechrt.pipelines.grammar), got {self.grammar!r}"
            )
        lp = self.logprobs
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20):
            raise GenerationError(
                f"logprobs must be None (off) or an integer in [0, 20] (alternatives per token), got {lp!r}"
            )
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise GenerationError(f"{name} must be a number in [-2, 2] (0 = off), got {v!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise GenerationError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if not isinstance(ids, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
                raise GenerationError(f"stop_token_ids must be None or a list of token ids (integers), got {ids!r}")
            object.__setattr__(self, "stop_token_ids", tuple(ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise GenerationError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (self.temperature >= 0.0):
            raise GenerationError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise GenerationError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise GenerationError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not (self.repetition_penalty > 0.0):
            raise GenerationError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise GenerationError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise GenerationError(f"seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.stop_repeats, int) or self.stop_repeats < 0 or self.stop_repeats == 1:
            raise GenerationError(f"stop_repeats must be 0 (off) or an integer >= 2, got {self.stop_repeats!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def argmax(self) -> bool:
        """The next token is the argmax of the logits as they are (greedy, no penalty or bias)."""
        return (
            self.greedy
            and self.repetition_penalty == 1.0
            and not self.logit_bias
            and not self.frequency_penalty
            and not self.presence_penalty
        )

    @property
    def counts_output(self) -> bool:
        """Do the sampled tokens' counts change the next logits (frequency or presence penalty)?"""
        return bool(self.frequency_penalty or self.presence_penalty)


def _logit_bias(raw) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({token id: bias}, ids as ints or the digit strings JSON gives) -> sorted pairs."""
    pairs = raw.items() if isinstance(raw, dict) else raw
    try:
        out = {}
        for k, v in pairs:
            tid = int(k) if isinstance(k, str) and k.strip().isdigit() else k
            if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                raise ValueError
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100.0 <= v <= 100.0:
                raise ValueError
            out[tid] = float(v)
    except (TypeError, ValueError):
        raise GenerationError(
            f"logit_bias must map token ids (integers >= 0) to biases in [-100, 100], got {raw!r}"
        ) from None
    return tuple(sorted(out.items()))


class Piece(NamedTuple):
    """What one sampled token adds to a sequence's output."""

    text: str  # new text (may be empty when a token only completed part of a character)
    finish_reason: str | None = None  # None while running, then "stop" (stop token/string), "length", "repetition"
    # (the reply repeats itself: see speechrt.backends.token_repeats) or "cancelled"
    token: int | None = None  # the token that produced it
    logprob: float | None = None  # its log probability, if the options ask for logprobs (not for a stop token)
    top: tuple[tuple[int, float], ...] = ()  # then the `logprobs` likeliest tokens there: (id, log probability)


@dataclass
class StreamEvent:
    index: int  # which prompt of the batch
    text: str  # new text (may be empty when a token only completed part of a character)
    token: int | None  # the token that produced it
    finish_reason: str | None = None  # None while running, then "stop" (stop token/string), "length" or "repetition"
    logprob: float | None = None  # as Piece's, with options.logprobs
    top: tuple[tuple[int, float], ...] = ()


def check_bias(options: GenerationOptions, vocab: int) -> None:
    """GenerationError if `options.logit_bias` names a token id outside a vocabulary of `vocab`."""
    bad = [t for t, _ in options.logit_bias if t >= vocab]
    if bad:
        raise GenerationError(f"logit_bias names token ids outside the vocabulary (0-{vocab - 1}): {bad[:5]}")


class Sampler:
    """Picks the next token of each row from logits [N, V] float32, with the tensor ops of backends/sampling.py
    (those a decode loop on the device runs): a draw is a Gumbel-max over noise hashed from the request's seed
    and how many tokens it has drawn (`drawn`), so its tokens do not depend on its batch neighbours."""

    def __init__(self, options: GenerationOptions, vocab: int, device: torch.device):
        self.o = options
        check_bias(options, vocab)
        self.bias = None
        if options.logit_bias:
            self.bias = torch.zeros(vocab, dtype=torch.float32, device=device)
            ids, values = zip(*options.logit_bias)
            self.bias[torch.tensor(ids, device=device)] = torch.tensor(values, device=device)
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device) if options.counts_output else None
        self.seed = 0 if options.greedy else new_seed(options.seed)
        self.drawn = 0  # tokens drawn so far: the noise's counter
        self.vocab, self.device = vocab, device
        self._row: tuple[object, SamplingRows] | None = None

    def row(self, seen: torch.Tensor | None) -> SamplingRows:
        """This request's options as one row of backends.sampling.SamplingRows (`seen`: its [vocab] mask for
        the repetition penalty, or [N, vocab] for N rows of logits, or None); built once per mask."""
        key = None if seen is None else (seen.data_ptr(), tuple(seen.shape))  # the same mask, updated in place
        if self._row is None or self._row[0] != key:
            o = self.o
            rows = SamplingRows.one(
                self.vocab,
                self.device,
                o.temperature,
                o.top_k,
                o.top_p,
                o.repetition_penalty,
                o.frequency_penalty,
                o.presence_penalty,
                self.seed,
                self.bias,
                None if o.repetition_penalty == 1.0 else seen,
                self.counts,
            )
            self._row = (key, rows)
        return self._row[1]

    def penalize(self, logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """transformers' RepetitionPenaltyLogitsProcessor: seen tokens' logits / p if > 0 else * p."""
        p = self.o.repetition_penalty
        return torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)

    def observe(self, token: int) -> None:
        """A token this reply sampled (the frequency and presence penalties count them)."""
        if self.counts is not None:
            self.counts[token] += 1

    def adjust(self, logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """The logits [N, V] with the bias, the frequency and presence penalties and the repetition penalty."""
        return sampling.adjust(logits, self.row(seen))

    def __call__(self, logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        counter = torch.tensor([self.drawn], dtype=torch.int64, device=self.device)
        self.drawn += 1
        return sampling.pick(logits, self.row(seen), counter)


class TextStream:
    """Per-sequence text state: detokenizer + stop-string hold-back."""

    def __init__(self, tok: LMTokenizer, stops: tuple[str, ...]):
        self.detok = Detokenizer(tok)
        self.stops = stops
        self.pending = ""
        self.longest = max((len(s) for s in stops), default=0)

    def push(self, piece: str) -> tuple[str, bool]:
        """-> (text that is safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return piece, False
        buf = self.pending + piece
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        hold = 0  # longest suffix of buf that is a proper prefix of some stop string
        for k in range(min(len(buf), self.longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def finish(self) -> tuple[str, bool]:
        text, hit = self.push(self.detok.flush())
        if not hit:
            text, self.pending = text + self.pending, ""
        return text, hit


def check_prompts(prompts: Sequence[Sequence[int]], vocab: int, max_len: int) -> None:
    if not prompts:
        raise GenerationError("no prompts given")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise GenerationError(f"prompt {i} is empty; give at least one token")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise GenerationError(f"prompt {i} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if len(p) + 1 > max_len:
            raise GenerationError(f"prompt {i} has {len(p)} tokens; the model's context holds {max_len}")
