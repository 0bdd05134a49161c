"""The OpenAI Realtime API as served by speechrt: session configuration (GA and beta shapes), event
names (GA, with the older beta names accepted from clients and optionally emitted), ids, errors, and the
payload of every server event (one function per event type)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from speechrt.errors import UserError
from speechrt.models.registry import DEFAULTS

from .audio_codec import AudioFormat, AudioFormatError, parse_format
from .vad import EAGERNESS, ServerVadConfig

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


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class ProtocolError(UserError):
    """A client event the server cannot act on. `code` and `param` go into the error event."""

    def __init__(
        self, message: str, code: str = "invalid_request", param: str | None = None, type: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.code, self.param, self.type = code, param, type


# OpenAI's voice names, accepted for the loaded voice so that code written for OpenAI runs as is
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


def check_voice(name, available: dict, param: str) -> str:
    """A voice a session or request may name -> the loaded voice that speaks for it: the loaded voices by
    name, OpenAI's voice names for the first; another name is a ProtocolError listing the valid ones."""
    name = _str(name, param)
    if name in available["tts"]:
        return name
    if name in OPENAI_VOICES:  # (a transcription-only server has no voice: the name stays, nothing speaks)
        return available["tts"][0] if available["tts"] else name
    raise ProtocolError(
        f"voice {short(name)} is not available; valid: {', '.join(available['tts'] + list(OPENAI_VOICES))} "
        "(OpenAI's voice names speak with the loaded voice)",
        "invalid_value",
        param,
    )


def check_session_model(name, available: dict, param: str = "session.model") -> str:
    """The model a Realtime session names (session.model, or the URL's ?model=): 'speechrt', the loaded
    language model, or one of OpenAI's realtime models (gpt-realtime, gpt-4o-realtime-preview, ...), which
    the loaded language model answers for; another name is a ProtocolError listing the valid ones."""
    name = _str(name, param)
    lm = available.get("lm") or []
    if name == "speechrt" or name in lm or (name.startswith("gpt-") and "realtime" in name):
        return name
    answers = f"the language model here is {lm[0]}" if lm else "this server runs no language model"
    raise ProtocolError(
        f"unknown model {short(name)}; {answers}: name it, 'speechrt', or one of OpenAI's realtime "
        "models (gpt-realtime, gpt-4o-realtime-preview, ...), which it answers for",
        "model_not_found",
        param,
    )


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
# output item with one content part: output_index and content_index are 0.


def session_created(session: dict, replica: str | None = None) -> dict:
    """`replica` (speechrt extension, under "speechrt"): the Ray Serve replica the session is pinned to."""
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


def output_item_added(response_id: str, item: dict) -> dict:
    return {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item}


def output_item_done(response_id: str, item: dict) -> dict:
    return {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item}


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


@dataclass(frozen=True)
class SessionConfig:
    type: str = "realtime"  # realtime (conversation) | transcription
    model: str = "speechrt"
    instructions: str = "You are a helpful, concise voice assistant. Answer in one or two short sentences."
    output_modalities: tuple[str, ...] = ("audio",)
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    turn_detection: ServerVadConfig | None = field(default_factory=ServerVadConfig)
    transcription_model: str = DEFAULTS["asr"]
    language: str | None = None
    prompt: str | None = None
    voice: str = DEFAULTS["tts"]
    speed: float = 1.0
    max_output_tokens: int = 256
    temperature: float = 0.0
    beta: bool = False  # emit the beta event names (a client used them)
    # a final transcript's extras, computed only for sessions that ask (one more encoder/decoder pass):
    logprobs: bool = False  # include: ["item.input_audio_transcription.logprobs"]
    word_timestamps: bool = False  # speechrt extension: transcription.speechrt_word_timestamps

    @property
    def answers_turns(self) -> bool:
        """Does the server answer each turn turn detection ends (a conversation session with create_response)?"""
        td = self.turn_detection
        return self.type == "realtime" and td is not None and td.create_response

    def to_api(self, session_id: str) -> dict:
        td = self.turn_detection.to_api() if self.turn_detection else None
        s = {
            "id": session_id,
            "object": "realtime.session",
            "type": self.type,
            "model": self.model,
            "audio": {
                "input": {
                    "format": self.input_format.to_api(),
                    "turn_detection": td,
                    "transcription": {
                        "model": self.transcription_model,
                        "language": self.language,
                        "prompt": self.prompt,
                        "speechrt_word_timestamps": self.word_timestamps,
                    },
                }
            },
            "include": [LOGPROBS_INCLUDE] if self.logprobs else [],
        }
        if self.type == "realtime":
            s["instructions"] = self.instructions
            s["output_modalities"] = list(self.output_modalities)
            s["max_output_tokens"] = self.max_output_tokens
            s["audio"]["output"] = {"format": self.output_format.to_api(), "voice": self.voice, "speed": self.speed}
        return s


