"""Agreement between transcripts of the same speech: the words two live hypotheses share (what a turn's live
text may send), and the segments or words two commit rounds of a long turn share (local agreement: what it
commits)."""

from __future__ import annotations

from difflib import SequenceMatcher

from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from .policy import COMMIT_MARGIN

PUNCTUATION = ".,!?;:\"'()[]-…"  # stripped from words' ends when live hypotheses are compared


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading words `a` and `b` share, ignoring case and the punctuation around them (a live hypothesis
    of "the pack," and a later "The package" share "the")."""
    n = 0
    for x, y in zip(a, b):
        if x.lower().strip(PUNCTUATION) != y.lower().strip(PUNCTUATION):
            break
        n += 1
    return n


def agreed(before: list, now: list, samples: int, margin: int = COMMIT_MARGIN) -> list:
    """Local agreement: the leading segments (start s, end s, text, ...) of this round (`now`) that the previous
    round over the same start (`before`) also had — same words, ends within 0.5 s — and that end `margin`
    (the policy's commit_margin) before the end of the `samples` transcribed. (One round alone may skip or
    repeat speech; two rather not the same way.)"""
    out = []
    for seg, prev in zip(now, before):
        (_, end0, text0), (_, end, text) = prev[:3], seg[:3]
        if text.split() != text0.split() or abs(end - end0) > 0.5 or end * RATE > samples - margin:
            break
        out.append(seg)
    return out


def shared_words(before: list[str], now: list[str], max_gap: int = 2, min_run: int = 3) -> int:
    """How many leading words of `now` the words `before` agree with, allowing a few words that differ: runs of
    words alike (ignoring case and punctuation, as common_prefix), each after the last with at most `max_gap`
    words in between on either side and, after such a gap, at least `min_run` long. Fast speech makes a word
    flip between two rounds ("lighthouse", "Lyke house"), or a fragment at the start of the audio come and go
    ("been through rain", "through rain"); the words around it still agree, and a prefix that must be equal
    word for word would stop there every round."""
    norm = [[w.lower().strip(PUNCTUATION) for w in ws] for ws in (before, now)]
    n = i = j = 0
    for a, b, size in SequenceMatcher(None, *norm, autojunk=False).get_matching_blocks():
        if size == 0 or a - i > max_gap or b - j > max_gap or ((a, b) != (i, j) and size < min_run):
            break
        i, j = a + size, b + size
        n = j
    return n


def agreed_words(before: list[str], words: list, samples: int, margin: int = COMMIT_MARGIN) -> int:
    """Local agreement by words, for rounds whose segments agree on none (fast speech without pauses: Whisper may
    make one segment of all of it, its end moving every round): how many leading words of this round (`words`,
    aligned: `.word`, `.end` in s from its audio's start) the previous round's text (`before`, its words) agrees
    with (shared_words), up to the last that ends `margin` before the end of the `samples` transcribed."""
    n = shared_words(before, [w.word.strip() for w in words])
    while n and words[n - 1].end * RATE > samples - margin:
        n -= 1
    return n
