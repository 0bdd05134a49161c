"""Whisper's loop detection: a row of a window's decoding cut when it repeats one span `stop_repeats` times, and
a transcript that is one span said over and over faster than anyone speaks cut to one copy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speechrt.backends.token_repeats import repeat_period
from speechrt.models.whisper_tokenizer import WhisperTokenizer

from .speech_regions import compression_ratio

if TYPE_CHECKING:
    from .whisper_decoding import WindowResult

# characters a second (spaces and punctuation counted) that no one speaks at: conversational English is
# about 14, fast speech 20; a transcript faster than this over its whole audio was not all said
MAX_CHARS_PER_S = 25.0


def cut_loop(seq: list[int], times: int) -> bool:
    """If `seq` ends with one span repeated `times` times, drop all copies but the first -> True (the row
    is done); False otherwise, or when `times` is 0."""
    period = repeat_period(seq, times) if times else 0
    if period:
        del seq[len(seq) - (times - 1) * period :]
    return period > 0


def whole_repeat_period(tokens: list[int]) -> int:
    """The length of the shortest span that the whole of `tokens` is two or more copies of, back to back;
    0 if there is none."""
    n = len(tokens)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and tokens == tokens[:period] * (n // period):
            return period
    return 0


def cut_repeat_said_too_fast(res: WindowResult, tok: WhisperTokenizer, seconds: float) -> bool:
    """A greedy loop that ended by itself after two copies ("Close the windows. Close the windows." over
    two seconds) is one stop_repeats does not see: if the whole transcript is one span said two or more
    times, faster than anyone speaks over the `seconds` of its audio, keep one copy -> True. A repeat
    really said takes its time, and stays."""
    period = whole_repeat_period(res.tokens)
    if not period or len(res.text) <= MAX_CHARS_PER_S * seconds:
        return False
    res.tokens = res.tokens[:period]
    res.text = tok.decode(res.tokens).strip()
    res.compression_ratio = compression_ratio(res.text)  # of the copy kept, as a result made with it would say
    return True
