"""The Realtime API's events: the client events served, the names of server events (GA, with the older beta
names a beta client gets), and the payload of every server event (one function per event type)."""

from __future__ import annotations

from .protocol import new_id

CLIENT_EVENTS = (
    "session.update",
    "transcription_session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.delete",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
)

# GA name -> beta name, for servers events that were renamed when the API left beta
BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}


def error_event(
    message: str, code: str, type: str = "invalid_request_error", param: str | None = None, event_id: str | None = None
) -> dict:
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {"type": type, "code": code, "message": message, "param": param, "event_id": event_id},
    }


# -- server events ------------------------------------------------------------------------------------
# Items and parts are passed in their wire form (conversation.Item.to_api()). Responses here have one
# output item with one content part (output_index and content_index are 0), except those that call functions in
# parallel: one function_call item each, output_index 0, 1, ...


def session_created(session: dict, replica: str | None = None) -> dict:
    """`replica` (speechrt extension, under "speechrt"): the Ray Serve replica or the worker process (`--workers`)
    the session is pinned to."""
    ev = {"type": "session.created", "session": session}
    if replica is not None:
        ev["speechrt"] = {"replica": replica}
    return ev


def session_updated(session: dict) -> dict:
    return {"type": "session.updated", "session": session}


def speech_started(audio_start_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_start_ms, "item_id": item_id}


def speech_stopped(audio_end_ms: int, item_id: str) -> dict:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms, "item_id": item_id}


def buffer_committed(item_id: str, previous_item_id: str | None) -> dict:
    return {"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": previous_item_id}


def buffer_cleared() -> dict:
    return {"type": "input_audio_buffer.cleared"}


def output_audio_buffer_cleared(response_id: str | None) -> dict:
    return {"type": "output_audio_buffer.cleared", "response_id": response_id}


def transcription_delta(item_id: str, delta: str) -> dict:
    return {
        "type": "conversation.item.input_audio_transcription.delta",
        "item_id": item_id,
        "content_index": 0,
        "delta": delta,
    }


def transcription_completed(
    item_id: str, transcript: str, seconds: float, logprobs: list[dict] | None = None, words: list[dict] | None = None
) -> dict:
    """`logprobs` ([{token, logprob, bytes}]) for sessions that include them; `words` ([{word, start, end,
    probability}], seconds from the start of the item's audio) under the `speechrt` extension field."""
    ev = {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": item_id,
        "content_index": 0,
        "transcript": transcript,
        "usage": {"type": "duration", "seconds": round(seconds, 3)},
    }
    if logprobs is not None:
        ev["logprobs"] = logprobs
    if words is not None:
        ev["speechrt"] = {"words": words}
    return ev


def transcription_failed(item_id: str, message: str, code: str) -> dict:
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": 0,
        "error": {"type": "transcription_error", "code": code, "message": message, "param": None},
    }


def item_added(item: dict, previous_item_id: str | None) -> dict:
    return {"type": "conversation.item.added", "item": item, "previous_item_id": previous_item_id}


def item_done(item: dict) -> dict:
    return {"type": "conversation.item.done", "item": item}


def item_deleted(item_id: str) -> dict:
    return {"type": "conversation.item.deleted", "item_id": item_id}


def item_retrieved(item: dict) -> dict:
    return {"type": "conversation.item.retrieved", "item": item}


def item_truncated(item_id: str, content_index: int, audio_end_ms: int) -> dict:
    return {
        "type": "conversation.item.truncated",
        "item_id": item_id,
        "content_index": content_index,
        "audio_end_ms": audio_end_ms,
    }


def response_created(response: dict) -> dict:
    return {"type": "response.created", "response": response}


def response_done(response: dict) -> dict:
    return {"type": "response.done", "response": response}


AUDIO_TOKEN_MS = 20  # an audio token: 20 ms of audio, one position of Whisper's encoder (1500 per 30-s window)


def usage(prompt: int, cached: int, written: int, audio_in_ms: int, audio_out_ms: int) -> dict:
    """A response's usage in OpenAI's shape. Text tokens are the language model's: `prompt` tokens read (the
    instructions and the conversation's text, transcripts of audio items included), `cached` of them found in its
    cache from the conversation's earlier turns, `written` tokens generated. Audio tokens are 20-ms units
    (AUDIO_TOKEN_MS): in, the audio of the user's audio items in the response's input (what the transcriber read to
    make their transcripts); out, the audio of the answer sent."""
    audio_in, audio_out = -(-audio_in_ms // AUDIO_TOKEN_MS), -(-audio_out_ms // AUDIO_TOKEN_MS)
    return {
        "total_tokens": prompt + audio_in + written + audio_out,
        "input_tokens": prompt + audio_in,
        "output_tokens": written + audio_out,
        "input_token_details": {
            "text_tokens": prompt,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": written, "audio_tokens": audio_out},
    }


def output_item_added(response_id: str, item: dict, index: int = 0) -> dict:
    return {"type": "response.output_item.added", "response_id": response_id, "output_index": index, "item": item}


def output_item_done(response_id: str, item: dict, index: int = 0) -> dict:
    return {"type": "response.output_item.done", "response_id": response_id, "output_index": index, "item": item}


def _in_part(type_: str, response_id: str, item_id: str, **fields) -> dict:
    """An event about the one content part of a response's output item."""
    return {
        "type": type_,
        "response_id": response_id,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        **fields,
    }


def content_part_added(response_id: str, item_id: str, part: dict) -> dict:
    return _in_part("response.content_part.added", response_id, item_id, part=part)


def content_part_done(response_id: str, item_id: str, part: dict) -> dict:
    return _in_part("response.content_part.done", response_id, item_id, part=part)


def output_text_delta(response_id: str, item_id: str, delta: str) -> dict:
    return _in_part("response.output_text.delta", response_id, item_id, delta=delta)


def output_text_done(response_id: str, item_id: str, text: str) -> dict:
    return _in_part("response.output_text.done", response_id, item_id, text=text)


def output_audio_delta(response_id: str, item_id: str, b64: str) -> dict:
    return _in_part("response.output_audio.delta", response_id, item_id, delta=b64)


def output_audio_done(response_id: str, item_id: str) -> dict:
    return _in_part("response.output_audio.done", response_id, item_id)


def output_audio_transcript_delta(response_id: str, item_id: str, delta: str) -> dict:
    return _in_part("response.output_audio_transcript.delta", response_id, item_id, delta=delta)


def output_audio_transcript_done(response_id: str, item_id: str, transcript: str) -> dict:
    return _in_part("response.output_audio_transcript.done", response_id, item_id, transcript=transcript)


def function_call_arguments_delta(response_id: str, item_id: str, call_id: str, delta: str, index: int = 0) -> dict:
    return {
        "type": "response.function_call_arguments.delta",
        "response_id": response_id,
        "item_id": item_id,
        "output_index": index,
        "call_id": call_id,
        "delta": delta,
    }


def function_call_arguments_done(
    response_id: str, item_id: str, call_id: str, name: str, arguments: str, index: int = 0
) -> dict:
    return {
        "type": "response.function_call_arguments.done",
        "response_id": response_id,
        "item_id": item_id,
        "output_index": index,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
