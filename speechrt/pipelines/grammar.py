"""Constrained decoding: grammars (compiled by llguidance) whose token masks keep what the language model writes
inside a JSON schema, any JSON object, or a call of one of the given tools.

llguidance was chosen over xgrammar and outlines-core by its measured per-token cost at SmolLM2's vocabulary, its
size and its dependencies (docs/language-model.md, "Structured output"). A Grammar is the checked, immutable
description that GenerationOptions carries; each sequence that uses it gets a Constraint (a matcher: its state),
which the continuous batcher (lm_batching) asks for a mask before it samples the sequence's token and tells the
token after, per row: rows without a grammar are untouched, on every backend.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from speechrt.errors import UserError

# JSON as a model writes it compactly and as OpenAI shows it: one space after ':' and ',', no other whitespace
# (a small model free to add whitespace may write newlines until max_tokens)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MASKED = -1e30  # added to the logits of tokens the grammar forbids (exp() of it is 0 in float32)


class GrammarError(UserError, ValueError):
    """A schema or grammar that cannot be compiled; `param` names the request field it came from."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a core dependency: only a broken install lacks it
        raise UserError(
            "structured output and tool calls need the llguidance package: pip install 'llguidance>=1.0'"
        ) from None
    return llguidance


def json_grammar(schema: dict) -> dict:
    """A JSON schema with speechrt's JSON style (x-guidance: compact separators, no free whitespace)."""
    return {**schema, "x-guidance": JSON_STYLE}


@dataclass(frozen=True)
class Grammar:
    """llguidance's grammar text (`source`, as LLMatcher takes it), checked when made. `kind`: what it
    describes ('json_schema', 'json_object', 'tool_call' or 'tool_call_or_text')."""

    source: str
    kind: str

    @classmethod
    def json_schema(cls, schema, param: str = "schema", kind: str = "json_schema") -> Grammar:
        """Output valid against `schema` (a dict). GrammarError naming `param` if llguidance cannot compile it."""
        if not isinstance(schema, dict):
            raise GrammarError(f"{param} must be a JSON schema (an object), got {type(schema).__name__}", param)
        llg = _llguidance()
        return cls._checked(llg.LLMatcher.grammar_from_json_schema(json.dumps(json_grammar(schema))), kind, param)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's JSON mode)."""
        return cls.json_schema({"type": "object"}, kind="json_object")

    @classmethod
    def lark(cls, text: str, kind: str, param: str) -> Grammar:
        """A Lark grammar in llguidance's dialect (%json {...} embeds a JSON schema)."""
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(text), kind, param)

    @classmethod
    def _checked(cls, source: str, kind: str, param: str) -> Grammar:
        err = _llguidance().LLMatcher.validate_grammar(source)
        if err:
            raise GrammarError(f"{param} is not a schema this server can follow: {err}", param)
        return cls(source, kind)

    def constraint(self, tokenizer, vocab: int) -> Constraint:
        """A fresh matcher of this grammar for one sequence of a model with `tokenizer` (an LMTokenizer)."""
        return Constraint(self, _ll_tokenizer(tokenizer, vocab))


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer, vocab: int):
    """llguidance's view of `tokenizer` (its token bytes and stop tokens), made once per tokenizer (~0.5 s)."""
    got = _TOKENIZERS.get(tokenizer)
    if got is None or got[0] != vocab:
        llg = _llguidance()
        lt = llg.LLTokenizer(tokenizer.to_json(), n_vocab=vocab, eos_token=list(tokenizer.stop_ids()))
        got = _TOKENIZERS[tokenizer] = (vocab, lt)
    return got[1]


def prepare(tokenizer, vocab: int) -> None:
    """Make llguidance's tokenizer now (a request thread calls it, so that the batch does not wait for it)."""
    _ll_tokenizer(tokenizer, vocab)


class Constraint:
    """One sequence's place in its grammar: the mask of the tokens allowed next, and the tokens it took."""

    def __init__(self, grammar: Grammar, lltok):
        self.grammar = grammar
        self.vocab = lltok.vocab_size
        self.m = _llguidance().LLMatcher(lltok, grammar.source)
        if self.m.is_error():
            raise GrammarError(f"the grammar cannot start: {self.m.get_error()}")
        self.words = np.full((self.vocab + 31) // 32, -1, dtype=np.int32)

    def penalty(self) -> torch.Tensor:
        """[vocab] float32 on the CPU: 0 for the tokens the grammar allows next, MASKED for the others."""
        w = self.words
        self.m.unsafe_compute_mask_ptr(w.ctypes.data, w.nbytes)
        banned = np.unpackbits(~w.view(np.uint8), bitorder="little")[: self.vocab]
        # arithmetic on 0/1, not a boolean fill: masked_fill with a scattered mask is ~10x slower on the CPU
        return torch.from_numpy(banned).float().mul_(MASKED)

    def take(self, token: int) -> bool:
        """The token sampled -> False if the grammar did not allow it (it cannot, after the mask)."""
        return self.m.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing may follow (the sequence stops)."""
        return self.m.is_stopped()


def mask_rows(logits: torch.Tensor, constraints: list[Constraint | None]) -> torch.Tensor:
    """The logits [N, V] (any backend's device and dtype) -> float32 logits in which each row that has a
    constraint allows only its grammar's tokens; the other rows are unchanged. A new tensor: `logits` is left as
    it was (the log probabilities a request asks for are the model's)."""
    n, v = logits.shape
    pen = torch.zeros(n, v, dtype=torch.float32)
    for i, c in enumerate(constraints):
        if c is not None:
            p = c.penalty()
            pen[i, : min(v, p.shape[0])] = p[:v]
    return logits.float() + pen.to(logits.device, non_blocking=True)
