"""English text normalization for speech synthesis: numbers (cardinals, ordinals, years, decimals), money,
dates, times, titles, abbreviations and units spelled out as the words a voice should say."""

from __future__ import annotations

import re
import unicodedata

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
TITLES = {
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
ABBREVIATIONS = {
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
        return TITLES[m.group(1).lower()]

    t = re.sub(r"\b(" + "|".join(TITLES) + r")\.(?= )", title, t, flags=re.IGNORECASE)

    def abbr(m):
        word = ABBREVIATIONS[m.group(1).lower()]
        rest = t[m.end() :]
        ends = rest == "" or re.match(r"\s+[\"'(]?[A-Z]", rest) is not None
        return word + ("." if ends else "")

    keys = sorted(ABBREVIATIONS, key=len, reverse=True)
    t = re.sub(r"(?<![\w.])(" + "|".join(re.escape(k) for k in keys) + r")\.(?=\W|$)", abbr, t, flags=re.IGNORECASE)
    return t


def normalize(text: str, language: str = "en") -> str:
    """Language-aware normalization: the English rules for English voices, whitespace cleanup otherwise."""
    if language.lower().startswith("en"):
        return normalize_english(text)
    return re.sub(r"\s+", " ", unicodedata.normalize("NFC", text)).strip()