@dataclass(frozen=True)
class ResponseOptions:
    audio: bool  # speak the answer (else text only)
    instructions: str
    max_tokens: int
    say: str | None = None  # speechrt extension: speak this text verbatim, without the language model
    out_of_band: bool = False  # conversation: "none": the response's item is not added to the conversation
    metadata: tuple[tuple[str, str], ...] | None = None  # the client's labels, echoed in the response
    output_format: AudioFormat | None = None  # response.audio.output.format: this response's (None: the session's)


def _no_tools(obj: dict, name: str) -> None:
    """Function calling is not available: tools in a session or response are an error (an empty list passes),
    not an agent that silently never calls them."""
    if obj.get("tools"):
        raise ProtocolError(
            f"{name}.tools: function calling is not supported by this server's language model; send "
            "tools: [] or leave it out",
            "invalid_value",
            f"{name}.tools",
        )


def _metadata(meta) -> tuple[tuple[str, str], ...] | None:
    """response.metadata: at most 16 string pairs (keys up to 64 characters, values up to 512), as OpenAI's."""
    if meta is None:
        return None
    if (
        not isinstance(meta, dict)
        or len(meta) > 16
        or any(not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in meta.items())
    ):
        raise ProtocolError(
            f"response.metadata must be an object of at most 16 string values (keys up to 64 characters, "
            f"values up to 512), got {short(meta)}",
            "invalid_value",
            "response.metadata",
        )
    return tuple(meta.items())


def _response_output(overrides: dict, available: dict | None) -> AudioFormat | None:
    """response.audio.output: this response's audio format (None: the session's), and its voice checked (the loaded
    voice speaks for OpenAI's names, as in session.update)."""
    audio = overrides.get("audio")
    if audio is None:
        return None
    out = audio.get("output") if isinstance(audio, dict) else None
    if not isinstance(audio, dict) or not isinstance(out or {}, dict):
        raise ProtocolError(
            "response.audio must be {'output': {'format': ..., 'voice': ...}}", "invalid_value", "response.audio"
        )
    out = out or {}
    if "voice" in out and available is not None:
        check_voice(out["voice"], available, "response.audio.output.voice")
    try:
        return parse_format(out["format"]) if "format" in out else None
    except AudioFormatError as e:
        raise ProtocolError(str(e), "invalid_audio_format", "response.audio.output.format") from None


def response_options(overrides, cfg: SessionConfig, available: dict | None = None) -> ResponseOptions:
    """A `response.create`'s `response` object (overrides of the session's settings) -> ResponseOptions,
    or ProtocolError naming the field. `available`: the loaded models by family, to check a voice."""
    if not isinstance(overrides, dict):
        raise ProtocolError("'response' must be an object", "invalid_value", "response")
    mods = overrides.get("output_modalities", overrides.get("modalities")) or list(cfg.output_modalities)
    if not isinstance(mods, list) or not mods or any(m not in ("text", "audio") for m in mods):
        raise ProtocolError(
            f"output_modalities must be ['audio'] or ['text'], got {mods!r}",
            "invalid_value",
            "response.output_modalities",
        )
    instructions = overrides.get("instructions", cfg.instructions)
    if not isinstance(instructions, str):
        raise ProtocolError("response.instructions must be a string", "invalid_value", "response.instructions")
    say = overrides.get("speechrt_say")
    if say is not None and (not isinstance(say, str) or not say.strip()):
        raise ProtocolError("speechrt_say must be a non-empty string", "invalid_value", "response.speechrt_say")
    v = overrides.get("max_output_tokens", cfg.max_output_tokens)
    max_tokens = 1024 if v == "inf" else _num(v, "response.max_output_tokens", 1, 4096, integer=True)
    _no_tools(overrides, "response")
    conversation = overrides.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError(
            f"response.conversation must be 'auto' or 'none' (an out-of-band response, not added to "
            f"the conversation), got {short(conversation)}",
            "invalid_value",
            "response.conversation",
        )
    if overrides.get("input") is not None and not isinstance(overrides["input"], list):
        raise ProtocolError(
            "response.input must be a list of items: messages, or {'type': 'item_reference', 'id': ...}",
            "invalid_value",
            "response.input",
        )
    return ResponseOptions(
        "audio" in mods,
        instructions,
        max_tokens,
        say,
        conversation == "none",
        _metadata(overrides.get("metadata")),
        _response_output(overrides, available),
    )


