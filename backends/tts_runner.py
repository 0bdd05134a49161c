"""The streaming TTS runner the backends share: a VITS-like model's latent (the flow on the first windows' frames at
once, the rest in the background, in pieces that follow the windows) and its windows vocoded side by side on
one-thread workers. It runs models.vits.VITS (the torch backend) and the onnxruntime backend's exported graphs
behind the same members."""

from __future__ import annotations

from concurrent.futures import CancelledError, Future

import torch

from .base import Latent, RunnerInfo, TTSRunner
from .threads import ThreadPolicy

# a sentence whose flow past the first windows' frames is at most this many flow contexts runs it all at once
# (5 words, AMD EPYC Zen 4, ONNX Runtime: 133 frames, the head's 77 on two threads and a background piece of
# 56 + 33 on one: 14 + 20 ms; all 133 on two threads: 16 ms)
SHORT_REST = 4


def flow_pieces(frames: int, ready: int, wins: list[tuple[int, int]], context: int, least: int) -> list[int]:
    """Ends of the background pieces of a latent whose frames [0, ready) are computed: one piece per
    window that reads past what is done (its end plus `context` frames), merged with the next while
    shorter than `least` frames (each piece recomputes its own context)."""
    ends: list[int] = []
    for _, b in wins:
        e = min(frames, b + context)
        if e > (ends[-1] if ends else ready):
            ends.append(e)
    merged: list[int] = []
    for e in ends:
        if merged and merged[-1] - (merged[-2] if len(merged) > 1 else ready) < least:
            merged[-1] = e
        else:
            merged.append(e)
    return merged


def release(task: Future, pieces: list[tuple[int, Future]]) -> None:
    """After the flow's background task: any piece it left unfinished (the task was cancelled, e.g. by a pool
    shut down, or failed) fails, so that no window waits for it forever."""
    for _, f in pieces:
        if not f.done():
            f.set_exception(
                CancelledError("the flow task was cancelled")
                if task.cancelled()
                else task.exception() or RuntimeError("the flow task ended without this piece")
            )


