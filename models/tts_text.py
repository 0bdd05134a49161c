"""Text front end for Piper voices: text checked against what the voice can read, normalized (English:
tts_normalize.py), espeak-ng phonemization exactly as Piper does it, and the voice's phoneme-id map. Text that
arrives token by token is cut into sentences and clauses by tts_sentences.py.

Phonemization uses the espeak-ng library that the `piper-tts` wheel bundles (piper/espeakbridge + its
espeak-ng-data), so no system package is needed. espeak-ng is GPL-3.0-or-later; see README "Licenses".
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from speechrt.errors import UserError

from .tts_normalize import normalize

log = logging.getLogger(__name__)

BOS, EOS, PAD = "^", "$", "_"

# ----------------------------------------------------------------------------------------- checking the input

# espeak voices whose languages are written in Latin script
_LATIN_LANGS = set(
    "af an ca cs cy da de en eo es et eu fi fr ga gd hr ht hu id is it lb lt lv mt nl no nb "
    "pl pt ro sk sl sq sv sw tr vi ms".split()
)


def unsupported_characters(text: str, espeak_voice: str) -> list[str]:
    """Characters of `text` that the voice cannot read: control/unassigned/private-use characters, emoji and
    other pictographs, and for Latin-script languages, letters of other scripts."""
    latin = espeak_voice.split("-")[0].lower() in _LATIN_LANGS
    bad = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "\n\t\r":
            continue
        if cat in ("Cc", "Cf", "Cn", "Co", "Cs") or cat == "So":
            bad.append(ch)
        elif latin and cat.startswith("L") and not unicodedata.name(ch, "").startswith("LATIN"):
            bad.append(ch)
    return list(dict.fromkeys(bad))


def check_text(text: str, espeak_voice: str, on_unsupported: str = "error") -> str:
    """Validated text (unsupported characters dropped when on_unsupported='drop'); UserError otherwise."""
    if on_unsupported not in ("error", "drop"):
        raise ValueError(f"on_unsupported must be 'error' or 'drop', got {on_unsupported!r}")
    if not isinstance(text, str):
        raise UserError(f"text must be a string, got {type(text).__name__}")
    bad = unsupported_characters(re.sub(r"\[\[.*?\]\]", " ", text), espeak_voice)  # [[ raw IPA ]] passes
    if bad:
        shown = ", ".join(f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})" for c in bad[:5])
        shown += " ..." if len(bad) > 5 else ""
        if on_unsupported == "error":
            script = (
                "Latin-script text, digits and punctuation"
                if espeak_voice.split("-")[0] in _LATIN_LANGS
                else "text in its language"
            )
            raise UserError(
                f"unsupported characters for voice language {espeak_voice!r}: {shown}; this voice reads "
                f"{script} (to speak the rest, drop them: `speechrt say --on-unsupported drop`, "
                "on_unsupported='drop' in Python)"
            )
        log.warning("dropped characters the voice (%s) cannot read: %s", espeak_voice, shown)
        text = "".join(c for c in text if c not in set(bad))
    if not any(c.isalnum() for c in text):
        raise UserError("nothing to say: the text is empty or has no letters or digits")
    return text


# ---------------------------------------------------------------------------------------------- phonemizing

_ESPEAK_LOCK = threading.Lock()
_ESPEAK_READY = False
_RAW_PHONEMES = re.compile(r"(\[\[.*?\]\])")


def _espeak():
    global _ESPEAK_READY
    try:
        from piper import espeakbridge
        from piper.phonemize_espeak import ESPEAK_DATA_DIR
    except ImportError as e:
        raise UserError(
            "espeak-ng phonemization needs the piper-tts package, which bundles espeak-ng "
            f"(GPL-3.0): pip install piper-tts ({e})"
        ) from None
    if not _ESPEAK_READY:
        espeakbridge.initialize(str(ESPEAK_DATA_DIR))
        _ESPEAK_READY = True
    return espeakbridge


def _merge_clusters(phones: list[str], clusters) -> list[str]:
    if not clusters:
        return phones
    longest = max(len(c) for c in clusters)
    out, i = [], 0
    while i < len(phones):
        for n in range(min(longest, len(phones) - i), 1, -1):
            if tuple(phones[i : i + n]) in clusters:
                out.append("".join(phones[i : i + n]))
                i += n
                break
        else:
            out.append(phones[i])
            i += 1
    return out


def espeak_phonemize(text: str, voice: str, vowel_clusters=frozenset()) -> list[list[str]]:
    """Text -> phonemes per sentence, reproducing piper.voice.PiperVoice.phonemize for espeak voices:
    espeak-ng clauses with their terminators kept ("," ":" ";" followed by a space), language-switch flags
    removed, NFD-decomposed codepoints, optional vowel clusters merged, [[ raw phonemes ]] passed through."""
    sentences: list[list[str]] = []
    parts = _RAW_PHONEMES.split(text)
    prev_raw = False
    with _ESPEAK_LOCK:
        bridge = _espeak()
        bridge.set_voice(voice)
        for i, part in enumerate(parts):
            if part.startswith("[["):
                prev_raw = True
                if not sentences:
                    sentences.append([])
                if i > 0 and parts[i - 1].endswith(" "):
                    sentences[-1].append(" ")
                sentences[-1].extend(part[2:-2].strip())
                if i < len(parts) - 1 and parts[i + 1].startswith(" "):
                    sentences[-1].append(" ")
                continue
            out: list[list[str]] = []
            cur: list[str] = []
            for phonemes, terminator, end_of_sentence in bridge.get_phonemes(part):
                phonemes = re.sub(r"\([^)]+\)", "", phonemes) + terminator
                if terminator in (",", ":", ";"):
                    phonemes += " "
                cur.extend(unicodedata.normalize("NFD", phonemes))
                if end_of_sentence:
                    out.append(_merge_clusters(cur, vowel_clusters))
                    cur = []
            if cur:
                out.append(_merge_clusters(cur, vowel_clusters))
            if prev_raw and out:
                sentences[-1].extend(out[0])
                out = out[1:]
            sentences.extend(out)
            prev_raw = False
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


def phonemes_to_ids(phonemes: list[str], id_map: dict) -> list[int]:
    """^ _ p1 _ p2 _ ... pn _ $ ; phonemes missing from the map are skipped with a warning, as Piper does."""
    ids = list(id_map[BOS]) + list(id_map[PAD])
    missing = []
    for p in phonemes:
        if p not in id_map:
            missing.append(p)
            continue
        ids.extend(id_map[p])
        ids.extend(id_map[PAD])
    ids.extend(id_map[EOS])
    if missing:
        log.warning("phonemes missing from the voice's id map, skipped: %s", " ".join(sorted(set(missing))))
    return ids


@dataclass(frozen=True)
class TextOptions:
    normalize: bool = True
    on_unsupported: str = "error"  # "error" | "drop"

    def __post_init__(self):
        if self.on_unsupported not in ("error", "drop"):
            raise UserError(f"on_unsupported must be 'error' or 'drop', got {self.on_unsupported!r}")


class TextFrontEnd:
    """Text -> phoneme ids per sentence for one voice (a models.piper_loader.VoiceConfig)."""

    def __init__(self, voice):
        self.voice = voice
        for sym in (BOS, EOS, PAD):
            if sym not in voice.phoneme_id_map:
                raise UserError(f"voice {voice.name!r}: phoneme_id_map lacks {sym!r}; not a Piper voice config")

    def prepare(self, text: str, options: TextOptions = TextOptions()) -> str:
        text = check_text(text, self.voice.espeak_voice, options.on_unsupported)
        lang = self.voice.language or self.voice.espeak_voice
        return normalize(text, lang) if options.normalize else text

    def phonemize(self, text: str) -> list[list[str]]:
        if self.voice.phoneme_type == "text":
            return [list(unicodedata.normalize("NFD", text))]
        return espeak_phonemize(text, self.voice.espeak_voice, self.voice.vowel_clusters)

    def sentences(self, text: str, options: TextOptions = TextOptions()) -> Iterator[list[int]]:
        """Phoneme ids of each sentence of `text`, in order."""
        for ph in self.phonemize(self.prepare(text, options)):
            if ph:
                yield phonemes_to_ids(ph, self.voice.phoneme_id_map)