def _bool(v, name):
    if not isinstance(v, bool):
        raise ProtocolError(f"{name} must be true or false, got {v!r}", "invalid_value", name)
    return v


def _num(v, name, lo, hi, integer=False):
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (integer and not isinstance(v, int))
        or not lo <= v <= hi
    ):
        kind = "an integer" if integer else "a number"
        raise ProtocolError(f"{name} must be {kind} from {lo} to {hi}, got {short(v)}", "invalid_value", name)
    return v


def _obj(v, name) -> dict:
    """An optional object field: {} when absent or null."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ProtocolError(f"{name} must be an object, got {short(v)}", "invalid_value", name)
    return v


def _str(v, name, choices=None) -> str:
    if not isinstance(v, str) or (choices is not None and v not in choices):
        valid = f"one of {', '.join(choices)}" if choices is not None else "a string"
        raise ProtocolError(f"{name} must be {valid}, got {short(v)}", "invalid_value", name)
    return v


def short(v) -> str:
    """repr(v), cut to 80 characters (error messages quote what the client sent)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def item_id(ev: dict) -> str:
    """The `item_id` of an event about one conversation item."""
    return _str(ev.get("item_id"), "item_id")


def _turn_detection(td, current: ServerVadConfig | None, name: str) -> ServerVadConfig | None:
    if td is None:
        return None
    if not isinstance(td, dict):
        raise ProtocolError(f"{name} must be an object or null", "invalid_value", name)
    t = td.get("type", "server_vad")
    if t not in ("server_vad", "semantic_vad"):
        raise ProtocolError(
            f"unsupported turn detection {short(t)}; valid: server_vad, semantic_vad, or null",
            "invalid_value",
            f"{name}.type",
        )
    base = current or ServerVadConfig()
    kw = {"type": t}
    if t == "semantic_vad":
        e = td.get("eagerness")
        kw["eagerness"] = "auto" if e is None else _str(e, f"{name}.eagerness", tuple(EAGERNESS))
    if td.get("threshold") is not None:
        kw["threshold"] = float(_num(td["threshold"], f"{name}.threshold", 0.0, 1.0))
    for k in ("prefix_padding_ms", "silence_duration_ms"):
        if td.get(k) is not None:
            kw[k] = _num(td[k], f"{name}.{k}", 0, 10000, integer=True)
    for k in ("create_response", "interrupt_response"):
        if td.get(k) is not None:
            kw[k] = _bool(td[k], f"{name}.{k}")
    return replace(base, **kw)


def _transcription(tr, available: dict, name: str) -> dict:
    """The input transcription settings -> SessionConfig fields."""
    kw = {}
    m = tr.get("model")
    if m is not None:
        m = _str(m, f"{name}.model")
        # OpenAI model names (gpt-4o-transcribe, whisper-1) map to the loaded recognizer
        if m not in available["asr"] and not m.startswith(("whisper", "gpt-")):
            raise ProtocolError(
                f"unknown transcription model {short(m)}; this server runs: {', '.join(available['asr'])}",
                "invalid_value",
                f"{name}.model",
            )
        kw["transcription_model"] = m if m in available["asr"] else available["asr"][0]
    if tr.get("language") is not None:
        kw["language"] = _str(tr["language"], f"{name}.language")
    if tr.get("speechrt_word_timestamps") is not None:
        kw["word_timestamps"] = _bool(tr["speechrt_word_timestamps"], f"{name}.speechrt_word_timestamps")
    if tr.get("prompt") is not None:
        kw["prompt"] = _str(tr["prompt"], f"{name}.prompt")
        if len(kw["prompt"]) > 4096:
            raise ProtocolError(
                f"{name}.prompt has {len(kw['prompt'])} characters; at most 4096", "invalid_value", f"{name}.prompt"
            )
    return kw


LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


def apply_session_update(cfg: SessionConfig, s: dict, available: dict) -> SessionConfig:
    """Apply a `session.update` payload (GA `audio.input...` layout or the beta flat layout) to cfg.
    `available` maps 'asr'/'tts'/'lm' to the model names this server has loaded. Unknown fields are ignored
    (tracing, tool_choice, ...), as are empty tools; known fields with bad values, and tools, raise
    ProtocolError naming the field."""
    if not isinstance(s, dict):
        raise ProtocolError("'session' must be an object", "invalid_value", "session")
    kw = {}
    try:
        if "type" in s:
            kw["type"] = _str(s["type"], "session.type", ("realtime", "transcription"))
        if "model" in s:
            kw["model"] = check_session_model(s["model"], available)
        _no_tools(s, "session")
        if "instructions" in s:
            kw["instructions"] = _str(s["instructions"], "session.instructions")
        mods = s.get("output_modalities", s.get("modalities"))
        if mods is not None:
            if not isinstance(mods, list) or not mods or any(m not in ("text", "audio") for m in mods):
                raise ProtocolError(
                    f"output_modalities must be ['audio'] or ['text'], got {short(mods)}",
                    "invalid_value",
                    "session.output_modalities",
                )
            kw["output_modalities"] = ("audio",) if "audio" in mods else ("text",)
        if "max_output_tokens" in s or "max_response_output_tokens" in s:
            v = s.get("max_output_tokens", s.get("max_response_output_tokens"))
            kw["max_output_tokens"] = (
                1024 if v == "inf" else _num(v, "session.max_output_tokens", 1, 4096, integer=True)
            )
        if "include" in s:
            inc = s["include"] or []
            if not isinstance(inc, list) or any(i != LOGPROBS_INCLUDE for i in inc):
                raise ProtocolError(
                    f"session.include must be a list of {LOGPROBS_INCLUDE!r} (the one value this server "
                    f"knows), got {short(inc)}",
                    "invalid_value",
                    "session.include",
                )
            kw["logprobs"] = LOGPROBS_INCLUDE in inc
        if "temperature" in s:
            kw["temperature"] = float(_num(s["temperature"], "session.temperature", 0.0, 2.0))
        audio = _obj(s.get("audio"), "session.audio")
        inp = _obj(audio.get("input"), "session.audio.input")
        out = _obj(audio.get("output"), "session.audio.output")
        # input format: GA audio.input.format, beta input_audio_format
        if "format" in inp:
            kw["input_format"] = parse_format(inp["format"])
        elif "input_audio_format" in s:
            kw["input_format"] = parse_format(s["input_audio_format"])
        if "format" in out:
            kw["output_format"] = parse_format(out["format"])
        elif "output_audio_format" in s:
            kw["output_format"] = parse_format(s["output_audio_format"])
        if "turn_detection" in inp:
            kw["turn_detection"] = _turn_detection(
                inp["turn_detection"], cfg.turn_detection, "session.audio.input.turn_detection"
            )
        elif "turn_detection" in s:
            kw["turn_detection"] = _turn_detection(s["turn_detection"], cfg.turn_detection, "session.turn_detection")
        tr_name = "session.audio.input.transcription" if "transcription" in inp else "session.input_audio_transcription"
        kw.update(
            _transcription(
                _obj(inp.get("transcription", s.get("input_audio_transcription")), tr_name), available, tr_name
            )
        )
        voice = out.get("voice", s.get("voice"))
        if voice is not None:
            kw["voice"] = check_voice(voice, available, "session.audio.output.voice")
        if "speed" in out:
            kw["speed"] = float(_num(out["speed"], "session.audio.output.speed", 0.25, 4.0))
    except AudioFormatError as e:
        raise ProtocolError(str(e), "invalid_audio_format", "session.audio.format") from None
    return replace(cfg, **kw)
