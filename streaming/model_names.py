"""The model names every endpoint accepts (REST and Realtime), in this one place, and the list /v1/models shows.

A model family is named by the loaded model's own name, by `speechrt` (this server: the loaded model of whichever
endpoint names it), or by OpenAI's names for that family, which the loaded model answers for, with or without a
dated snapshot suffix (`gpt-4o-realtime-preview-2024-12-17`). Transcriptions (REST and a Realtime session's input
transcription) take the recognizer's names, speech the voice's, chat completions and Realtime sessions the language
model's (a Realtime session takes them on a transcription-only server too: it then transcribes only). Another name
is an error listing the valid ones. `loaded`: the server's loaded model names by family ({'asr': [...], 'lm': [...],
'tts': [...]}, SpeechServer.names)."""

from __future__ import annotations

import re

SERVER_NAME = "speechrt"
# OpenAI's model names, per family, that the loaded model of that family answers for
OPENAI_NAMES = {
    "asr": ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"),
    "lm": ("gpt-realtime", "gpt-realtime-mini", "gpt-4o-realtime-preview", "gpt-4o-mini-realtime-preview"),
    "tts": ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"),
}
FAMILIES = tuple(OPENAI_NAMES)
SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")  # OpenAI's dated snapshots: gpt-realtime-2025-08-28


def accepted(family: str, loaded: dict) -> list[str]:
    """The names `family`'s endpoints accept, in the order errors list them: the loaded model's own, 'speechrt',
    OpenAI's (each also with a dated snapshot suffix)."""
    return [*(loaded.get(family) or []), SERVER_NAME, *OPENAI_NAMES[family]]


def canonical(name: str) -> str:
    """`name` without a dated snapshot suffix where it is one of OpenAI's names with one; else `name`."""
    base = SNAPSHOT.sub("", name)
    return base if any(base in names for names in OPENAI_NAMES.values()) else name


def accepts(name, family: str, loaded: dict) -> bool:
    """Whether `name` names the loaded model of `family` (see accepted)."""
    return isinstance(name, str) and canonical(name) in accepted(family, loaded)


def unknown(name, family: str, loaded: dict, what: str) -> str:
    """The error message for a name `family`'s endpoint (`what`: 'transcription', 'chat', ...) does not accept."""
    return (
        f"model {name!r} is not served here; {what} models: {', '.join(accepted(family, loaded))} "
        f"({SERVER_NAME!r} and OpenAI's names stand for the loaded model)"
    )


def catalog(loaded: dict) -> list[tuple[str, str, str | None]]:
    """(id, family, root) of every name this server accepts, for /v1/models: the loaded models first (root: itself),
    then 'speechrt' (family 'all', root None: it stands for the loaded model of whichever endpoint names it), then
    OpenAI's names of each family (root: the loaded model that answers for them; the language model's are listed on
    a transcription-only server too, root None: a Realtime session takes them and transcribes only)."""
    out = [(n, f, n) for f in FAMILIES for n in loaded.get(f) or []]
    out.append((SERVER_NAME, "all", None))
    for f in FAMILIES:
        own = loaded.get(f) or []
        if own or f == "lm":
            out += [(n, f, own[0] if own else None) for n in OPENAI_NAMES[f]]
    return out
