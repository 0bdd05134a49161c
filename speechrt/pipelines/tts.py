"""The speech synthesis pipeline: a TTS runner, the text front end (models/tts_text.py) and the streaming
policy, written once against the TTSRunner interface (backends/base.py). `speechrt.load_tts()` returns one.

Per sentence, the runner computes the whole latent (text encoder, durations, prior, flow: cheap), then the
generator — most of the cost — runs on windows of the latent that grow from `first_chunk_frames` to
`max_chunk_frames` (see windows()). Each window is decoded with `runner.context_frames` latent frames of
context on both sides (the generator's receptive field), so its interior equals the whole-sentence output up
to float rounding; `crossfade` samples at each border are blended with a raised-cosine ramp to hide what
rounding remains. The first audio is ready after one short window instead of after the whole sentence. Runners
that can vocode several windows at once (`runner.parallel`) get the next windows submitted ahead, one more
than they have workers.

A sentence after the first, once the audio already out and not yet heard covers twice the time it is estimated
to take (relaxed()), is vocoded for throughput instead: all its flow at once and one window per worker
(throughput_windows), no small first windows. A paragraph of four 7-10-word sentences, AMD EPYC Zen 4, ONNX
Runtime: 510 ms instead of 595 (Piper 505 ms), the same audio (4e-7).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from speechrt import backends
from speechrt.backends.tts_plan import windows
from speechrt.errors import UserError
from speechrt.models.registry import resolve
from speechrt.models.tts_options import SynthesisOptions
from speechrt.models.tts_sentences import SentenceStream, stream_segments
from speechrt.models.tts_text import TextFrontEnd, TextOptions
from speechrt.outputs import check_output_file

from .audio_codecs import encode_audio
from .audio_output import (
    ENCODINGS,
    FORMATS,
    AudioEncoder,
    check_encoding,
    check_file_format,
    format_for_path,
    wav_header,
    write_audio,
)
from .tts_windows import throughput_windows

__all__ = [
    "TTSPipeline",
    "load_tts",
    "SynthesisOptions",
    "SynthesisStats",
    "stream_latent",
    "windows",
    "relaxed",
    "throughput_windows",
    "encode_audio",
    "check_encoding",
    "ENCODINGS",
    "FORMATS",
    "wav_header",
]


# A sentence after the first may be vocoded for throughput instead of first audio (its flow at once, one window
# per worker: no small first windows, fewer borders; throughput_windows) when the audio already out and not yet
# heard covers RELAX_FACTOR x the time the sentence is estimated to take, plus RELAX_MARGIN_S (see relaxed()).
RELAX_FACTOR = 2.0
RELAX_MARGIN_S = 0.25


def relaxed(ahead_s: float, estimate_s: float) -> bool:
    """Whether a sentence may be vocoded for throughput: `ahead_s` seconds of audio are out and not yet heard
    (played in real time from the first chunk on) and the sentence is estimated to take `estimate_s` seconds
    (at the rate of the sentences before it). Its first audio then comes after its flow and a whole window
    per worker, which is less than its estimate, the whole sentence in windows sized for first audio."""
    return ahead_s >= RELAX_FACTOR * estimate_s + RELAX_MARGIN_S


def stream_latent(
    runner, latent, options: SynthesisOptions, wins: list[tuple[int, int]] | None = None
) -> Iterator[torch.Tensor]:
    """Audio chunks of one sentence's latent, vocoded window by window (see the module docstring): in `wins`,
    or in the runner's plan for first audio (TTSRunner.plan_windows)."""
    F, hop, ctx = latent.frames, runner.hop_length, runner.context_frames
    xf = min(options.crossfade, ctx * hop)
    ramp = None
    tail = None  # the previous window's last `xf` samples, which overlap the next window's first
    par = max(1, runner.parallel)
    ahead = par + 1 if par > 1 else 1  # one more than the workers: none waits for this loop to hand it work
    if wins is None:  # the runner's background flow's pieces follow its plan
        wins = runner.plan_windows(F, options, bool(latent.pieces))
    pending = collections.deque()  # futures of the next windows, submitted in order
    try:
        for k, (a, b) in enumerate(wins):
            while len(pending) < ahead and k + len(pending) < len(wins):
                pa, pb = wins[k + len(pending)]
                pending.append(runner.vocode_async(latent, max(0, pa - ctx), min(F, pb + ctx)))
            lo = max(0, a - ctx)
            audio = pending.popleft().result()
            last = b == F
            s0 = (a - lo) * hop
            s1 = (b - lo) * hop + (0 if last else xf)
            seg = audio[s0:s1].clone()
            if tail is not None and xf:
                if ramp is None:
                    ramp = 0.5 - 0.5 * torch.cos(torch.linspace(0, math.pi, xf + 2)[1:-1])  # 0 -> 1, sums to 1
                seg[:xf] = tail * (1 - ramp) + seg[:xf] * ramp
            if not last and xf:
                tail = seg[-xf:]
                seg = seg[:-xf]
            yield seg
    finally:  # a consumer that stops early (barge-in) leaves no windows queued
        for f in pending:
            f.cancel()
    if options.sentence_silence:
        yield torch.zeros(int(options.sentence_silence * runner.sample_rate))


