"""Sentence and clause splitting of text that arrives in pieces (LLM tokens): each speakable segment is handed
on as soon as it is complete."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from speechrt.errors import UserError

from .tts_normalize import ABBREVIATIONS, TITLES

_END = re.compile(r"[.!?…]+[\"')\]]*$")
_CLAUSE = re.compile(r"[,;:—–]$")
_NO_BREAK_BEFORE_PERIOD = set(TITLES) | {a for a in ABBREVIATIONS if "." not in a} | {"e.g", "i.e", "a.m", "p.m"}


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
