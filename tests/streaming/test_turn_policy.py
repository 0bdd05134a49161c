"""realtime.policy.TurnPolicy: the turn-taking options and constants in one frozen object, built from the server's
options and checked when built, with errors that name the option and its range."""

from __future__ import annotations

import dataclasses

import pytest

from speechrt.errors import UserError
from speechrt.streaming.asr_options import FINAL_MARGIN_S, LIVE, asr_options
from speechrt.streaming.config import ServerOptions
from speechrt.streaming.realtime.config import SessionConfig
from speechrt.streaming.realtime.policy import COMMIT_AFTER, OPENING_TOKENS, RECOMMIT_AFTER, TurnPolicy


def test_the_policy_is_built_from_the_servers_options_and_frozen():
    o = ServerOptions(partial_interval=0.5, final_margin=6, silence_duration_ms=300, speculative_replies=False)
    p = TurnPolicy.from_options(o)
    assert (p.partial_interval, p.final_margin, p.silence_duration_ms, p.speculative_replies) == (0.5, 6, 300, False)
    assert p.loaded_final_margin == o.loaded_final_margin and p.commit_after == COMMIT_AFTER
    assert TurnPolicy().opening_tokens == OPENING_TOKENS and TurnPolicy().final_margin == FINAL_MARGIN_S
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.partial_interval = 2.0
    final, live = p.transcribe_options(SessionConfig(language="en", prompt="Ahoy."))
    assert final == asr_options(SessionConfig(language="en", prompt="Ahoy."), final_margin=6)
    assert live.trim_margin == 1.0 and live.language == "en" and live.initial_prompt == "Ahoy."
    assert asr_options(live=True) == LIVE  # the engine's default is a live transcript's options


def test_a_turn_commits_sooner_once_it_has_committed():
    """A long turn's live rounds commit past commit_after not committed, then, once it has committed, past
    recommit_after: the rest its final transcript decodes stays short."""
    from speechrt.streaming.realtime.turn import Turn

    t = Turn("item", 0)
    assert t.commit_after == COMMIT_AFTER > RECOMMIT_AFTER
    t.commit("The old lighthouse stood", 5 * 16000, 5.0)
    assert t.commit_after == RECOMMIT_AFTER
    t.live = object()  # with live rounds (which commit), no early or paused transcripts past it
    assert t.speculates(RECOMMIT_AFTER) and not t.speculates(RECOMMIT_AFTER + 1)


def test_a_long_turns_rest_is_transcribed_after_the_words_it_committed():
    """Once a long turn has committed, its transcripts (live rounds, commit rounds, the final of the rest) take the
    last words it committed as Whisper's previous text, after the session's prompt: each part is decoded going on
    from the words before it, not as the start of a new utterance (dense monologue WER 8.2-9.3 % before, 7.2-7.7 %
    with it; 7.7 % transcribed alone: docs/results-cpu.md)."""
    from speechrt.streaming.realtime.turn import CONTEXT_WORDS, Turn

    t = Turn("item", 0)
    assert t.prompted(LIVE) is LIVE
    said = " ".join(f"w{i}" for i in range(40))
    t.commit(said, 10 * 16000, 10.0)
    assert t.prompted(LIVE).initial_prompt == " ".join(said.split()[-CONTEXT_WORDS:])
    opts = dataclasses.replace(LIVE, initial_prompt="Ahoy.")
    assert t.prompted(opts).initial_prompt == "Ahoy. " + " ".join(said.split()[-CONTEXT_WORDS:])
    assert t.prompted(opts).trim_margin == opts.trim_margin


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("final_margin", 0.5, "final_margin must be in [1, 30]"),
        ("loaded_final_margin", 40, "loaded_final_margin must be in [1, 30]"),
        ("partial_interval", -1, "partial_interval must be in [0, 10]"),
        ("opening_round", 0, "opening_round must be in (0, 1]"),
        ("commit_after", 40 * 16000, "commit_after must be above commit_margin"),
        ("recommit_after", 20 * 16000, "recommit_after must be above commit_margin"),
        ("tail", -1, "tail must be >= 0"),
    ],
)
def test_a_policy_out_of_range_is_refused_naming_the_option(field, value, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("(", r"\(")):
        TurnPolicy(**{field: value})


def test_the_servers_options_are_checked_by_the_policy():
    with pytest.raises(UserError, match="partial_interval"):
        ServerOptions(partial_interval=11)
