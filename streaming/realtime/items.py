"""A transcript's conversation item: a client's audio items (conversation.item.create with input_audio) decoded,
transcribed and finished, the background run of an item's final transcript, and a failed one reported."""

from __future__ import annotations

import asyncio

import numpy as np

from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from ..engine import EngineStalled
from . import events as E
from .audio_codec import AudioFormatError, InputDecoder, b64decode
from .conversation import Item
from .extras import final_extras
from .protocol import ProtocolError


def item_audio(item: Item, fmt, max_seconds: float) -> np.ndarray | None:
    """The input_audio parts of a client's item (conversation.item_from_api), base64-decoded, decoded from the
    session's input format `fmt` to 16 kHz and joined (None if it has none); ProtocolError for what is not
    base64, audio the format cannot hold, or under 0.1 s or over `max_seconds`."""
    clips = [p for p in item.parts if p.type == "input_audio"]
    if not clips:
        return None
    try:
        audio = InputDecoder(fmt).decode(b"".join(b64decode(p.audio) for p in clips), last=True)
    except AudioFormatError as e:
        raise ProtocolError(f"{e} (item.content input_audio)", "invalid_audio", "item.content.audio") from None
    if not RATE // 10 <= len(audio) <= max_seconds * RATE:
        raise ProtocolError(
            f"an item's audio must hold 0.1 to {max_seconds:g} s, got {len(audio) / RATE:.2f} s",
            "invalid_audio",
            "item.content.audio",
        )
    for p in clips:
        p.audio = None
    item.audio_ms = len(audio) * 1000 // RATE  # (its audio tokens in a response's usage: events.usage)
    item.transcribed = asyncio.Event()  # (before the item is added: a response from then on waits for it)
    return audio


def in_background(session, item: Item, transcript) -> None:
    """Run `transcript`, the coroutine that makes `item`'s final transcript, as essential session work; the
    item's `transcribed` event is set when it ends, however it ends, so a response waiting for it goes on."""
    session.spawn(transcript, essential=True).add_done_callback(lambda _t: item.transcribed.set())


async def finish_item(session, item: Item, audio: np.ndarray | None):
    """A client's item, just added: conversation.item.done now for a text item; for one with audio (its
    item_audio), once its transcript is in (a response waits for that, as for committed audio)."""
    if audio is None:
        return await session.send(E.item_done(item.to_api()))
    in_background(session, item, transcribe_item(session, item, audio))


async def transcribe_item(session, item: Item, audio: np.ndarray):
    """The final transcript of a client's audio item (conversation.item.create with input_audio): on its
    first audio part, then ...transcription.completed and conversation.item.done."""
    engine = session.server.engine
    try:
        r = await engine.wait(
            engine.transcribe(audio, key=session.id, options=session.asr_options),
            session.server.options.stall_timeout,
            "asr",
        )
    except EngineStalled as e:
        session.server.counters.stalls += 1
        return await failed(session, item, f"{e}; the item was not transcribed", "engine_stalled")
    except Exception as e:  # noqa: BLE001 - a failed step: this item is told, the session goes on
        return await failed(session, item, f"transcription failed: {type(e).__name__}: {e}", "server_error")
    text = r.text.strip() if r is not None else ""
    next(p for p in item.parts if p.type == "input_audio").text = text
    logprobs, words = await final_extras(session, engine, r, audio) if r is not None else (None, None)
    await session.send(E.transcription_completed(item.id, text, len(audio) / RATE, logprobs, words))
    await session.send(E.item_done(item.to_api()))


async def failed(session, item: Item, message: str, code: str):
    """The transcript of `item` failed: the session is told (and the item is incomplete)."""
    session.ahead.drop(item.id)
    item.status = "incomplete"
    await session.send(E.transcription_failed(item.id, message, code))
    await session.error(message, code, type="server_error")
    await session.send(E.item_done(item.to_api()))