# ------------------------------------------------------------------------------------------------- the API


@dataclass
class SynthesisStats:
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0
    first_audio_seconds: float | None = None  # from the call to the first chunk
    relaxed_sentences: int = 0  # vocoded for throughput, with audio enough ahead (relaxed())

    @property
    def rtf(self) -> float:
        return self.compute_seconds / self.audio_seconds if self.audio_seconds else float("nan")


class TTSPipeline:
    """A voice ready to speak: text front end + a backend's TTS runner.

    synthesize(text) yields float32 chunks at `sample_rate` (or the rate asked for); synthesize_stream(pieces)
    speaks text that arrives incrementally (LLM tokens), a sentence or clause at a time;
    synthesize_to_file(text, path) writes WAV, raw pcm16 or raw float32.
    """

    relax = True  # sentences after the first vocoded for throughput when audio enough is ahead (relaxed())

    def __init__(self, runner, name: str = ""):
        self.runner = runner
        self.voice = runner.voice
        self.text = TextFrontEnd(runner.voice)
        self.sample_rate = runner.sample_rate
        self.name = name or runner.info.model
        self.last_stats = SynthesisStats()

    @property
    def info(self):
        return self.runner.info

    @staticmethod
    def clause_splitter(min_clause_words: int = 8) -> SentenceStream:
        """Cuts text that arrives in pieces into sentences and long-enough clauses, each spoken as soon as
        it is complete (`push(piece)` -> finished segments, `flush()` -> the rest)."""
        return SentenceStream(min_clause_words=min_clause_words)

    def options(
        self,
        options: SynthesisOptions | None = None,
        *,
        rate: float | None = None,
        speaker: int | str | None = None,
        **kw,
    ) -> SynthesisOptions:
        """SynthesisOptions from keyword controls: rate (speaking-rate multiplier, 1 = normal), speaker (id or
        name from the voice's speaker_id_map), and any SynthesisOptions field (synthesis_options)."""
        return synthesis_options(self.voice, options, rate, speaker, **kw)

    def check_text(self, text: str) -> None:
        """UserError if this voice cannot read `text` (characters it cannot read, nothing to say)."""
        self.text.prepare(text, TextOptions(normalize=False))

    def _speak(
        self,
        id_seqs: Iterable[list[int]],
        o: SynthesisOptions,
        sample_rate,
        format,
        progress=None,
        first_audio: bool = True,
    ):
        enc = AudioEncoder(self.sample_rate, sample_rate, format)
        st = self.last_stats = SynthesisStats()
        t0 = time.perf_counter()
        busy = 0.0
        tick = time.perf_counter()
        total = len(id_seqs) if isinstance(id_seqs, list) else None
        ids_done = 0  # phoneme ids of the sentences before: their compute time per id estimates the next one's
        r = self.runner
        for done, ids in enumerate(id_seqs):
            if progress is not None:
                progress(done, total)
            relax = self.relax and not first_audio  # nobody hears the audio while it is made
            if self.relax and first_audio and st.first_audio_seconds is not None:  # a sentence after the first
                ahead = st.audio_seconds - (time.perf_counter() - t0 - st.first_audio_seconds)
                relax = relaxed(ahead, busy * len(ids) / ids_done)
            # relaxed: a first window as large as any, so that the runner computes all the flow at once (up to
            # ~18 s of speech; beyond, windows wait for the flow's background pieces they read)
            latent = r.latent(ids, replace(o, first_chunk_frames=o.max_chunk_frames) if relax else o)
            wins = None
            if relax:
                st.relaxed_sentences += 1
                wins = throughput_windows(latent.frames, r.parallel, o.max_chunk_frames, r.context_frames)
            ids_done += len(ids)
            for chunk in stream_latent(r, latent, o, wins):
                st.audio_seconds += len(chunk) / self.sample_rate
                out = enc.feed(chunk)
                now = time.perf_counter()
                busy += now - tick
                if st.first_audio_seconds is None:
                    st.first_audio_seconds = now - t0
                if len(out):
                    yield out
                tick = time.perf_counter()
        if progress is not None and total is not None:
            progress(total, total)
        out = enc.flush()
        st.compute_seconds = busy
        if len(out):
            yield out

    def synthesize(
        self,
        text: str,
        options: SynthesisOptions | None = None,
        *,
        sample_rate: int | None = None,
        format: str = "f32",
        normalize: bool = True,
        on_unsupported: str = "error",
        progress=None,
        first_audio: bool = True,
        **controls,
    ):
        """Text -> audio chunks (float32 arrays, or pcm16 bytes with format='pcm16'), sentence by sentence,
        each sentence in windows. Input is checked before any audio is produced: characters the voice
        cannot read are an error, or, with on_unsupported='drop', dropped with a warning. `progress(done,
        total)` is called before each sentence and at the end. first_audio=False: nobody hears the audio
        while it is made (a file, a response encoded at its end), so every sentence is vocoded for throughput
        (see relaxed()) and the first chunk comes later."""
        o = self.options(options, **controls)
        topt = TextOptions(normalize=normalize, on_unsupported=on_unsupported)
        if format == "wav":
            raise UserError("format 'wav' is for files (synthesize_to_file); stream 'f32' or 'pcm16'")
        AudioEncoder(self.sample_rate, sample_rate, format)  # validate before the first chunk
        sentences = list(self.text.sentences(text, topt))
        return self._speak(sentences, o, sample_rate, format, progress, first_audio)

    def synthesize_stream(
        self,
        pieces: Iterable[str],
        options: SynthesisOptions | None = None,
        *,
        sample_rate: int | None = None,
        format: str = "f32",
        min_clause_words: int = 8,
        on_unsupported: str = "drop",
        first_audio: bool = True,
        **controls,
    ):
        """Text arriving in pieces (e.g. LLM tokens) -> audio chunks; each sentence or long-enough clause is
        spoken as soon as it is complete. Unsupported characters (emoji) are dropped by default here.
        first_audio=False: as in synthesize()."""
        o = self.options(options, **controls)
        topt = TextOptions(on_unsupported=on_unsupported)

        def ids():
            for seg in stream_segments(pieces, min_clause_words=min_clause_words):
                if not any(c.isalnum() for c in seg):
                    continue
                yield from self.text.sentences(seg, topt)

        return self._speak(ids(), o, sample_rate, format, first_audio=first_audio)

    def synthesize_array(self, text: str, options: SynthesisOptions | None = None, **kw) -> np.ndarray:
        """The whole utterance as one float32 array (made for throughput: synthesize's first_audio=False)."""
        chunks = list(self.synthesize(text, options, **{"first_audio": False, **kw}))
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)

    def synthesize_to_file(
        self,
        text: str | Iterable[str],
        path,
        options: SynthesisOptions | None = None,
        *,
        format: str | None = None,
        sample_rate: int | None = None,
        **kw,
    ) -> SynthesisStats:
        """Write `text` (a string, or pieces to stream) to `path` ('-' = stdout; a binary file object works too).
        format: 'wav' | 'pcm16' | 'f32', or 'flac' | 'mp3' | 'opus' (Ogg Opus) | 'aac' (ADTS), encoded (PyAV, see
        audio_codecs.codec_rate for their rates), all written as synthesized; by default from the suffix (.wav,
        .raw/.pcm = pcm16, .f32, .flac, .mp3, .opus/.ogg, .aac)."""
        fmt = format or format_for_path(path)
        check_file_format(fmt)
        if path != "-" and not hasattr(path, "write"):  # before any synthesis: one line, not an OSError
            check_output_file(path, "path", "out.wav")
        gen_fmt = "pcm16" if fmt == "wav" else "f32" if fmt in ENCODINGS else fmt
        # a file written to disk is not heard while it is made; stdout may be a player
        kw.setdefault("first_audio", path == "-")
        gen = (
            self.synthesize(text, options, sample_rate=sample_rate, format=gen_fmt, **kw)
            if isinstance(text, str)
            else self.synthesize_stream(text, options, sample_rate=sample_rate, format=gen_fmt, **kw)
        )
        write_audio(gen, path, fmt, self.sample_rate if sample_rate is None else sample_rate)
        return self.last_stats


