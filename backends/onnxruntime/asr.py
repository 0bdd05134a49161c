"""ASR runner of the `onnxruntime` backend: the exported Whisper graphs (export/whisper_onnx.py, or the
traced standard variant of export/whisper_export.py).

encode runs the encoder graph, which also computes every decoder layer's cross-attention keys/values;
start repeats them for beams and preallocates the self-attention cache (torch tensors); decode_step binds
the cache, the cross keys/values and the logits in place (I/O binding) and writes the step's new keys/values
into the cache at the state's offset. Rewind and reorder are torch ops on those buffers. The 'ort' graphs
take windows shorter than 30 s with per-row lengths (`trims`), and compute logits only at the positions
asked for (the last one, unless a draft is checked). Word timing, which reads the decoder's cross-attention
weights that the graphs do not output, runs the source model's torch decoder over the graphs' cross
keys/values (cross_attention).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort
import torch

from ..asr_state import DecoderState, Encoded, reorder_state, rewind_state
from ..base import ASRRunner, RunnerInfo
from ..dtypes import TORCH
from ..threads import ThreadPolicy
from .binding import bind, providers_device, run_bound

# decoder rows (batch x tokens) from which an int8 export's float32 decoder graph runs a step: int8 activations
# cost in proportion to the rows (AMD EPYC AVX2, 2 threads, ms per step int8 / float32: 1 row 4.4 / 7.5,
# 2 rows 7.3 / 7.5, 4 rows 13.4 / 9.1, 8 rows 30.7 / 12.9)
PROMPT_ROWS = 3


class OrtASRRunner(ASRRunner):
    def __init__(self, directory: Path, manifest, providers, threads: ThreadPolicy, model_name: str = ""):
        from speechrt.models.whisper import WhisperConfig

        from .providers import session

        self.manifest = manifest
        self.config = WhisperConfig(**manifest.config)
        self.tokenizer_path = Path(directory) / "tokenizer.json"
        # (no spinning: the decoding loop runs torch ops between the runs; see providers.session)
        self.encoder = session(str(directory / manifest.graph("encoder").file), providers, spin=False)
        # the decoder's steps are small ops: they run on the loop's threads (ThreadPolicy.step)
        self.decoder = session(str(directory / manifest.graph("decoder").file), providers, threads.step, spin=False)
        # int8: a second decoder graph, float32, for steps of PROMPT_ROWS rows or more (prompts, batches)
        self.prompt = (
            session(str(directory / manifest.graph("prompt").file), providers, threads.step, spin=False)
            if "prompt" in manifest.graphs
            else self.decoder
        )
        self.device = providers_device(self.encoder.get_providers())
        self.dtype = TORCH[manifest.graph("encoder").inputs[0].dtype]
        self.threads = threads
        self.cross_names = [t.name for t in manifest.graph("encoder").outputs]
        self.trims = "lengths" in [t.name for t in manifest.graph("encoder").inputs]
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix="speechrt-ort-encode")
        self._waiter.submit(int).result()  # its thread now, not at the first stoppable encode: a fixed count
        self._lock = threading.Lock()  # loads the word-timing decoder once (cross_attention)
        self._timing = None
        self.info = RunnerInfo(
            "onnxruntime",
            model_name or manifest.model,
            "speechrt-onnx",
            manifest.precision,
            str(self.device),
            ", ".join(self.encoder.get_providers()),
        )

    def loop(self):
        return self.threads.small()

    def _run_encoder(self, mel, lengths, outs, opts=None):
        io = self.encoder.io_binding()
        bind(io, "mel", mel)
        if self.trims:
            bind(io, "lengths", lengths)
        for name, t in zip(self.cross_names, outs):
            bind(io, name, t, output=True)
        run_bound(self.encoder, io, self.device, opts)

    @torch.inference_mode()
    def encode(self, mel, stop=None, frames=None):
        """mel [B, n_mels, F] -> Encoded(cross keys/values [k0, v0, k1, v1, ...] each [B, H, F / 2, Dh], lengths).
        F: 3000, or with `trims` any even count up to it, `frames` [B] the frames of each row that hold audio.
        With `stop`, the graph runs on a helper thread while this one asks stop(); True terminates the run
        (ORT checks between nodes) and returns None."""
        c = self.config
        F = mel.shape[-1]
        if (F != 2 * c.n_audio_ctx and not self.trims) or F % 2 or F > 2 * c.n_audio_ctx:
            valid = f"an even count up to {2 * c.n_audio_ctx}" if self.trims else str(2 * c.n_audio_ctx)
            raise ValueError(f"the exported Whisper encoder takes {valid} mel frames, got {F}")
        mel = mel.to(self.device, self.dtype).contiguous()
        B, S, dh = mel.shape[0], F // 2, c.n_text_state // c.n_text_head
        lengths = None
        if frames is not None and self.trims:  # conv2 halves the frames: position p sees frames 2p-1..2p+1
            lengths = torch.tensor([min((f + 1) // 2, S) for f in frames], dtype=torch.int32, device=self.device)
        full = torch.full((B,), S, dtype=torch.int32, device=self.device)
        outs = [torch.empty(B, c.n_text_head, S, dh, dtype=self.dtype, device=self.device) for _ in self.cross_names]
        run = (mel, full if lengths is None else lengths, outs)
        if stop is None:
            self._run_encoder(*run)
            return Encoded(outs, lengths)
        if stop():
            return None
        opts = ort.RunOptions()
        fut = self._waiter.submit(self._run_encoder, *run, opts)
        while True:
            if stop():
                opts.terminate = True
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - ORT reports the terminated run as an error
                    pass
                return None
            try:
                fut.result(timeout=0.005)
                return Encoded(outs, lengths)
            except TimeoutError:
                continue

    @torch.inference_mode()
    def start(self, encoded, repeat, max_tokens):
        kv, lengths = encoded.states, encoded.lengths
        cross = _layer_pairs(kv)
        if repeat > 1:
            cross = [(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)) for k, v in cross]
            lengths = None if lengths is None else lengths.repeat_interleave(repeat, 0)
        c = self.config
        n = kv[0].shape[0] * repeat
        max_tokens = min(max_tokens, c.n_text_ctx)
        shape = (n, c.n_text_head, max_tokens, c.n_text_state // c.n_text_head)
        caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(c.n_text_layer)
        ]
        return DecoderState(caches, cross, 0, lengths)

    @torch.inference_mode()
    def decode_step(self, state, tokens, last_only=True):
        N, t = tokens.shape
        L = state.caches[0][0].shape[2]
        if state.offset + t > L:
            raise RuntimeError(f"decoder cache full ({L} positions)")
        graph = self.prompt if N * t >= PROMPT_ROWS else self.decoder
        rows = (1 if last_only else t) if self.trims else t  # the 'ort' graph: logits only where asked
        key = (id(graph), N, t, rows)
        if state.bound is None or state.bound.key != key:
            state.bound = _Binding(self, graph, state, key)
        b = state.bound
        b.tokens.copy_(tokens)
        b.offset.fill_(state.offset)
        logits = torch.empty(N, rows, self.config.n_vocab, dtype=torch.float32, device=self.device)
        bind(b.io, "logits", logits, output=True)  # a new tensor each step: callers may keep the last one
        run_bound(graph, b.io, self.device)
        for buf, out in b.new:
            buf[:, :, state.offset : state.offset + t] = out
        state.offset += t
        return logits[:, -1] if last_only else logits

    def rewind(self, state, length):
        return rewind_state(state, length)

    def reorder(self, state, index):
        return reorder_state(state, index)

    word_timing = True

    @torch.inference_mode()
    def cross_attention(self, encoded, tokens):
        """One uncached pass of the source model's torch decoder (loaded on first use: the graphs do not
        output attention weights) over this runner's cross keys/values -> (logits, the alignment heads'
        cross-attention logits), as ASRRunner.cross_attention."""
        dec = self._timing_decoder()
        kv = [t.float() for t in encoded.states]
        cross = _layer_pairs(kv)
        c, (B, T) = self.config, tokens.shape
        shape = (B, c.n_text_head, T, c.n_text_state // c.n_text_head)
        caches = [(kv[0].new_zeros(shape), kv[0].new_zeros(shape)) for _ in range(c.n_text_layer)]
        scores: list[torch.Tensor] = []
        with self.threads.large():
            x = dec.hidden(
                tokens.to(kv[0].device), caches, 0, cross, False, cross_lengths=encoded.lengths, scores=scores
            )
            logits = dec.logits(x)
        return logits, torch.stack([scores[layer][:, head] for layer, head in self.alignment_heads], 1).float()

    def _timing_decoder(self):
        with self._lock:
            if self._timing is None:
                self._timing = _load_timing_decoder(self.manifest, self.device)
                self.alignment_heads = self._timing[1]
            return self._timing[0]


def _layer_pairs(kv: list) -> list[tuple]:
    """The encoder graph's outputs [k0, v0, k1, v1, ...] -> per decoder layer (key, value)."""
    return [(kv[2 * i], kv[2 * i + 1]) for i in range(len(kv) // 2)]


def _load_timing_decoder(manifest, device):
    """(the float32 torch decoder of the model `manifest` was exported from, its alignment heads)."""
    from speechrt.errors import UserError
    from speechrt.kernels import select
    from speechrt.models.registry import ResolvedModel
    from speechrt.models.whisper import TextDecoder, WhisperConfig
    from speechrt.models.whisper_loaders import load_weights

    from ..asr_state import default_alignment_heads

    src = manifest.source or {}
    path = Path(src.get("path") or "")
    if not src.get("path") or not path.exists():
        raise UserError(
            f"word timestamps on an ONNX export read the decoder's cross-attention weights from the "
            f"model it was exported from ({src.get('path') or 'not recorded'}), which is not there; "
            "use --backend torch with that model, or export it again from where it is now"
        )
    w = load_weights(ResolvedModel(manifest.model, "asr", src["format"], path))
    dec = TextDecoder(WhisperConfig(**manifest.config), select("torch", device))
    dec.load_state_dict({k.removeprefix("decoder."): v for k, v in w.state.items() if k.startswith("decoder.")})
    return dec.to(device=device, dtype=torch.float32).eval().requires_grad_(False), default_alignment_heads(w)


class _Binding:
    """A decoder graph's I/O binding for one state and step shape: the caches and cross keys/values bound once
    (ORT keeps their addresses), the step's tokens and offset copied into bound buffers, the new keys/values
    into bound outputs; rebinding all ~30 tensors every step cost ~0.9 ms of a 6 ms step."""

    def __init__(self, runner: OrtASRRunner, graph, state, key):
        _, N, t, rows = key
        dev, c = runner.device, runner.config
        self.key, self.io = key, graph.io_binding()
        self.tokens = torch.empty(N, t, dtype=torch.int64, device=dev)
        self.offset = torch.zeros((), dtype=torch.int64, device=dev)
        bind(self.io, "tokens", self.tokens)
        bind(self.io, "offset", self.offset)
        if runner.trims:
            self.where = torch.arange(t - rows, t, dtype=torch.int64, device=dev)
            S = state.cross[0][0].shape[2]
            lengths = state.cross_lengths
            self.lengths = torch.full((N,), S, dtype=torch.int32, device=dev) if lengths is None else lengths
            bind(self.io, "logit_positions", self.where)
            bind(self.io, "cross_lengths", self.lengths)
        self.new = []
        for i, ((k, v), (ck, cv)) in enumerate(zip(state.caches, state.cross)):
            for kind, buf, cross in (("key", k, ck), ("value", v, cv)):
                bind(self.io, f"self_{kind}.{i}", buf)
                bind(self.io, f"cross_{kind}.{i}", cross)
                out = torch.empty(N, c.n_text_head, t, buf.shape[3], dtype=runner.dtype, device=dev)
                bind(self.io, f"new_{kind}.{i}", out, output=True)
                self.new.append((buf, out))
