"""A response.create's options: the `response` object's overrides of the session's settings, checked into
ResponseOptions."""

from __future__ import annotations

from dataclasses import dataclass

from .audio_codec import AudioFormat, AudioFormatError, parse_format
from .config import AUDIO_MAX_OUTPUT_TOKENS, SessionConfig, default_max_tokens

__all__ = ["AUDIO_MAX_OUTPUT_TOKENS", "ResponseOptions", "response_options"]
from .protocol import ProtocolError, check_num, check_voice, short
from .tools import BARE, CallFormat, Tool, grammar, tool_settings


@dataclass(frozen=True)
class ResponseOptions:
    audio: bool  # speak the answer (else text only)
    instructions: str
    max_tokens: int
    say: str | None = None  # speechrt extension: speak this text verbatim, without the language model
    out_of_band: bool = False  # conversation: "none": the response's item is not added to the conversation
    metadata: tuple[tuple[str, str], ...] | None = None  # the client's labels, echoed in the response
    output_format: AudioFormat | None = None  # response.audio.output.format: this response's (None: the session's)
    tools: tuple[Tool, ...] = ()  # the session's, or response.tools
    tool_choice: str = "auto"
    call_format: CallFormat = BARE  # how the language model writes a call (its chat template's form)

    @property
    def grammar(self):
        """What the language model writes under: None (text), function calls (one or more: each its own
        function_call item), or calls or text (tools.grammar)."""
        return grammar(self.tools, self.tool_choice, self.call_format) if self.tools and self.say is None else None


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


def response_options(
    overrides, cfg: SessionConfig, available: dict | None = None, call_format: CallFormat = BARE
) -> ResponseOptions:
    """A `response.create`'s `response` object (overrides of the session's settings) -> ResponseOptions,
    or ProtocolError naming the field. `available`: the loaded models by family, to check a voice;
    `call_format`: the language model's (LMPipeline.call_format)."""
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
    # the response's max_output_tokens, else the session's, else the default for its output (about 30 s of speech)
    v = overrides.get("max_output_tokens", cfg.max_output_tokens)
    if v is None:
        max_tokens = default_max_tokens("audio" in mods)
    else:
        max_tokens = 1024 if v == "inf" else check_num(v, "response.max_output_tokens", 1, 4096, integer=True)
    tools, choice = tool_settings(overrides, "response", cfg.tools, cfg.tool_choice)
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
        tools,
        choice,
        call_format,
    )
