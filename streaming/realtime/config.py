"""A Realtime session's configuration: SessionConfig, its wire form (GA shape) and session.update applied to it
(GA `audio.input...` and beta flat shapes), and the checks of what a server can serve."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from speechrt.errors import UserError
from speechrt.models.registry import DEFAULTS

from .. import model_names
from .audio_codec import AudioFormat, AudioFormatError, parse_format
from .protocol import (
    ProtocolError,
    check_bool,
    check_num,
    check_obj,
    check_session_model,
    check_str,
    check_voice,
    short,
)
from .tools import Tool, tool_settings, tools_api
from .vad import EAGERNESS, ServerVadConfig


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
    # the client's max_output_tokens; None (not set): each response's default, by its output (response_options.py:
    # 256 tokens for text, AUDIO_MAX_OUTPUT_TOKENS, about 30 s of speech, for audio)
    max_output_tokens: int | None = None
    temperature: float = 0.0
    beta: bool = False  # emit the beta event names (a client used them)
    # a final transcript's extras, computed only for sessions that ask (one more encoder/decoder pass):
    logprobs: bool = False  # include: ["item.input_audio_transcription.logprobs"]
    word_timestamps: bool = False  # speechrt extension: transcription.speechrt_word_timestamps
    # function calling (tools.py): the functions the model may call, and OpenAI's tool_choice ('auto', 'none',
    # 'required' or a function's name)
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"

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
            s["max_output_tokens"] = self.max_output_tokens or default_max_tokens("audio" in self.output_modalities)
            s.update(tools_api(self.tools, self.tool_choice))
            s["audio"]["output"] = {"format": self.output_format.to_api(), "voice": self.voice, "speed": self.speed}
        return s


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
        kw["eagerness"] = "auto" if e is None else check_str(e, f"{name}.eagerness", tuple(EAGERNESS))
    if td.get("threshold") is not None:
        kw["threshold"] = float(check_num(td["threshold"], f"{name}.threshold", 0.0, 1.0))
    for k in ("prefix_padding_ms", "silence_duration_ms"):
        if td.get(k) is not None:
            kw[k] = check_num(td[k], f"{name}.{k}", 0, 10000, integer=True)
    for k in ("create_response", "interrupt_response"):
        if td.get(k) is not None:
            kw[k] = check_bool(td[k], f"{name}.{k}")
    return replace(base, **kw)


def _transcription(tr, available: dict, name: str) -> dict:
    """The input transcription settings -> SessionConfig fields."""
    kw = {}
    m = tr.get("model")
    if m is not None:
        m = check_str(m, f"{name}.model")
        # 'speechrt' and OpenAI's names (gpt-4o-transcribe, whisper-1) stand for the loaded recognizer
        if not model_names.accepts(m, "asr", available):
            raise ProtocolError(
                model_names.unknown(m if len(m) <= 60 else m[:57] + "...", "asr", available, "transcription"),
                "invalid_value",
                f"{name}.model",
            )
        kw["transcription_model"] = m if m in available["asr"] else available["asr"][0]
    if tr.get("language") is not None:
        kw["language"] = check_str(tr["language"], f"{name}.language")
    if tr.get("speechrt_word_timestamps") is not None:
        kw["word_timestamps"] = check_bool(tr["speechrt_word_timestamps"], f"{name}.speechrt_word_timestamps")
    if tr.get("prompt") is not None:
        kw["prompt"] = check_str(tr["prompt"], f"{name}.prompt")
        if len(kw["prompt"]) > 4096:
            raise ProtocolError(
                f"{name}.prompt has {len(kw['prompt'])} characters; at most 4096", "invalid_value", f"{name}.prompt"
            )
    return kw


LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"

TEXT_MAX_OUTPUT_TOKENS = 256  # a text response's bound where the client set none
# a spoken response's bound where the client set none: about 30 s of speech. The default voice (Piper joe, speed 1)
# speaks 3.5 words a second and SmolLM2's tokenizer writes 1.16 tokens a word (measured on passage.txt and on
# short answers: 4.05-4.15 tokens a second of speech), so 30 s is ~122 tokens
AUDIO_MAX_OUTPUT_TOKENS = 120


def default_max_tokens(audio: bool) -> int:
    """A response's max_output_tokens where neither the session nor the response set one."""
    return AUDIO_MAX_OUTPUT_TOKENS if audio else TEXT_MAX_OUTPUT_TOKENS


def apply_session_update(cfg: SessionConfig, s: dict, available: dict) -> SessionConfig:
    """Apply a `session.update` payload (GA `audio.input...` layout or the beta flat layout) to cfg.
    `available` maps 'asr'/'tts'/'lm' to the model names this server has loaded. Unknown fields are ignored
    (tracing, ...); known fields with bad values raise ProtocolError naming the field."""
    if not isinstance(s, dict):
        raise ProtocolError("'session' must be an object", "invalid_value", "session")
    kw = {}
    try:
        if "type" in s:
            kw["type"] = check_str(s["type"], "session.type", ("realtime", "transcription"))
        if "model" in s:
            kw["model"] = check_session_model(s["model"], available)
        if "tools" in s or "tool_choice" in s:
            kw["tools"], kw["tool_choice"] = tool_settings(s, "session", cfg.tools, cfg.tool_choice)
        if "instructions" in s:
            kw["instructions"] = check_str(s["instructions"], "session.instructions")
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
                1024 if v == "inf" else check_num(v, "session.max_output_tokens", 1, 4096, integer=True)
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
            kw["temperature"] = float(check_num(s["temperature"], "session.temperature", 0.0, 2.0))
        audio = check_obj(s.get("audio"), "session.audio")
        inp = check_obj(audio.get("input"), "session.audio.input")
        out = check_obj(audio.get("output"), "session.audio.output")
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
                check_obj(inp.get("transcription", s.get("input_audio_transcription")), tr_name), available, tr_name
            )
        )
        voice = out.get("voice", s.get("voice"))
        if voice is not None:
            kw["voice"] = check_voice(voice, available, "session.audio.output.voice")
        if "speed" in out:
            kw["speed"] = float(check_num(out["speed"], "session.audio.output.speed", 0.25, 4.0))
    except AudioFormatError as e:
        raise ProtocolError(str(e), "invalid_audio_format", "session.audio.format") from None
    return replace(cfg, **kw)


def check_settings(server, cfg: SessionConfig) -> None:
    """ProtocolError if the server cannot serve a session with settings `cfg`: a conversation on a
    transcription-only server, a language its ASR model lacks, word times from a backend without them."""
    if cfg.type == "realtime" and not server.conversation_ready:
        raise ProtocolError(
            "this server runs transcription only (started without a language model or voice)",
            "invalid_value",
            "session.type",
        )
    try:
        server.asr.check_language(cfg.language)
    except UserError as e:
        raise ProtocolError(str(e), "invalid_value", "session.audio.input.transcription.language") from None
    check_word_timing(server.asr, cfg)


def check_word_timing(asr, cfg: SessionConfig) -> None:
    """ProtocolError if the session asks for word times and the server's ASR backend cannot give them."""
    if cfg.word_timestamps and not asr.runner.word_timing:
        raise ProtocolError(
            f"word timestamps are not available on this server's {asr.info.backend} backend; start "
            f"it with one of: {', '.join(asr.runner.WORD_TIMING_BACKENDS)}",
            "invalid_value",
            "session.audio.input.transcription.speechrt_word_timestamps",
        )
