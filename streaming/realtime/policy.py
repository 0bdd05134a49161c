"""The turn policy: every constant and option of turn taking (when live, early and final transcripts of a turn
run, how much audio they keep and read, how long turns commit) in one frozen object, checked when it is built.
The server builds one from its options (TurnPolicy.from_options) and its sessions and their turns hold it."""

from __future__ import annotations

from dataclasses import dataclass

from speechrt.errors import UserError
from speechrt.pipelines.asr import SAMPLE_RATE as RATE
from speechrt.pipelines.asr import TranscribeOptions

from ..asr_options import FINAL_MARGIN_S, LIVE_MARGIN_S, LOADED_FINAL_MARGIN_S, turn_options
from .vad import QUIET_LEAD_MS

# The defaults, with the reasons for them (TurnPolicy's fields take them).
# early transcripts: begun once the input has been quiet this long (before Silero confirms the pause), and used
# as the final one if Silero's pause begins shortly after (vad.quiet_began_pause)
EARLY_QUIET = RATE * 10 // 1000
TAIL = RATE // 10  # audio kept after the end of speech: the tail helps Whisper finish the last word
IDLE_KEEP = RATE  # audio kept, besides the prefix padding, while no turn is open (Silero may start a turn late)
# local agreement on long turns: past COMMIT_AFTER of audio not yet committed, live rounds transcribe it with
# timestamps and commit the segments (or words) two rounds agree on that end COMMIT_MARGIN or more before its end;
# once a turn has committed, past RECOMMIT_AFTER: the rest its final transcribes stays short (a 41-s monologue of
# fast speech without pauses: its final 3.5-7.6 s after its end when only agreed segments were committed, none
# after the first, and the final transcribed 38 s long-form; issue 49)
COMMIT_AFTER, COMMIT_MARGIN, RECOMMIT_AFTER = 12 * RATE, 3 * RATE, 6 * RATE
# live rounds before a turn's first words: OPENING_ROUND partial intervals apart, and run before other live
# transcripts while their audio is at most OPENING_MAX (a short encoder pass and a word or two: tens of ms)
OPENING_ROUND, OPENING_MAX = 0.3, 2 * RATE
OPENING_WORDS = 1  # words a turn's first hypothesis may send before a second one agrees (Turn.agree)
# tokens an opening round decodes: it sends one word, so the rest would be decoded only to be checked again by
# the next round (which takes these as its draft). Greedy decoding's first words hardly depend on where it stops
# (only near-ties at the audio's end: the decoder's cache is sized by the cap, which moves the last bits of its
# sums). On `bench server`'s 12 utterances x 3 voice seeds cut at 0.6-1.5 s of speech: the same first word in 144
# rounds of 144, at 0.65x the time (35 -> 23 ms a round; AVX2 paths 41 -> 28 ms; Zen 4; bench.opening_study)
OPENING_TOKENS = 4
QUIET_DROP_DB = 30.0  # a 10-ms hop this far below the recent loudness peak is quiet (vad.QuietTracker)


@dataclass(frozen=True)
class TurnPolicy:
    """How a Realtime session takes turns. Lengths of audio are in samples at 16 kHz (RATE), times in seconds
    unless named _ms. The server's options set the first five (TurnPolicy.from_options); the rest are the
    defaults above, studied on the benchmarks."""

    partial_interval: float = 1.0  # seconds between live transcript rounds of a turn; 0: no live transcripts
    final_margin: float = FINAL_MARGIN_S  # padding a final transcript's encoder reads after the turn (asr_options)
    loaded_final_margin: float | None = LOADED_FINAL_MARGIN_S  # ... while the engine is loaded (None: final_margin)
    silence_duration_ms: int | None = None  # server_vad's default pause that ends a turn (None: the API's 500 ms)
    speculative_replies: bool = True  # begin a reply during a pause, before it ends the turn (reply.Speculator)
    live_margin: float = LIVE_MARGIN_S  # padding a live transcript's encoder reads after the turn's audio
    early_quiet: int = EARLY_QUIET
    tail: int = TAIL
    idle_keep: int = IDLE_KEEP
    commit_after: int = COMMIT_AFTER
    recommit_after: int = RECOMMIT_AFTER
    commit_margin: int = COMMIT_MARGIN
    opening_round: float = OPENING_ROUND  # (a fraction of partial_interval)
    opening_max: int = OPENING_MAX
    opening_words: int = OPENING_WORDS
    opening_tokens: int = OPENING_TOKENS
    quiet_lead_ms: int = QUIET_LEAD_MS  # quiet at most this long before Silero's pause began it (vad)
    quiet_drop_db: float = QUIET_DROP_DB

    def __post_init__(self):
        if not 1 <= self.final_margin <= 30:
            raise UserError(f"final_margin must be in [1, 30] seconds (30: whole windows), got {self.final_margin}")
        if self.loaded_final_margin is not None and not 1 <= self.loaded_final_margin <= 30:
            raise UserError(
                f"loaded_final_margin must be in [1, 30] seconds (or None: the final margin always), "
                f"got {self.loaded_final_margin}"
            )
        if not 0 <= self.partial_interval <= 10:
            raise UserError(
                f"partial_interval must be in [0, 10] seconds (0: no live transcript deltas), "
                f"got {self.partial_interval}"
            )
        if not 0 < self.live_margin <= 30:
            raise UserError(f"live_margin must be in (0, 30] seconds, got {self.live_margin}")
        if not 0 < self.opening_round <= 1:
            raise UserError(f"opening_round must be in (0, 1] partial intervals, got {self.opening_round}")
        if self.opening_words < 0 or self.opening_tokens < 1:
            raise UserError(
                f"opening_words must be >= 0 and opening_tokens >= 1, got {self.opening_words}, {self.opening_tokens}"
            )
        for name in ("early_quiet", "tail", "idle_keep", "commit_margin", "opening_max", "quiet_lead_ms"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.commit_margin < self.commit_after <= 30 * RATE:
            raise UserError(
                f"commit_after must be above commit_margin ({self.commit_margin} samples) and at most 30 s "
                f"({30 * RATE} samples), got {self.commit_after}"
            )
        if not self.commit_margin < self.recommit_after <= self.commit_after:
            raise UserError(
                f"recommit_after must be above commit_margin ({self.commit_margin} samples) and at most commit_after "
                f"({self.commit_after} samples), got {self.recommit_after}"
            )
        if self.quiet_drop_db <= 0:
            raise UserError(f"quiet_drop_db must be > 0, got {self.quiet_drop_db}")

    @classmethod
    def from_options(cls, options) -> TurnPolicy:
        """The policy of a server's options (ServerOptions, or anything with its turn-taking fields)."""
        return cls(
            partial_interval=options.partial_interval,
            final_margin=options.final_margin,
            loaded_final_margin=options.loaded_final_margin,
            silence_duration_ms=options.silence_duration_ms,
            speculative_replies=options.speculative_replies,
        )

    def transcribe_options(self, cfg) -> tuple[TranscribeOptions, TranscribeOptions]:
        """(final, live) transcriber options of the turns of a session configured by `cfg` (asr_options)."""
        return turn_options(cfg, self.final_margin, self.live_margin)


DEFAULT_POLICY = TurnPolicy()
