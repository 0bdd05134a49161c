"""Long-form Whisper transcription: audio of any length, seeking window to window by the predicted timestamps
(openai/whisper's `transcribe`), one window per step; its timed segments and transcript, and a recording's
steps with `vad_filter` (its speech regions joined, their times restored)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from speechrt.models.audio import (
    CHUNK_LENGTH,
    HOP_LENGTH,
    N_FRAMES,
    SAMPLE_RATE,
    log_mel_spectrogram,
    pad_or_trim_frames,
    trimmed_frames,
)

from .speech_regions import SpeechMap, hop_levels_db, is_quiet, is_silence, speech_timestamps
from .transcribe_options import TranscribeOptions
from .whisper_decoding import WindowDecoder, initial_prompt_tokens
from .whisper_timing import Word, add_word_timestamps, last_end, skip_hallucinations


def timed_segments(toks: list[int], tb: int, prec: float, to_the_end: bool = False) -> list[tuple]:
    """A window's tokens with timestamps (`tb` the first, `prec` s each) -> the segments two consecutive
    timestamps close, (start s, end s, tokens) from the window's start; `to_the_end`: and the tokens after
    the last pair (a window ending in text then one timestamp). [] when no pair closes one."""
    is_ts = [t >= tb for t in toks]
    cuts = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
    if cuts and to_the_end:
        cuts.append(len(toks))
    out, last = [], 0
    for cur in cuts:
        part = toks[last:cur]
        out.append(((part[0] - tb) * prec, (part[-1] - tb) * prec, part))
        last = cur
    return out


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    words: list[Word] = field(default_factory=list)  # with word_timestamps


@dataclass
class Transcript:
    text: str
    segments: list[Segment] = field(default_factory=list)
    language: str = "en"
    duration: float = 0.0
    language_probability: float = 1.0  # of the detected language (1.0 when it was given, or English-only)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "language": self.language,
            "language_probability": round(self.language_probability, 4),
            "duration": self.duration,
            "segments": [
                {
                    "id": s.id,
                    "start": round(s.start, 3),
                    "end": round(s.end, 3),
                    "text": s.text,
                    "avg_logprob": s.avg_logprob,
                    "no_speech_prob": s.no_speech_prob,
                    "temperature": s.temperature,
                    **({"words": [w.to_dict() for w in s.words]} if s.words else {}),
                }
                for s in self.segments
            ],
        }


def long_form_steps(
    decoder: WindowDecoder, mel: torch.Tensor, duration: float, opts: TranscribeOptions, on_segment=None, levels=None
):
    """Long-form transcription, one window at a time: a generator that decodes one 30-s window per next()
    (yielding the seconds of audio done so far) and returns the Transcript. A scheduler interleaves these
    steps with other work, so one long recording does not hold the device for all of its windows at once.

    mel [n_mels, frames + N_FRAMES]: the log-mel of audio of any length followed by a window's worth of
    zero padding. Windows of 30 s (trim_context: the last is cut to its audio); each next window starts
    where the last complete segment of the previous one ended; its text conditions the next window's
    decoding. `levels`: the audio's level per mel frame (dBFS, speech_regions.hop_levels_db) for the
    silence gate; None: no gate."""
    runner, tok, cfg = decoder.runner, decoder.tok, decoder.cfg
    content_frames = mel.shape[-1] - N_FRAMES
    gen = torch.Generator(device=runner.device).manual_seed(opts.seed)
    tb, prec = tok.timestamp_begin, CHUNK_LENGTH / cfg.n_audio_ctx  # 0.02 s per token
    input_stride = N_FRAMES // cfg.n_audio_ctx  # mel frames per output position (2)
    language, language_prob = opts.language or ("en" if not tok.multilingual else None), 1.0
    all_tokens = initial_prompt_tokens(tok, opts.initial_prompt)
    prompt_reset = 0  # the text the next window is conditioned on starts here (the initial prompt first)
    segments: list[Segment] = []
    seek = 0
    last_speech = 0.0  # the end of the last word (word_timestamps)
    while seek < content_frames:
        time_offset, window_seek = seek * HOP_LENGTH / SAMPLE_RATE, seek
        seg_frames = min(N_FRAMES, content_frames - seek)
        if is_quiet(None if levels is None else levels[seek : seek + seg_frames], opts):
            seek += seg_frames  # the silence gate: nothing to decode
            yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
            continue
        # trim_context: a window of less than 30 s of audio (the last) is encoded over its audio only; by
        # default (None) not a recording's first window (a short recording is encoded as Whisper was trained)
        trim = runner.trims and (opts.trim_context or (opts.trim_context is None and seek > 0))
        valid, length = trimmed_frames([seg_frames], opts.trim_margin) if trim else (None, N_FRAMES)
        encoded = runner.encode(
            pad_or_trim_frames(mel[:, seek : seek + seg_frames], length)[None],
            None,
            valid if length < N_FRAMES else None,
        )
        if language is None:  # from the first window, as openai-whisper and faster-whisper do
            ((language, language_prob),) = decoder.language_probabilities(encoded, 1, 1)[0]
        res = decoder.decode_with_fallback(encoded, all_tokens[prompt_reset:], opts, language, gen)
        if is_silence(res, opts):
            seek += seg_frames  # silence: skip the window
            yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
            continue
        toks = res.tokens
        single_ending = len(toks) >= 2 and toks[-2] < tb <= toks[-1]
        parts = timed_segments(toks, tb, prec, single_ending)
        new = [(time_offset + a, time_offset + b, part) for a, b, part in parts]
        if parts:
            seek += seg_frames if single_ending else (parts[-1][2][-1] - tb) * input_stride
        else:
            dur = seg_frames * HOP_LENGTH / SAMPLE_RATE
            stamps = [t for t in toks if t >= tb]
            if stamps and stamps[-1] != tb:
                dur = (stamps[-1] - tb) * prec
            new.append((time_offset, time_offset + dur, toks))
            seek += seg_frames
        found = [{"start": start, "end": end, "tokens": part, "words": []} for start, end, part in new]
        if opts.word_timestamps and found:
            speech_before = last_speech
            last_speech = add_word_timestamps(
                runner,
                tok,
                encoded,
                found,
                time_offset,
                seg_frames,
                tok.sot_sequence(language, opts.task),
                language,
                last_speech,
            )
            if not single_ending:  # the next window starts after the last word (faster-whisper)
                end = last_end(found)
                if end is not None and end > time_offset:
                    seek = round(end * SAMPLE_RATE / HOP_LENGTH)
            if opts.hallucination_silence_threshold is not None:
                skip, drop = skip_hallucinations(
                    found, opts.hallucination_silence_threshold, window_seek, seg_frames, content_frames, speech_before
                )
                seek = seek if skip is None else skip
                if drop:
                    yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
                    continue
            last_speech = last_end(found) if found else speech_before
        for f in found:
            part, text = f["tokens"], tok.decode(f["tokens"])
            if not text.strip() or f["start"] == f["end"] or f["start"] >= duration:
                continue  # instantaneous, empty or after the audio's end: dropped, from the prompt too
            seg = Segment(
                len(segments),
                f["start"],
                f["end"],
                text,
                [t for t in part if t < tok.eot],
                res.avg_logprob,
                res.no_speech_prob,
                res.temperature,
                res.compression_ratio,
                f["words"],
            )
            segments.append(seg)
            all_tokens.extend(part)
            if on_segment:
                on_segment(seg)
        if not opts.condition_on_previous_text or res.temperature > 0.5:
            prompt_reset = len(all_tokens)
        yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
    text = "".join(seg.text for seg in segments).strip()
    return Transcript(text, segments, language or "en", duration, language_prob)


def speech_only(pcm: np.ndarray, opts: TranscribeOptions) -> tuple[np.ndarray, SpeechMap | None]:
    """With vad_filter: the speech regions Silero finds, joined, and their map back to the recording's
    times; otherwise the audio as it is and None."""
    if not opts.vad_filter:
        return pcm, None
    regions = SpeechMap(speech_timestamps(pcm, opts.vad_parameters))
    return regions.join(pcm), regions


def restore_times(out: Transcript, pcm: np.ndarray, regions: SpeechMap | None, on_segment=None) -> Transcript:
    """A transcript of the joined speech regions -> times of the recording (segments, then words)."""
    if regions is None:
        return out
    regions.restore(out.segments)
    out.duration = len(pcm) / SAMPLE_RATE
    for seg in out.segments if on_segment else ():
        on_segment(seg)
    return out


def long_form_mel(runner, pcm: np.ndarray) -> torch.Tensor:
    """The log-mel long-form transcription reads: the audio's frames and a window's worth of padding
    (call under inference mode)."""
    return log_mel_spectrogram(pcm, runner.config.n_mels, padding=N_FRAMES * HOP_LENGTH, device=runner.device)


def recording_steps(decoder: WindowDecoder, audio: np.ndarray, opts: TranscribeOptions, on_segment=None):
    """A recording's long-form transcription as steps (ASRPipeline.transcribe_steps): with vad_filter only its
    speech regions, joined, then long_form_steps over their log-mel, the transcript's times restored to the
    recording's at the end."""
    runner = decoder.runner
    speech, regions = speech_only(audio, opts)
    with torch.inference_mode(), runner.loop():
        mel = long_form_mel(runner, speech)
    steps = long_form_steps(
        decoder,
        mel,
        len(speech) / SAMPLE_RATE,
        opts,
        on_segment if regions is None else None,
        hop_levels_db(speech),
    )
    while True:
        with torch.inference_mode(), runner.loop():
            try:
                done = next(steps)
            except StopIteration as end:
                return restore_times(end.value, audio, regions, on_segment)
        yield done