class TorchTTSRunner(TTSRunner):
    """On the CPU, work runs on the thread policy's one-thread workers: the text encoder and flow on one, and
    independent vocoder windows side by side. Window-level parallelism keeps every core busy without
    OpenMP barriers (see ThreadPolicy). The flow runs at once only on the frames the first windows need
    (TTSRunner.head_frames); the rest of it is the first task queued behind, so a window that waits for it
    never waits on a task that has not started (no deadlock, whatever the number of workers or concurrent
    sentences). That task computes the rest in pieces, one per later window (flow_pieces), each released
    as it is done: a window starts once its own frames are there, not the whole flow (30 words, AMD EPYC
    Zen 4, ONNX Runtime: the third window waited 45 ms for the whole flow). On a GPU everything runs on the
    calling thread."""

    def __init__(
        self,
        model,
        voice,
        device: torch.device,
        dtype: torch.dtype,
        threads: ThreadPolicy | None = None,
        kernels: str = "torch",
        model_name: str = "",
        model_format: str = "piper-onnx",
    ):
        """model: a models.vits.VITS, or anything with its inference members (config, prior, flow.reverse, dec,
        speaker): the onnxruntime backend's exported graphs run through this runner too."""
        self.model, self.voice, self.device, self.dtype = model, voice, device, dtype
        self.config = model.config
        self.sample_rate = voice.sample_rate
        self.hop_length = model.config.hop_length
        self.context_frames = model.config.vocoder_context()
        self.flow_context = model.config.flow_context()
        threads = threads or ThreadPolicy.build(device, None)
        self._pool = threads.workers("speechrt-tts")
        self.parallel = threads.total if self._pool is not None else 1
        # the background flow's pieces delay the later windows (windows(), flow_cost): its work against the generator's
        self.flow_cost = self.config.flow_macs() / self.config.generator_macs() if self._pool is not None else 0.0
        self.info = RunnerInfo(
            kernels,
            model_name,
            model_format,
            str(dtype).removeprefix("torch."),
            str(device),
            f"{self.parallel} one-thread workers" if self._pool is not None else "",
        )

    def vocode_async(self, latent, start, end) -> Future:
        if self._pool is None:
            return super().vocode_async(latent, start, end)
        return self._pool.submit(self.vocode, latent, start, end)

    def latent(self, phoneme_ids, options) -> Latent:
        if self._pool is None:
            return self._latent(phoneme_ids, options)
        return self._pool.submit(self._latent, phoneme_ids, options).result()

    def _speaker(self, options):
        if self.config.n_speakers <= 1:
            return None
        sid = options.speaker_id if options.speaker_id is not None else 0
        return self.model.speaker(torch.tensor([sid], device=self.device))

    @torch.inference_mode()
    def _latent(self, phoneme_ids, options) -> Latent:
        o = options.resolved(self.voice)
        gen = None
        if o.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(o.seed)
        ids = torch.tensor([phoneme_ids], dtype=torch.long, device=self.device)
        g = self._speaker(o)
        # durations and the flow run in float32 whatever the vocoder's dtype: the spline inverse and
        # ceil(exp(logw)) are sensitive to rounding, and these parts are cheap
        m, logs = self.model.prior(ids, o.length_scale, o.noise_w, g=g, generator=gen)
        z_p = m
        if o.noise_scale:
            z_p = (
                m
                + torch.randn(m.shape, device=m.device, dtype=m.dtype, generator=gen) * torch.exp(logs) * o.noise_scale
            )
        F = z_p.shape[-1]
        head = self.head_frames(F, options)
        # a model may offer `wide_flow`, the flow on all threads: the head is computed while no window can run
        wide = getattr(self.model, "wide_flow", None)
        if self._pool is None or F - head <= SHORT_REST * self.flow_context:
            # a short rest costs less on all threads now than as a one-thread piece that recomputes its context
            return Latent(self._flow(z_p, 0, F, g, wide), g)
        z = torch.empty_like(z_p)
        z[:, :, :head] = self._flow(z_p, 0, head, g, wide)
        ends = flow_pieces(F, head, self.plan_windows(F, options, True), self.context_frames, 2 * self.flow_context)
        pieces = [(e, Future()) for e in ends]
        task = self._pool.submit(self._flow_pieces, z, z_p, head, pieces, g)
        task.add_done_callback(lambda t: release(t, pieces))  # a failed or cancelled task fails its pieces
        return Latent(z, g, head, pieces)

    @torch.inference_mode()
    def _flow(self, z_p, start, end, g, flow=None):
        """Reverse flow on frames [start, end) of z_p, computed with flow_context frames of context."""
        c = self.flow_context
        lo, hi = max(0, start - c), min(z_p.shape[-1], end + c)
        z = (flow or self.model.flow).reverse(z_p[:, :, lo:hi], torch.ones_like(z_p[:, :1, lo:hi]), g=g)
        return z[:, :, start - lo : end - lo]

    @torch.inference_mode()
    def _flow_pieces(self, z, z_p, start, pieces, g):
        """The flow on frames [start, end) of each piece in turn, releasing each piece's windows when done; an
        error ends the task, and `release` hands it to the pieces left (the windows that wait for them raise it)."""
        for end, done in pieces:
            z[:, :, start:end] = self._flow(z_p, start, end, g)
            done.set_result(None)
            start = end

    @torch.inference_mode()
    def vocode(self, latent: Latent, start: int, end: int) -> torch.Tensor:
        latent.wait_for(end)  # the flow's pieces it reads, in a task queued before it: running or done
        g = latent.vocoder_inputs  # the speaker embedding, or None
        z = latent.z[:, :, start:end]
        if self.dtype != torch.float32:
            z = z.to(self.dtype)
            g = None if g is None else g.to(self.dtype)
        audio = self.model.dec(z, g=g)[0, 0]
        return audio.float().cpu()
