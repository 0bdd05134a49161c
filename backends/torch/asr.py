"""ASR runner of the torch backend: models/whisper.py run eagerly, state in a preallocated KV cache."""

from __future__ import annotations

import torch

from speechrt.errors import UserError
from speechrt.kernels import select
from speechrt.models.whisper import Whisper
from speechrt.models.whisper_loaders import WhisperWeights, load_weights

from ..asr_state import DecoderState, Encoded, default_alignment_heads, reorder_state, rewind_state
from ..base import ASRRunner, RunnerInfo
from ..threads import ThreadPolicy, cpu_has_native_bf16

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """None: float32 on the CPU (bit-for-bit the reference), float16 on GPUs. 'auto': the fastest dtype
    that keeps accuracy here — bfloat16 on CPUs with native bf16 (same WER on our test set, about 2x
    faster encoder with AMX), else float32; float16 on GPUs."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype == "auto":
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


class TorchASRRunner(ASRRunner):
    trims = True
    word_timing = True

    def __init__(
        self,
        weights: WhisperWeights,
        device: torch.device,
        dtype: torch.dtype,
        kernels: str = "torch",
        threads: ThreadPolicy | None = None,
        model_name: str = "",
        model_format: str = "",
    ):
        self.config, self.device, self.dtype = weights.config, device, dtype
        self.tokenizer_path = weights.tokenizer_path
        self.alignment_heads = default_alignment_heads(weights)
        model = Whisper(weights.config, select(kernels, device))
        missing, unexpected = model.load_state_dict(weights.state, strict=False)
        missing = [m for m in missing if m != "encoder.positional_embedding"]
        if missing or unexpected:
            raise UserError(f"weights do not fit the Whisper model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        # the decoder blocks' small ops on `threads.step` threads, the encoder and the vocabulary
        # projection (which reads the whole embedding matrix each step) on all of them
        self.threads = threads or ThreadPolicy.build(device, None)
        self.info = RunnerInfo(
            kernels, model_name, model_format, str(dtype).removeprefix("torch."), str(device), self.threads.describe()
        )

    def loop(self):
        return self.threads.small()

    @torch.inference_mode()
    def encode(self, mel, stop=None, frames=None):
        lengths = None
        if frames is not None:  # conv2 halves the frames: position p sees frames 2p-1..2p+1
            lengths = torch.tensor([min((f + 1) // 2, mel.shape[-1] // 2) for f in frames], device=self.device)
        with self.threads.large():
            states = self.model.encoder(mel.to(self.device, self.dtype), stop, lengths)
        return None if states is None else Encoded(states, lengths)

    @torch.inference_mode()
    def start(self, encoded, repeat, max_tokens):
        cross = self.model.cross_kv(encoded.states)
        lengths = encoded.lengths
        if repeat > 1:
            cross = [(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)) for k, v in cross]
            lengths = None if lengths is None else lengths.repeat_interleave(repeat, 0)
        n = encoded.states.shape[0] * repeat
        max_tokens = min(max_tokens, self.config.n_text_ctx)
        return DecoderState(self.model.new_cache(n, max_tokens, self.dtype, self.device), cross, 0, lengths)

    @torch.inference_mode()
    def decode_step(self, state, tokens, last_only=True):
        t = tokens.shape[1]
        if state.offset + t > state.caches[0][0].shape[2]:
            raise RuntimeError(f"decoder cache full ({state.caches[0][0].shape[2]} positions)")
        dec = self.model.decoder
        with self.threads.small():
            x = dec.hidden(
                tokens.to(self.device),
                state.caches,
                state.offset,
                state.cross,
                last_only,
                cross_lengths=state.cross_lengths,
            )
        with self.threads.large():
            logits = dec.logits(x)
        state.offset += t
        return logits

    @torch.inference_mode()
    def cross_attention(self, encoded, tokens):
        state = self.start(encoded, 1, tokens.shape[1])
        scores: list[torch.Tensor] = []
        dec = self.model.decoder
        with self.threads.large():
            x = dec.hidden(
                tokens.to(self.device),
                state.caches,
                0,
                state.cross,
                False,
                cross_lengths=state.cross_lengths,
                scores=scores,
            )
            logits = dec.logits(x)
        heads = torch.stack([scores[layer][:, head] for layer, head in self.alignment_heads], 1)
        return logits, heads.float()

    def rewind(self, state, length):
        return rewind_state(state, length)

    def reorder(self, state, index):
        return reorder_state(state, index)


def build(model, device, dtype, kernels: str = "torch", threads: ThreadPolicy | None = None) -> TorchASRRunner:
    return TorchASRRunner(
        load_weights(model), device, parse_dtype(dtype, device), kernels, threads, model.name, model.format
    )
