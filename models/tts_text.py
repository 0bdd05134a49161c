"""Text front end for Piper voices: English text normalization, sentence/clause splitting (also of text
that arrives token by token), espeak-ng phonemization exactly as Piper does it, and the voice's phoneme-id map.

Phonemization uses the espeak-ng library that the `piper-tts` wheel bundles (piper/espeakbridge + its
espeak-ng-data), so no system package is needed. espeak-ng is GPL-3.0-or-later; see README "Licenses".
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from speechrt.errors import UserError

log = logging.getLogger(__name__)

BOS, EOS, PAD = "^", "$", "_"

# ---------------------------------------------------------------------------------------------- number words

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]
_ORD_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def cardinal(n: int) -> str:
    """12345 -> 'twelve thousand three hundred forty-five'."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + cardinal(n % 100))
    for value, word in _SCALES:
        if n >= value:
            if n >= value * 1000:
                break  # beyond trillions: read digit by digit
            rest = n % value
            return cardinal(n // value) + " " + word + ("" if rest == 0 else " " + cardinal(rest))
    return " ".join(_ONES[int(d)] for d in str(n))


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = words.rpartition("-") if "-" in words.split(" ")[-1] else words.rpartition(" ")
    if last in _ORD_IRREGULAR:
        last = _ORD_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def year(n: int) -> str:
    """1999 -> 'nineteen ninety-nine', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four'."""
    if n < 1000 or n >= 10000:
        return cardinal(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return cardinal(n) if hi % 10 == 0 else cardinal(hi) + " hundred"
    if 2000 <= n < 2010:
        return cardinal(n)
    return cardinal(hi) + " " + ("oh " + cardinal(lo) if lo < 10 else cardinal(lo))


def _decimal(s: str) -> str:
    """'3.14' -> 'three point one four'; '1,234' -> 'one thousand two hundred thirty-four'."""
    s = s.replace(",", "")
    whole, _, frac = s.partition(".")
    out = cardinal(int(whole)) if whole else "zero"
    if frac:
        out += " point " + " ".join(_ONES[int(d)] for d in frac)
    return out


# ------------------------------------------------------------------------------------------ English normalizer

_MONTHS = ("January February March April May June July August September October November December").split()
_MONTH_ABBR = {m[:3].lower(): m for m in _MONTHS} | {"sept": "September"}
# titles precede a name: never end a sentence, drop the period
_TITLES = {
    "mr": "mister",
    "mrs": "missus",
    "ms": "miz",
    "dr": "doctor",
    "prof": "professor",
    "st": "saint",
    "sgt": "sergeant",
    "capt": "captain",
    "gen": "general",
    "gov": "governor",
    "sen": "senator",
    "rep": "representative",
    "rev": "reverend",
    "lt": "lieutenant",
    "col": "colonel",
}
# may end a sentence: keep the period when the next word starts a sentence
_ABBREVIATIONS = {
    "etc": "et cetera",
    "vs": "versus",
    "inc": "incorporated",
    "ltd": "limited",
    "jr": "junior",
    "sr": "senior",
    "approx": "approximately",
    "dept": "department",
    "ave": "avenue",
    "blvd": "boulevard",
    "mt": "mount",
    "e.g": "for example",
    "i.e": "that is",
    "a.m": "a m",
    "p.m": "p m",
}
_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
}
_SCALE_WORDS = {
    "k": "thousand",
    "m": "million",
    "mn": "million",
    "b": "billion",
    "bn": "billion",
    "thousand": "thousand",
    "million": "million",
    "billion": "billion",
    "trillion": "trillion",
}
_UNITS = {
    "km": "kilometers",
    "kg": "kilograms",
    "cm": "centimeters",
    "mm": "millimeters",
    "m": "meters",
    "g": "grams",
    "mg": "milligrams",
    "lb": "pounds",
    "lbs": "pounds",
    "mph": "miles per hour",
    "km/h": "kilometers per hour",
    "kmh": "kilometers per hour",
    "ml": "milliliters",
    "l": "liters",
    "ft": "feet",
    "in": "inches",
    "mi": "miles",
    "hz": "hertz",
    "khz": "kilohertz",
    "ghz": "gigahertz",
    "gb": "gigabytes",
    "mb": "megabytes",
    "tb": "terabytes",
    "kb": "kilobytes",
    "ms": "milliseconds",
    "s": "seconds",
    "min": "minutes",
    "h": "hours",
    "°c": "degrees celsius",
    "°f": "degrees fahrenheit",
}
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"


def _money(m: re.Match) -> str:
    sym, amount, scale = m.group("sym"), m.group("amount").replace(",", ""), (m.group("scale") or "").lower()
    one, many, sub_one, sub_many = _CURRENCY[sym]
    if scale:
        return f"{_decimal(amount)} {_SCALE_WORDS[scale]} {many}"
    whole, _, frac = amount.partition(".")
    w = int(whole or 0)
    out = f"{cardinal(w)} {one if w == 1 else many}"
    if frac and sub_one:
        c = int((frac + "0")[:2])
        if c:
            out = (out + " and " if w else "") + f"{cardinal(c)} {sub_one if c == 1 else sub_many}"
    elif frac:
        out = f"{_decimal(amount)} {many}"
    return out


def _date_mdy(mo: int, d: int, y: int | None) -> str | None:
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return None
    return f"{_MONTHS[mo - 1]} {ordinal(d)}" + (f", {year(y)}" if y is not None else "")


def _time(m: re.Match) -> str:
    h, mi = int(m.group(1)), int(m.group(2))
    ampm = (m.group(3) + "m").lower() if m.group(3) else ""
    if h > 24 or mi > 59:
        return m.group(0)
    words = cardinal(h) + (
        "" if mi == 0 and ampm else " o'clock" if mi == 0 else " oh " + cardinal(mi) if mi < 10 else " " + cardinal(mi)
    )
    return words + (" " + " ".join(ampm) if ampm else "")


def _keep_period(m: re.Match, t: str) -> str:
    """'.' if the match ended with a period that also ends a sentence (end of text or a capital follows)."""
    if not m.group(0).endswith("."):
        return ""
    rest = t[m.end() :]
    return "." if rest == "" or re.match(r"\s+[\"'(]?[A-Z]", rest) else ""


def normalize_english(text: str) -> str:
    """Expand what espeak-ng would read badly or not as a person would: currency, dates, times, ordinals,
    years, percentages, units after numbers, abbreviations. Plain words pass through unchanged."""
    t = unicodedata.normalize("NFC", text)
    t = t.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    t = re.sub(r"\s+", " ", t).strip()
    t = re.sub(
        r"\b(no|nos)\.\s?(?=\d)",
        lambda m: "number " if m.group(1).lower() == "no" else "numbers ",
        t,
        flags=re.IGNORECASE,
    )
    t = re.sub(
        r"\b([A-Z][a-z]+) St\.", lambda m: m.group(1) + " Street" + _keep_period(m, t), t
    )  # "Elm St." vs "St. Louis"
    # dates: ISO 2024-03-15, US 03/15/2024 or 3/15
    t = re.sub(
        r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b",
        lambda m: _date_mdy(int(m.group(2)), int(m.group(3)), int(m.group(1))) or m.group(0),
        t,
    )
    t = re.sub(
        r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b",
        lambda m: (
            _date_mdy(int(m.group(1)), int(m.group(2)), int(m.group(3)) + (2000 if len(m.group(3)) == 2 else 0))
            or m.group(0)
        ),
        t,
    )
    # "March 15, 2024" / "15 March 2024" / "Mar. 15th"
    month_re = r"(?P<mon>" + "|".join(_MONTHS) + r"|(?:" + "|".join(_MONTH_ABBR) + r")\.?)"
    t = re.sub(
        month_re + r" (?P<d>\d{1,2})(?:st|nd|rd|th)?(?:, (?P<y>\d{4}))?\b",
        lambda m: (
            (
                _MONTH_ABBR.get(m.group("mon").rstrip(".").lower()[:4], None)
                or _MONTH_ABBR.get(m.group("mon").rstrip(".").lower()[:3], m.group("mon"))
            )
            + " "
            + ordinal(int(m.group("d")))
            + (", " + year(int(m.group("y"))) if m.group("y") else "")
        ),
        t,
        flags=re.IGNORECASE,
    )
    t = re.sub(
        r"\b(\d{1,2}) " + month_re + r"(?: (\d{4}))?\b",
        lambda m: (
            "the "
            + ordinal(int(m.group(1)))
            + " of "
            + _MONTH_ABBR.get(m.group("mon").rstrip(".").lower()[:3], m.group("mon"))
            + (", " + year(int(m.group(3))) if m.group(3) else "")
        ),
        t,
        flags=re.IGNORECASE,
    )
    # times 3:30, 10:05 pm
    t = re.sub(
        r"\b(\d{1,2}):(\d{2})(?:\s?([ap])\.?m\b\.?)?", lambda m: _time(m) + _keep_period(m, t), t, flags=re.IGNORECASE
    )
    # currency $12.50, $3.5M, €20, £1
    t = re.sub(
        r"(?P<sym>[$€£¥])\s?(?P<amount>" + _NUM + r")(?:\s?(?P<scale>thousand|million|billion|trillion|"
        r"bn|mn|[kKmMbB])\b)?",
        _money,
        t,
    )
    # percentages, ordinals, years, units
    t = re.sub(r"(" + _NUM + r")\s?%", lambda m: _decimal(m.group(1)) + " percent", t)
    t = re.sub(r"\b(\d+)(st|nd|rd|th)\b", lambda m: ordinal(int(m.group(1))), t, flags=re.IGNORECASE)
    t = re.sub(r"(?<![\d.,])\b(1[1-9]\d\d|20\d\d)\b(?![.,]\d)(?!\s?%)", lambda m: year(int(m.group(1))), t)
    unit_re = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
    t = re.sub(
        r"(" + _NUM + r")\s?(" + unit_re + r")\b(?!')",
        lambda m: _decimal(m.group(1)) + " " + _UNITS[m.group(2).lower()],
        t,
        flags=re.IGNORECASE,
    )
    t = re.sub(r"(?<![\w.])(" + _NUM + r")(?![\w])", lambda m: _decimal(m.group(1)), t)
    t = re.sub(r"(?<=\w) ?& ?(?=\w)", " and ", t)

    # abbreviations (case-insensitive, with their period)
    def title(m):
        return _TITLES[m.group(1).lower()]

    t = re.sub(r"\b(" + "|".join(_TITLES) + r")\.(?= )", title, t, flags=re.IGNORECASE)

    def abbr(m):
        word = _ABBREVIATIONS[m.group(1).lower()]
        rest = t[m.end() :]
        ends = rest == "" or re.match(r"\s+[\"'(]?[A-Z]", rest) is not None
        return word + ("." if ends else "")

    keys = sorted(_ABBREVIATIONS, key=len, reverse=True)
    t = re.sub(r"(?<![\w.])(" + "|".join(re.escape(k) for k in keys) + r")\.(?=\W|$)", abbr, t, flags=re.IGNORECASE)
    return t


def normalize(text: str, language: str = "en") -> str:
    """Language-aware normalization: the English rules for English voices, whitespace cleanup otherwise."""
    if language.lower().startswith("en"):
        return normalize_english(text)
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", text)).strip()


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


# ------------------------------------------------------------------------------------ incremental text input

_END = re.compile(r"[.!?…]+[\"')\]]*$")
_CLAUSE = re.compile(r"[,;:—–]$")
_NO_BREAK_BEFORE_PERIOD = set(_TITLES) | {a for a in _ABBREVIATIONS if "." not in a} | {"e.g", "i.e", "a.m", "p.m"}


class SentenceStream:
    """Cuts text that arrives in pieces (LLM tokens) into speakable segments as soon as they are complete:
    a sentence (ends in . ! ? followed by whitespace, not after an abbreviation, initial or decimal point),
    a clause (ends in , ; : or a dash) once it has `min_clause_words` words, a line break, or
    `max_words` words without any punctuation.

    push(piece) returns the segments completed by `piece`; flush() returns the rest.
    """

    def __init__(self, min_clause_words: int = 8, max_words: int = 40):
        if min_clause_words < 1 or max_words < min_clause_words:
            raise UserError(f"need 1 <= min_clause_words <= max_words, got {min_clause_words}, {max_words}")
        self.min_clause_words, self.max_words = min_clause_words, max_words
        self.buf = ""

    def _boundary(self, words: list[str], n_before: int) -> bool:
        """Is there a segment boundary after words[:n] (n = n_before), given the word that follows?"""
        w = words[n_before - 1]
        if _END.search(w):
            core = w.rstrip(".!?…\"')]").lower()
            if w.rstrip("\"')]").endswith(".") and not w.rstrip("\"')]").endswith(".."):
                if core in _NO_BREAK_BEFORE_PERIOD or (len(core) == 1 and core.isalpha()):
                    return False  # "Dr. Smith", "J. R. R.", "e.g. this"
            return True
        if _CLAUSE.search(w) and n_before >= self.min_clause_words:
            return True
        return n_before >= self.max_words

    def push(self, piece: str) -> list[str]:
        self.buf += piece
        out = []
        while True:
            if "\n" in self.buf:
                line, _, rest = self.buf.partition("\n")
                if line.strip():
                    # a line is complete; segment it fully before taking the next
                    self.buf = line + " \x00"
                    out += self._drain(final_word_complete=True)
                    tail = self.buf.replace("\x00", "").strip()
                    if tail:
                        out.append(tail)
                self.buf = rest
                continue
            out += self._drain(final_word_complete=False)
            return out

    def _drain(self, final_word_complete: bool) -> list[str]:
        out = []
        while True:
            # only words followed by whitespace are complete ("3." may become "3.5")
            m = list(re.finditer(r"\S+", self.buf))
            complete = [x for x in m if x.end() < len(self.buf) and self.buf[x.end()].isspace() and x.group() != "\x00"]
            cut = None
            words = [x.group() for x in complete]
            for n in range(1, len(words) + 1):
                if self._boundary(words, n):
                    cut = complete[n - 1].end()
                    break
            if cut is None:
                return out
            seg = self.buf[:cut].strip()
            self.buf = self.buf[cut:].lstrip(" \t")
            if seg:
                out.append(seg)

    def flush(self) -> list[str]:
        rest = self.buf.strip()
        self.buf = ""
        return [rest] if rest else []


def stream_segments(pieces: Iterable[str], **kw) -> Iterator[str]:
    """Speakable segments of text arriving in pieces (see SentenceStream)."""
    s = SentenceStream(**kw)
    for p in pieces:
        yield from s.push(p)
    yield from s.flush()
