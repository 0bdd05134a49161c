"""Transcript formats, written once for every user: the REST endpoint (/v1/audio/transcriptions, OpenAI's
`response_format`) and `speechrt transcribe --format`.

    render(transcript, "srt")           # -> the file's text
    MEDIA_TYPES["vtt"]                  # -> "text/vtt; charset=utf-8"

json is OpenAI's `{"text": ...}`; verbose_json is OpenAI's verbose form (task, language, duration, text,
segments with their timing and decoding statistics, and `words` when the segments carry word timings).
"""

from __future__ import annotations

import json

from speechrt.errors import UserError

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")
ALIASES = {"txt": "text"}  # the CLI's file-extension names
EXTENSIONS = {"text": "txt", "json": "json", "verbose_json": "json", "srt": "srt", "vtt": "vtt"}
MEDIA_TYPES = {
    "text": "text/plain; charset=utf-8",
    "json": "application/json",
    "verbose_json": "application/json",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}

__all__ = ["FORMATS", "EXTENSIONS", "MEDIA_TYPES", "check_format", "render", "to_openai", "timestamp"]


def check_format(name: str) -> str:
    """The canonical name of a transcript format ('txt' is 'text'), or a UserError naming the valid ones."""
    fmt = ALIASES.get(name, name)
    if fmt not in FORMATS:
        raise UserError(f"unknown transcript format {name!r}; valid: {', '.join(FORMATS)} (txt = text)")
    return fmt


def timestamp(seconds: float, sep: str = ".") -> str:
    """HH:MM:SS.mmm (vtt) or, with sep=',', HH:MM:SS,mmm (srt)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def words_of(transcript) -> list[dict]:
    """The word timings of every segment (segments carry `words` when word timestamps were asked for)."""
    return [
        {"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)}
        for s in transcript.segments
        for w in s.words
    ]


def to_openai(transcript, verbose: bool, task: str = "transcribe") -> dict:
    """OpenAI's transcription object: {"text"} or, `verbose`, the verbose_json object."""
    if not verbose:
        return {"text": transcript.text}
    out = {
        "task": task,
        "language": transcript.language,
        # beyond OpenAI's object: the detected language's probability (1.0 when it was given), as faster-whisper
        "language_probability": round(transcript.language_probability, 4),
        "duration": round(transcript.duration, 3),
        "text": transcript.text,
        "segments": [
            {
                "id": s.id,
                "seek": 0,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": list(s.tokens),
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
                # beyond OpenAI's object: each segment's words with their probabilities
                **({"words": [w.to_dict() for w in s.words]} if s.words else {}),
            }
            for s in transcript.segments
        ],
    }
    words = words_of(transcript)
    if words:
        out["words"] = words
    return out


def _cues(transcript, sep: str) -> list[str]:
    return [
        f"{timestamp(s.start, sep)} --> {timestamp(s.end, sep)}\n{s.text.strip()}\n"
        for s in transcript.segments
        if s.text.strip()
    ]


def render(transcript, fmt: str, task: str = "transcribe") -> str:
    """`transcript` (a Transcript) in format `fmt` (see FORMATS), as the text of a file or response body."""
    fmt = check_format(fmt)
    if fmt == "text":
        return transcript.text.strip() + "\n"
    if fmt in ("json", "verbose_json"):
        return json.dumps(to_openai(transcript, fmt == "verbose_json", task), ensure_ascii=False)
    if fmt == "srt":
        return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(_cues(transcript, ","), 1))
    return "WEBVTT\n\n" + "\n".join(_cues(transcript, "."))