def synthesis_options(
    voice, options: SynthesisOptions | None = None, rate: float | None = None, speaker: int | str | None = None, **kw
) -> SynthesisOptions:
    """`options` (None: the defaults) with keyword controls applied, resolved against `voice` (its config):
    `rate` (speaking-rate multiplier, 1 = normal), `speaker` (id or name from the voice's speaker_id_map) and
    any SynthesisOptions field; a UserError names what is valid."""
    o = options or SynthesisOptions()
    if rate is not None:
        if not (0.1 <= rate <= 5.0):
            raise UserError(f"rate must be in [0.1, 5.0] (1 = the voice's normal speed), got {rate}")
        kw["length_scale"] = (kw.get("length_scale") or o.length_scale or voice.length_scale) / rate
    if speaker is not None:
        if isinstance(speaker, str) and not speaker.isdigit():
            names = voice.speaker_id_map
            if speaker not in names:
                raise UserError(
                    f"unknown speaker {speaker!r}; this voice's speakers: "
                    f"{', '.join(names) if names else 'none (single speaker)'}"
                )
            speaker = names[speaker]
        kw["speaker_id"] = int(speaker)
    unknown = sorted(set(kw) - set(SynthesisOptions.__dataclass_fields__))
    if unknown:
        raise UserError(
            f"unknown synthesis option(s) {', '.join(unknown)}; valid: rate, speaker, "
            f"{', '.join(SynthesisOptions.__dataclass_fields__)}"
        )
    o = replace(o, **kw) if kw else o
    return o.resolved(voice)


def load_tts(
    voice: str | Path | None = None,
    backend: str = "auto",
    device: str = "cpu",
    dtype: str | None = None,
    step_threads: int | None = None,
) -> TTSPipeline:
    """A registered voice name or a Piper .onnx path (None = the default voice) on a backend -> TTSPipeline."""
    m = resolve(voice, "tts")
    return TTSPipeline(backends.get(backend).tts(m, device=device, dtype=dtype, step_threads=step_threads), m.name)
