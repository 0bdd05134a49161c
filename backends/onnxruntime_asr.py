"""ASR runner of the `onnxruntime` backend: the exported Whisper graphs (export/whisper_export.py).

encode runs the encoder graph, which also computes every decoder layer's cross-attention keys/values;
start repeats them for beams and preallocates the self-attention cache (torch tensors); decode_step binds
the cache, the cross keys/values and the logits in place (I/O binding) and writes the step's new keys/values
into the cache at the state's offset. Rewind and reorder are torch ops on those buffers.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort
import torch

from .base import ASRRunner, RunnerInfo
from .ort_binding import TORCH, bind, providers_device
from .torch_asr import DecoderState, reorder_state, rewind_state
from .torch_backend import ThreadPolicy


class OrtASRRunner(ASRRunner):
    def __init__(self, directory: Path, manifest, providers, threads: ThreadPolicy, model_name: str = ""):
        from speechrt.models.whisper import WhisperConfig

        from .onnxruntime_backend import session

        self.manifest = manifest
        self.config = WhisperConfig(**manifest.config)
        self.tokenizer_path = Path(directory) / "tokenizer.json"
        self.encoder = session(str(directory / manifest.graph("encoder").file), providers)
        # the decoder's steps are small ops: they run on the loop's threads (ThreadPolicy.step)
        self.decoder = session(str(directory / manifest.graph("decoder").file), providers, threads.step)
        self.device = providers_device(self.encoder.get_providers())
        self.dtype = TORCH[manifest.graph("encoder").inputs[0].dtype]
        self.threads = threads
        self.cross_names = [t.name for t in manifest.graph("encoder").outputs]
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix="speechrt-ort-encode")
        self._lock = threading.Lock()
        self.info = RunnerInfo("onnxruntime", model_name or manifest.model, "speechrt-onnx", manifest.precision,
                               str(self.device), ", ".join(self.encoder.get_providers()))

    def loop(self):
        return self.threads.small()

    def _run_encoder(self, mel, outs, opts=None):
        io = self.encoder.io_binding()
        bind(io, "mel", mel)
        for name, t in zip(self.cross_names, outs):
            bind(io, name, t, output=True)
        self.encoder.run_with_iobinding(io, opts)

    @torch.inference_mode()
    def encode(self, mel, stop=None, frames=None):
        """mel [B, n_mels, 3000] -> cross keys/values [k0, v0, k1, v1, ...] each [B, H, S, Dh]. With `stop`, the
        graph runs on a helper thread while this one asks stop(); True terminates the run (ORT checks
        between nodes) and returns None. The graph encodes whole windows (trims is False): `frames` adds
        nothing to a 3000-frame window."""
        if mel.shape[-1] != 3000:
            raise ValueError(f"the exported Whisper encoder takes 3000 mel frames, got {mel.shape[-1]}")
        c = self.config
        mel = mel.to(self.device, self.dtype).contiguous()
        B, dh = mel.shape[0], c.n_text_state // c.n_text_head
        outs = [torch.empty(B, c.n_text_head, c.n_audio_ctx, dh, dtype=self.dtype, device=self.device)
                for _ in self.cross_names]
        if stop is None:
            self._run_encoder(mel, outs)
            return outs
        if stop():
            return None
        opts = ort.RunOptions()
        fut = self._waiter.submit(self._run_encoder, mel, outs, opts)
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
                return outs
            except TimeoutError:
                continue

    @torch.inference_mode()
    def start(self, encoded, repeat, max_tokens):
        cross = [(encoded[2 * i], encoded[2 * i + 1]) for i in range(len(encoded) // 2)]
        if repeat > 1:
            cross = [(k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)) for k, v in cross]
        c = self.config
        n = encoded[0].shape[0] * repeat
        max_tokens = min(max_tokens, c.n_text_ctx)
        shape = (n, c.n_text_head, max_tokens, c.n_text_state // c.n_text_head)
        caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                   torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(c.n_text_layer)]
        return DecoderState(caches, cross, 0)

    @torch.inference_mode()
    def decode_step(self, state, tokens, last_only=True):
        N, t = tokens.shape
        L = state.caches[0][0].shape[2]
        if state.offset + t > L:
            raise RuntimeError(f"decoder cache full ({L} positions)")
        c = self.config
        io = self.decoder.io_binding()
        # (bound tensors must live until the run: ORT keeps their addresses, not references)
        tokens = tokens.to(self.device, torch.int64).contiguous()
        offset = torch.tensor(state.offset, dtype=torch.int64, device=self.device)
        bind(io, "tokens", tokens)
        bind(io, "offset", offset)
        logits = torch.empty(N, t, c.n_vocab, dtype=torch.float32, device=self.device)
        bind(io, "logits", logits, output=True)
        new = []
        for i, ((k, v), (ck, cv)) in enumerate(zip(state.caches, state.cross)):
            for kind, buf, cross in (("key", k, ck), ("value", v, cv)):
                bind(io, f"self_{kind}.{i}", buf)
                bind(io, f"cross_{kind}.{i}", cross)
                out = torch.empty(N, c.n_text_head, t, buf.shape[3], dtype=self.dtype, device=self.device)
                bind(io, f"new_{kind}.{i}", out, output=True)
                new.append((buf, out))
        self.decoder.run_with_iobinding(io)
        for buf, out in new:
            buf[:, :, state.offset:state.offset + t] = out
        state.offset += t
        return logits[:, -1] if last_only else logits

    def rewind(self, state, length):
        return rewind_state(state, length)

    def reorder(self, state, index):
        return reorder_state(state, index)
