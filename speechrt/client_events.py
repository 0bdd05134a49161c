"""The Realtime API's server events as speechrt's Python SDK types them (parse_event), and a response read from
them to its end (read_reply)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Event:
    type: str
    raw: dict = field(repr=False)

    def __getattr__(self, name):
        try:
            return self.__dict__["raw"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class ErrorEvent(Event):
    code: str = ""
    message: str = ""


@dataclass
class SpeechStarted(Event):
    audio_start_ms: int = 0
    item_id: str = ""


@dataclass
class SpeechStopped(Event):
    audio_end_ms: int = 0
    item_id: str = ""


@dataclass
class TranscriptDelta(Event):
    item_id: str = ""
    delta: str = ""


@dataclass
class TranscriptCompleted(Event):
    item_id: str = ""
    transcript: str = ""


@dataclass
class AudioDelta(Event):
    response_id: str = ""
    item_id: str = ""
    audio: np.ndarray = field(default=None, repr=False)  # float32 at 24 kHz


@dataclass
class TextDelta(Event):
    response_id: str = ""
    item_id: str = ""
    delta: str = ""


@dataclass
class ResponseDone(Event):
    response_id: str = ""
    status: str = ""


class RealtimeError(RuntimeError):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def parse_event(d: dict) -> Event:
    t = d.get("type", "")
    if t == "error":
        e = d.get("error") or {}
        return ErrorEvent(t, d, e.get("code") or "", e.get("message") or "")
    if t == "input_audio_buffer.speech_started":
        return SpeechStarted(t, d, d.get("audio_start_ms", 0), d.get("item_id", ""))
    if t == "input_audio_buffer.speech_stopped":
        return SpeechStopped(t, d, d.get("audio_end_ms", 0), d.get("item_id", ""))
    if t == "conversation.item.input_audio_transcription.delta":
        return TranscriptDelta(t, d, d.get("item_id", ""), d.get("delta") or "")
    if t == "conversation.item.input_audio_transcription.completed":
        return TranscriptCompleted(t, d, d.get("item_id", ""), d.get("transcript") or "")
    if t in ("response.output_audio.delta", "response.audio.delta"):
        pcm = np.frombuffer(base64.b64decode(d.get("delta", "")), "<i2").astype(np.float32) / 32768.0
        return AudioDelta(t, d, d.get("response_id", ""), d.get("item_id", ""), pcm)
    if t in (
        "response.output_audio_transcript.delta",
        "response.audio_transcript.delta",
        "response.output_text.delta",
        "response.text.delta",
    ):
        return TextDelta(t, d, d.get("response_id", ""), d.get("item_id", ""), d.get("delta") or "")
    if t == "response.done":
        r = d.get("response") or {}
        return ResponseDone(t, d, r.get("id", ""), r.get("status", ""))
    return Event(t, d)


@dataclass
class Reply:
    """A finished response: its text (transcript of the audio, or the text) and audio (24 kHz float32)."""

    transcript: str
    audio: np.ndarray
    status: str
    user_transcript: str = ""


async def read_reply(next_event, user_transcript: str = "") -> Reply:
    """The next response, to its response.done, from `next_event(timeout)` (a connection's events). An error before
    it begins raises at once; a response that fails raises after its response.done, so that none of its events is
    left for the next call."""
    text, audio, status, failure, begun = [], [], "", None, False
    while True:
        ev = await next_event(120)
        if ev is None:
            raise ConnectionError("the server closed the connection")
        if isinstance(ev, ErrorEvent):
            if not begun:
                raise RealtimeError(ev.code, ev.message)
            failure = failure or ev
        elif ev.type == "response.created":
            begun = True
        elif isinstance(ev, TranscriptCompleted):
            user_transcript = ev.transcript
        elif isinstance(ev, TextDelta):
            text.append(ev.delta)
        elif isinstance(ev, AudioDelta):
            audio.append(ev.audio)
        elif isinstance(ev, ResponseDone):
            status = ev.status
            break
    if failure is not None:
        raise RealtimeError(failure.code, failure.message)
    a = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return Reply("".join(text), a, status, user_transcript)
