"""The server's transcription options, built in this one place: a Realtime turn's live and final transcripts
(streaming/realtime), the engine's default and its long-form pass of turns over 30 s (streaming/engine/,
engine/transcripts.py), and the REST transcription endpoints (streaming/http/transcriptions.py). It depends on the ASR
pipeline only, so every layer of the server may import it."""

from __future__ import annotations

import dataclasses

from speechrt.pipelines.asr import TranscribeOptions

LIVE_MARGIN_S = 1.0  # seconds of padding a live transcript's encoder reads after the turn's audio
FINAL_MARGIN_S = 10.0  # ... a final transcript's (the server's --final-margin), see asr_options
# the final margin while the engine is loaded (streaming/engine/load.py, LoadedMargins)
LOADED_FINAL_MARGIN_S = 3.0
# long-form transcription (turns over 30 s, REST): two temperatures, one sample each, not 6 x 5 decodes a window
LONG_TEMPERATURES = (0.0, 0.4)


def asr_options(
    cfg=None, live: bool = False, final_margin: float | None = None, live_margin: float = LIVE_MARGIN_S
) -> TranscribeOptions:
    """The transcriber's options for a session's turns: greedy, its language and prompt (`cfg`: a session's
    configuration, realtime.config.SessionConfig, or anything with `language` and `prompt`; None: neither), a
    decoded loop cut, and the encoder over the turn's audio plus a margin of padding, not a whole 30-s window
    (whisper.cpp's audio_ctx). Live transcripts (`live`, redone every second) take a `live_margin` (1 s);
    final ones (and the early ones that may become final) `final_margin` (default FINAL_MARGIN_S: the
    server's --final-margin).

    The final margin, measured on the benchmark's 12 sentences and 4 questions in the embedded voice, 3 seeds
    x 3 lead/tail silences (144 clips of 1.5-3 s, `transcribe_batch` as the server runs it, tiny.en int8 on
    ONNX Runtime, AMD EPYC Zen 4, 2026-11-27): whole windows 4.61 % WER at 218 ms a clip, 10 s 4.61 % / 90 ms,
    8 s 5.32 % / 75 ms, 6 s 5.67 % / 60 ms, 4 s and 3 s 7.09 % / 54 ms ("What color is the sky on a clear
    day?" -> "What colors does this guy ...", "Remind me" -> "Rem I need"); torch float32 the same way (whole
    and 8 s 4.61 %, 3 s 6.38 %, 48 clips). The conversation benchmark's 4 questions: 12.9 % WER with 3 s, 0 %
    with 10 s, final p50 305 vs 302 ms. (An earlier study, 108 clips of the 12 sentences alone on Zen 3, had
    found 3 s at whole windows' WER, 3.31 vs 3.19 %, and the server ran 3 s until this one.)"""
    return TranscribeOptions(
        without_timestamps=True,
        language=cfg.language if cfg is not None else None,
        initial_prompt=cfg.prompt if cfg is not None else None,
        trim_context=True,
        trim_margin=live_margin if live else final_margin or FINAL_MARGIN_S,
        stop_repeats=3,
    )


def turn_options(
    cfg, final_margin: float | None = None, live_margin: float = LIVE_MARGIN_S
) -> tuple[TranscribeOptions, TranscribeOptions]:
    """(final, live) transcriber options of a session's turns (asr_options)."""
    return asr_options(cfg, final_margin=final_margin), asr_options(cfg, live=True, live_margin=live_margin)


# the engine's default: a live transcript's options without a language or prompt
LIVE = asr_options(live=True)


def long_options(opts: TranscribeOptions) -> TranscribeOptions:
    """A long turn's long-form options in the server: the session's language and prompt, and a bounded
    fallback (two temperatures, one sample each: at most two decodes of a window, not 6 x 5)."""
    return dataclasses.replace(
        TranscribeOptions(),
        language=opts.language,
        initial_prompt=opts.initial_prompt,
        temperatures=LONG_TEMPERATURES,
        best_of=1,
    )


def rest_options(task: str, language: str | None, prompt: str | None, temperature: float | None) -> dict:
    """The keywords of a REST transcription's long-form options (ASRPipeline.options checks them): its task,
    language and prompt, one sample a window, at `temperature` if the request gives one, else the long-form
    fallback of long turns (LONG_TEMPERATURES).

    A file and a Realtime turn of the same audio are decoded differently on purpose, and may differ in casing,
    punctuation and now and then a word: a file with Whisper's timestamp tokens (its formats carry segment times,
    and json and verbose_json give the same words) over whole 30-s windows (faster-whisper's); a turn of up to 30 s
    without them, over its audio plus the final margin (asr_options: at the whole windows' WER in the margin study,
    2.4x faster, and its live transcripts draft its tokens). Measured on the sample and 14 sentences of the embedded
    voice (tiny.en int8, 2026-11-28): 4 of 15 differ, in casing or punctuation only ("The quick brown fox" / "the
    quick brown fox", "voice. And" / "voice and"); each knob alone (timestamp tokens, trimmed windows) makes some of
    them. Long turns (over 30 s) are decoded as files are (long_options), and give the file's words."""
    return {
        "task": task,
        "language": language,
        "initial_prompt": prompt,
        "best_of": 1,
        "temperatures": (temperature,) if temperature is not None else LONG_TEMPERATURES,
    }
