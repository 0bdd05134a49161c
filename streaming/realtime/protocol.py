"""The Realtime protocol's basics: ids, ProtocolError, and the checks of what a client sends (fields, model and
voice names), whose errors name the field and quote the value."""

from __future__ import annotations

import secrets

from speechrt.errors import UserError

from .. import model_names


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
    name = check_str(name, param)
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
    """The model a Realtime session names (session.model, or the URL's ?model=): a name of the language model
    (streaming.model_names: its own, 'speechrt', OpenAI's realtime models, which it answers for; on a
    transcription-only server too, whose sessions transcribe only); another name is a ProtocolError listing the
    valid ones."""
    name = check_str(name, param)
    if model_names.accepts(name, "lm", available):
        return name
    raise ProtocolError(
        model_names.unknown(name if len(name) <= 60 else name[:57] + "...", "lm", available, "Realtime"),
        "model_not_found",
        param,
    )


def check_bool(v, name):
    if not isinstance(v, bool):
        raise ProtocolError(f"{name} must be true or false, got {v!r}", "invalid_value", name)
    return v


def check_num(v, name, lo, hi, integer=False):
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (integer and not isinstance(v, int))
        or not lo <= v <= hi
    ):
        kind = "an integer" if integer else "a number"
        raise ProtocolError(f"{name} must be {kind} from {lo} to {hi}, got {short(v)}", "invalid_value", name)
    return v


def check_obj(v, name) -> dict:
    """An optional object field: {} when absent or null."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ProtocolError(f"{name} must be an object, got {short(v)}", "invalid_value", name)
    return v


def check_str(v, name, choices=None) -> str:
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
    return check_str(ev.get("item_id"), "item_id")
