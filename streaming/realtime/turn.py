"""One user turn: its state from speech start to final transcript (the transcripts in flight for it, its draft,
what a long turn committed) and how its live text grows (the words hypotheses agree on, then the final delta)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from speechrt.pipelines.asr import MAX_UTTERANCE_SAMPLES

from .agreement import common_prefix
from .policy import DEFAULT_POLICY, TurnPolicy

# the words a long turn committed last that its later transcripts take as their prompt (Whisper's previous text):
# each part goes on from the words before it, as long-form transcription's windows do
CONTEXT_WORDS = 32


@dataclass(eq=False)
class Turn:
    """One user turn, from the speech start (or a commit without one) to its final transcript, with the
    transcripts in flight for it:
    - `live`: the loop that re-transcribes the growing turn; words that two consecutive hypotheses agree
      on go out as deltas (`sent`: those sent, None when the session sends none; `heard`: the latest);
    - `early`: (quiet since, task), a transcript begun when the input went quiet, before Silero calls
      the pause;
    - `paused`: (pause start ms, task), the transcript up to the pause in progress (the early one if it
      covers that pause): the final transcript if the pause ends the turn.
    `draft`: the tokens of its latest transcript, which the next one checks in one decoder pass.
    A long turn commits what is stable as it goes (commit_stable): `committed` is the text of its audio
    before sample `base`, which its transcripts from then on leave out."""

    item_id: str
    start: int  # absolute sample index where its speech began
    draft: list[int] = field(default_factory=list)
    live: asyncio.Task | None = None
    sent: list[str] | None = None
    heard: list[str] = field(default_factory=list)
    early: tuple[int, asyncio.Task] | None = None
    paused: tuple[int, asyncio.Task] | None = None
    base: int | None = None  # where its audio not yet committed begins (None: at its start)
    committed: str = ""
    committed_s: float = 0.0  # seconds of the committed audio
    # the last round's (base, closed segments [(start s, end s, text, tokens), ...] (a commit round's), its words)
    closed: tuple = ()
    extras: list = field(default_factory=list)  # (offset s, task) of the committed parts' logprobs and word times
    policy: TurnPolicy = DEFAULT_POLICY  # the session's (its commit_after, recommit_after, opening_words)

    def full(self, text: str) -> str:
        """The turn's text: what it committed, then `text` (a transcript of its audio after `base`)."""
        return f"{self.committed} {text}".strip() if self.committed else text

    def prompted(self, options):
        """`options` (TranscribeOptions) for a transcript of its audio after `base`: the session's prompt, then the
        last CONTEXT_WORDS words it committed."""
        if not self.committed:
            return options
        context = " ".join(self.committed.split()[-CONTEXT_WORDS:])
        prompt = f"{options.initial_prompt.strip()} {context}" if (options.initial_prompt or "").strip() else context
        return dataclasses.replace(options, initial_prompt=prompt)

    def commit(self, text: str, base: int, seconds: float):
        self.committed, self.base, self.draft = self.full(text), base, []
        self.committed_s += seconds

    @property
    def commit_after(self) -> int:
        """Audio not committed past which its live rounds commit (long_turn.commit_stable): the policy's
        commit_after, then, once it has committed, its recommit_after (the rest its final transcribes stays
        short)."""
        return self.policy.commit_after if self.base is None else self.policy.recommit_after

    def speculates(self, uncommitted: int) -> bool:
        """Are early and paused transcripts worth starting, with `uncommitted` samples not committed? Not once a
        live round has a commit to make (they would stop it, see commit_stable; and each pause would start a
        final-priority transcript of all of it), nor past 30 s (long-form, once, when the turn ends)."""
        return uncommitted <= (self.commit_after if self.live is not None else MAX_UTTERANCE_SAMPLES)

    def agree(self, text: str) -> str | None:
        """A new live hypothesis -> the delta to send: the words it agrees on with the previous one, past
        those already sent. Until some are sent, a hypothesis of two words or more sends its first opening_words
        without waiting for a second one: a turn's first word comes one round sooner. A word that ends two
        hypotheses alike is not agreed on: both may have heard only its first part ("drive to the air?" from an
        early transcript begun in the silence of the p and from a live round just after; "airport?" in the final
        one), and two opening rounds may both stop at opening_tokens inside it. (A hypothesis's first word
        is its surest: at 0.6 s of speech, 24 clips' words but the last were wrong in 4, the first word only
        where the final transcript is wrong too, "and" for "Add"; two words went out wrong in 2 of 24 turns at
        8 streams: "the concept", "Please but".)"""
        if self.sent is None:
            return None
        words = self.full(text).split()
        stable = common_prefix(self.heard, words)
        if stable == len(self.heard) == len(words):  # the word both end on: maybe the first part of one, twice
            stable -= 1
        if not self.sent:
            stable = max(stable, min(self.policy.opening_words, len(words) - 1))
        delta = None
        if stable > len(self.sent) and common_prefix(words, self.sent) == len(self.sent):
            delta = (" " if self.sent else "") + " ".join(words[len(self.sent) : stable])
            self.sent = self.sent + words[len(self.sent) : stable]
        self.heard = words
        return delta

    def final_delta(self, text: str) -> str | None:
        """The final transcript -> the delta that completes the live deltas sent (all of it if none; none if
        the final transcript does not begin with them)."""
        if not self.sent:
            return text or None
        words = text.split()
        if common_prefix(words, self.sent) == len(self.sent) and len(words) > len(self.sent):
            return " " + " ".join(words[len(self.sent) :])
        return None

    def stop_live(self):
        if self.live is not None:
            self.live.cancel()
