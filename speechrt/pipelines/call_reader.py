"""Reading tool calls back from what a sequence writes under a tool grammar (tool_calls.call_grammar): a text answer
or one or more calls, each call's name as soon as it is written and its arguments' text as it grows."""

from __future__ import annotations

import re

from .tool_calls import BARE, CallFormat

HEAD = r'\{"name": "([^"]*)", "arguments": '  # the grammar's JSON style writes exactly this


class CallReader:
    """Reads the answer as it comes (push) and whole (finish). The grammar's form is relied on: a call answer is
    `fmt.open {"name": ..., "arguments": <JSON>} fmt.close`, joined by `fmt.sep` to the next call."""

    def __init__(self, fmt: CallFormat = BARE):
        self.fmt = fmt
        self.buf = ""
        self.pos = 0  # how far the buffer is read
        self.is_call: bool | None = None  # None until the first character that is not whitespace
        self.calls: list[list[str]] = []  # [name, arguments' text so far] of each call begun
        self.in_args = False  # reading the last call's arguments
        self.depth, self.in_str, self.esc = 0, False, False  # the arguments' JSON nesting, where pos is
        self._heads = [
            re.compile(re.escape(fmt.open) + HEAD),
            re.compile(re.escape(fmt.close + fmt.sep + fmt.open) + HEAD),
        ]

    @property
    def name(self) -> str | None:
        """The first call's name, once written."""
        return self.calls[0][0] if self.calls else None

    def push(self, text: str) -> tuple[str, list[tuple[int, str | None, str]]]:
        """New text -> (text of a text answer, the calls' news: (index, its name when it is new else None, new
        text of its arguments)); one of them is empty."""
        self.buf += text
        if self.is_call is None:
            head = self.buf.lstrip()
            if not head:
                return "", []
            self.is_call = head.startswith(self.fmt.first)
            if not self.is_call:
                return self.buf, []
            self.buf = head
        if not self.is_call:
            return text, []
        news: list[tuple[int, str | None, str]] = []
        while self.pos < len(self.buf):
            if not self.in_args:
                m = self._heads[bool(self.calls)].match(self.buf, self.pos)
                if m is None:
                    break  # the head is not written whole yet (or the answer ends with fmt.close)
                self.calls.append([m.group(1), ""])
                self.pos, self.in_args = m.end(), True
                self.depth, self.in_str, self.esc = 0, False, False
                news.append((len(self.calls) - 1, m.group(1), ""))
                continue
            start = self.pos
            self._scan()
            args = self.buf[start : self.pos]
            if args:
                self.calls[-1][1] += args
                i = len(self.calls) - 1
                if news and news[-1][0] == i:
                    news[-1] = (i, news[-1][1], news[-1][2] + args)
                else:
                    news.append((i, None, args))
            if self.in_args:
                break
            self.pos += 1  # the call object's closing brace
        return "", news

    def _scan(self) -> None:
        """Move pos over the arguments' JSON until their end (a '}' outside them: the call's) or the buffer's."""
        buf = self.buf
        while self.pos < len(buf):
            c = buf[self.pos]
            if self.in_str:
                self.esc, self.in_str = (not self.esc and c == "\\"), (self.esc or c != '"')
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                if self.depth == 0:  # the call's closing brace: the arguments ended before it
                    self.in_args = False
                    return
                self.depth -= 1
            self.pos += 1

    def finish(self) -> list[tuple[str, str]] | None:
        """The calls [(name, arguments as JSON text)] once the sequence ended, or None for a text answer. A call
        cut short (max_tokens) gives what was written (the finish reason says 'length')."""
        if not self.is_call:
            return None
        return [(n, a) for n, a in self.calls] or [("", "")]
