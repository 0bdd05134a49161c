"""Agreement between transcripts of the same speech: the words two live hypotheses share (what a turn's live
text may send), and the segments two commit rounds of a long turn share (local agreement: what it commits)."""

from __future__ import annotations

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
