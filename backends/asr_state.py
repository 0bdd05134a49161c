"""The ASR decoding state the ASR runners share: the encoder output they hand the caller (Encoded), the decoder's
caches and cross keys/values (DecoderState), and rewinding and reordering it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from speechrt.errors import UserError
from speechrt.models.whisper_loaders import WhisperWeights


@dataclass
class Encoded:
    states: torch.Tensor  # [B, S, d]
    lengths: torch.Tensor | None  # [B] positions holding each row's audio (None: all S)


@dataclass
class DecoderState:
    caches: list  # per layer (k, v) [N, H, max_len, Dh]
    cross: list  # per layer (k, v) [N, H, S, Dh]
    offset: int
    cross_lengths: torch.Tensor | None = None  # [N] encoder positions of each row (None: all S)
    bound: Any = None  # a runner's bindings of the buffers above, kept between steps (reset when they move)


def default_alignment_heads(weights: WhisperWeights) -> tuple[tuple[int, int], ...]:
    """The file's alignment heads (CTranslate2 config.json, Hugging Face generation_config.json); a file
    without them gets openai-whisper's default for a model without a tuned table: every head of the last
    half of the decoder layers."""
    c = weights.config
    bad = [h for h in weights.alignment_heads if not (0 <= h[0] < c.n_text_layer and 0 <= h[1] < c.n_text_head)]
    if bad:
        raise UserError(
            f"alignment heads {bad} are outside the decoder's {c.n_text_layer} layers x {c.n_text_head} heads"
        )
    if weights.alignment_heads:
        return tuple((int(l), int(h)) for l, h in weights.alignment_heads)
    return tuple((l, h) for l in range(c.n_text_layer // 2, c.n_text_layer) for h in range(c.n_text_head))


def rewind_state(state: DecoderState, length: int) -> DecoderState:
    """ASRRunner.rewind on a DecoderState (shared by the runners that keep one)."""
    if not 0 <= length <= state.offset:
        raise ValueError(f"cannot rewind a decoder state holding {state.offset} positions to {length}")
    state.offset = length  # later positions are out of attention's reach until overwritten
    return state


@torch.inference_mode()
def reorder_state(state: DecoderState, index: torch.Tensor) -> DecoderState:
    """ASRRunner.reorder on a DecoderState: rows `index` of every cache, cross key/value and cross length."""
    state.bound = None
    state.caches = [(k.index_select(0, index), v.index_select(0, index)) for k, v in state.caches]
    state.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in state.cross]
    if state.cross_lengths is not None:
        state.cross_lengths = state.cross_lengths.index_select(0, index)
    return state
