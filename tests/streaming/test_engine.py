"""The shared engine's pieces on the real embedded models: prefix caching across a conversation's turns
in the continuous LM batch, partial transcripts stopped by their turn's final one, promoted to final
priority or superseded, semantic_vad's turn rules, and the energy tracker that times pauses from
where the input went quiet."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from speechrt.streaming.engine import Work
from speechrt.streaming.realtime.vad import (
    EAGERNESS,
    FRAME_MS,
    QUIET_LEAD_MS,
    QuietTracker,
    ServerVadConfig,
    TurnDetector,
    transcript_finished,
)

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}


@pytest.fixture(scope="module")
def lm():
    import speechrt

    return speechrt.load_lm(backend="torch")


async def hold_worker(eng, audio, seconds: float, key, live: bool = False) -> asyncio.Future:
    """Start a final transcript of `audio` (`live`: a live one, that opens a turn's text) whose step the worker holds
    for `seconds` first (an injected stall), so that what is submitted meanwhile queues -> its future, once the
    worker is in that step."""
    from speechrt.streaming.engine import Fault

    while eng.stalled_for() != 0:  # the step before (a result already delivered may still be ending)
        await asyncio.sleep(0.002)
    eng.faults.add(Fault("asr", stall_s=seconds))
    busy = asyncio.ensure_future(eng.transcribe(audio, Work.OPENING if live else Work.FINAL, key=key))
    while eng.stalled_for() == 0:
        await asyncio.sleep(0.002)
    return busy


@contextlib.asynccontextmanager
async def warm_engine(asr):
    """A started Engine over `asr`, once its warm-up has run (so the test times the real work); stopped after."""
    from speechrt.streaming.engine import Engine

    eng = Engine(asr)
    eng.start()
    try:
        assert await asyncio.to_thread(eng.wait_warm, 120)
        yield eng
    finally:
        eng.stop()


def _run(batcher, reqs):
    """Step the batcher until every request finished; each request's text and finish reason."""
    out = {id(r): ["", None] for r in reqs}
    for r in reqs:
        r.emit = (
            lambda rr: (
                lambda item: (out[id(rr)].__setitem__(0, out[id(rr)][0] + item[0]), out[id(rr)].__setitem__(1, item[1]))
            )
        )(r)
        batcher.submit(r)
    while batcher.has_work():
        batcher.step()
    return [tuple(out[id(r)]) for r in reqs]


def test_prefix_cache_reuses_a_conversations_positions(lm, one_cpu_thread):
    """Turn 2 of a conversation prefills only what its prompt adds to turn 1's cached prompt and answer,
    and gives the same greedy answer as a fresh prefill; another conversation never reuses them."""
    from speechrt.pipelines.generation import GenerationOptions
    from speechrt.pipelines.lm_batching import LMRequest

    opts = GenerationOptions(max_tokens=24)
    cached = lm.batcher(max_batch=2, max_seq=512)
    turn1 = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    r1 = LMRequest(lm.encode_chat(turn1), opts, None, key="conv-a")
    ((answer, reason),) = _run(cached, [r1])
    assert "Paris" in answer and reason == "stop"
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And of Italy?"}]
    ids2 = lm.encode_chat(turn2)
    r2 = LMRequest(ids2, opts, None, key="conv-a")
    other = LMRequest(
        lm.encode_chat([SYSTEM, {"role": "user", "content": "What is two plus two?"}]), opts, None, key="conv-b"
    )
    got2, got_other = _run(cached, [r2, other])
    assert r2.reused >= len(r1.ids), (r2.reused, len(r1.ids))  # at least turn 1's whole prompt was reused
    assert r2.reused < len(ids2)
    assert other.reused == 0
    fresh = lm.batcher(max_batch=2, max_seq=512)
    ref2, ref_other = _run(fresh, [LMRequest(ids2, opts, None), LMRequest(other.ids, opts, None)])
    assert got2 == ref2 and got_other == ref_other
    assert "Rome" in got2[0]
    # a request cancelled before it began leaves nothing to reuse
    r3 = LMRequest(ids2, opts, None, key="conv-c")
    r3.cancelled = True
    _run(cached, [r3])
    assert all(k != "conv-c" for k, _ in cached.retained.values())
    # one cancelled while it generates (a reply dropped when speech resumed, or barged into) leaves its prompt and
    # the tokens it fed: the key's next request reads none of them again and answers as a fresh prefill does
    r4 = LMRequest(ids2, opts, lambda piece: None, key="conv-d")
    cached.submit(r4)
    for _ in range(4):
        cached.step()
    assert r4.slot >= 0 and len(r4.fed) >= 2
    r4.cancelled = True
    cached.step()
    assert r4.slot == -1 and ("conv-d", ids2 + r4.fed) in cached.retained.values()
    r5 = LMRequest(ids2, opts, None, key="conv-d")
    assert _run(cached, [r5]) == [ref2]
    assert r5.reused == len(ids2) - 1  # (a prompt's last token always runs: its logits)


def test_final_transcript_stops_the_sessions_running_partial(asr, synth):
    """A final transcript stops the running partial (it resolves to None) and is served next; the other
    key's pending partial still runs after it."""
    speech = synth("The museum opens at nine and closes at five on weekdays.")

    async def main():
        async with warm_engine(asr) as eng:
            part_a = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="a"))
            part_b = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="b"))
            while not eng.running_keys():
                await asyncio.sleep(0.002)
            running = eng.running_keys()[0]
            final = await eng.transcribe(speech, key=running)
            results = {running: await (part_a if running == "a" else part_b)}
            other = "b" if running == "a" else "a"
            results[other] = await (part_b if running == "a" else part_a)
            return final, results, running, other, eng.metrics.asr_cancelled

    final, results, running, other, cancelled = asyncio.run(main())
    assert "museum" in final.text.lower()
    assert results[running] is None and cancelled == 1
    assert results[other] is not None and results[other].text == final.text


def test_transcript_finished():
    for done in ("What is the capital of France?", "Turn off the lights.", "Wow!", "I'm done."):
        assert transcript_finished(done), done
    for open_ in (
        "",
        "What is the",
        "I want to go to Paris and",
        "Please book a table for",
        "So...",
        "I think that",
        "Tell me about the um.",
        "Add milk, eggs and.",
        "Turn off the lights,",
    ):
        assert not transcript_finished(open_), open_


def test_semantic_turn_detector():
    """semantic_vad: a pause ends the turn after EAGERNESS[e][0] ms once the transcript reads finished,
    after EAGERNESS[e][1] ms otherwise; server_vad keeps its fixed silence."""
    speech, silence = [0.9] * 10, [0.05]
    for eagerness, (done_ms, open_ms) in EAGERNESS.items():
        td = TurnDetector(ServerVadConfig(type="semantic_vad", eagerness=eagerness))
        assert td.feed(speech) == [("start", 0)]
        assert td.feed(silence * 3) == [] or open_ms <= 3 * FRAME_MS
        assert td.pause_ms == 10 * FRAME_MS
        ev = td.finish_pause(True)
        if done_ms <= 3 * FRAME_MS:
            assert ev == [("stop", 10 * FRAME_MS)]
        else:
            assert ev == [] and td.feed(silence * (done_ms // FRAME_MS)) == [("stop", 10 * FRAME_MS)]
        # an unfinished transcript: the turn waits for the long pause
        td.feed(speech)
        td.feed(silence)
        pause = td.pause_ms
        assert td.finish_pause(False) == []
        n = -(-open_ms // FRAME_MS)  # silent frames the open pause needs
        assert td.feed(silence * (n - 2)) == []
        assert td.feed(silence) == [("stop", pause)]
        # speech resumed before the transcript came: nothing to end
        td.feed(speech)
        assert td.finish_pause(True) == []
    plain = TurnDetector(ServerVadConfig(silence_duration_ms=200))
    plain.feed([0.9] * 5)
    assert plain.feed([0.05] * 6) == [] and plain.feed([0.05]) == [("stop", 5 * FRAME_MS)]
    assert plain.finish_pause(True) == []  # no pause in progress after the stop
    assert ServerVadConfig(type="semantic_vad").to_api() == {
        "type": "semantic_vad",
        "eagerness": "auto",
        "create_response": True,
        "interrupt_response": True,
    }


def test_quiet_tracker_marks_where_the_input_went_quiet():
    """Loud, then 30 dB down or digital silence: quiet from the first quiet hop, whatever the chunking;
    a loud hop ends the quiet run; background noise within 30 dB of the speech is never quiet; a gap in
    the stream restarts the hop grid at the new position."""
    rng = np.random.default_rng(1)
    hop = QuietTracker.HOP
    loud = (0.3 * np.sin(np.arange(40 * hop) * 0.07)).astype(np.float32)
    soft = (0.005 * rng.standard_normal(23 * hop)).astype(np.float32)  # ~35 dB below the tone
    audio = np.concatenate([loud, soft, np.zeros(17 * hop + 55, np.float32)])
    for chunk in (len(audio), 1600, 517, 160):
        t = QuietTracker()
        seen = []
        for i in range(0, len(audio), chunk):
            t.feed(audio[i : i + chunk], i)
            seen.append(t.quiet_since)
        assert t.quiet_since == 40 * hop, chunk
        assert seen[0] is None or chunk == len(audio)
    t.feed(loud[: 3 * hop], len(audio))
    assert t.quiet_since is None  # a loud hop (the stream went on where it left off)
    t.feed(np.zeros(5 * hop, np.float32), len(audio) + 3 * hop)
    assert t.quiet_since == -(-(len(audio) + 3 * hop) // hop) * hop  # the first hop with no loud sample
    noisy = QuietTracker()
    noise = (0.03 * rng.standard_normal(60 * hop)).astype(np.float32)  # 20 dB below the tone
    noisy.feed(np.concatenate([loud + noise[: len(loud)], noise]), 0)
    assert noisy.quiet_since is None
    jump = QuietTracker()
    jump.feed(loud[:1000], 0)
    jump.feed(np.zeros(8 * hop, np.float32), 50_000)  # a gap: the grid restarts at 50_000
    assert jump.quiet_since == 50_000


def test_pause_timed_from_where_the_input_went_quiet():
    """server_vad: the pause ends the turn `silence_duration_ms` after the input went quiet when Silero's
    first silent frame came at most QUIET_LEAD_MS later; a quiet start further back, or after that
    frame, does not count. The turn's end (pause_ms, the stop event) stays Silero's."""
    speech, silence = [0.9] * 10, [0.05]
    td = TurnDetector(ServerVadConfig(silence_duration_ms=200))
    td.feed(speech)
    quiet = 10 * FRAME_MS - 96  # the energy fell three frames before Silero's first silent frame
    assert td.feed(silence * 3, quiet) == []
    assert td.feed(silence, quiet) == [("stop", 10 * FRAME_MS)]  # 4 frames + 96 ms >= 200 ms
    for late_or_early in (10 * FRAME_MS + 40, 10 * FRAME_MS - QUIET_LEAD_MS - 1, None):
        td = TurnDetector(ServerVadConfig(silence_duration_ms=200))
        td.feed(speech)
        assert td.feed(silence * 6, late_or_early) == []
        assert td.feed(silence, late_or_early) == [("stop", 10 * FRAME_MS)]  # 7 frames: Silero's timing
    # semantic_vad: a finished transcript at eagerness medium needs 100 ms of quiet: here already
    td = TurnDetector(ServerVadConfig(type="semantic_vad", eagerness="medium"))
    td.feed(speech)
    assert td.feed(silence, 10 * FRAME_MS - 80) == []
    assert td.finish_pause(True) == [("stop", 10 * FRAME_MS)]


def test_promoted_and_superseded_partials(asr, synth):
    """promote(): a running partial is no longer stopped by finals, a queued one is served as a final
    (before partials queued ahead of it); supersede: a newer partial of the same key stops the running
    one. has_spare_time() is False while anything is queued."""
    speech = synth("The museum opens at nine and closes at five on weekdays.")
    short = speech[: len(speech) // 2]

    from speechrt.streaming.engine import Fault

    async def main():
        async with warm_engine(asr) as eng:
            assert eng.has_spare_time() and not eng.promote("nobody")
            # each running partial below has its step held for 1 s first (an injected stall), so that it is
            # still running when the test acts on it, however loaded the machine is
            eng.faults.add(Fault("asr", stall_s=1.0))
            running = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="run"))
            while "run" not in eng.running_keys():
                await asyncio.sleep(0.002)
            queued_a = asyncio.ensure_future(eng.transcribe(short, Work.LIVE, key="a"))
            queued_b = asyncio.ensure_future(eng.transcribe(short, Work.LIVE, key="b"))
            await asyncio.sleep(0)
            assert not eng.has_spare_time()
            assert eng.promote("run") and eng.promote("b")
            final = await eng.transcribe(speech, key="other")  # would stop an unpromoted running partial
            order = []
            for name, fut in (("a", queued_a), ("b", queued_b)):
                fut.add_done_callback(lambda _f, n=name: order.append(n))
            got = [await running, await queued_a, await queued_b]
            # supersede: the running partial of key "s" stops for the newer one
            eng.faults.add(Fault("asr", stall_s=1.0))
            old = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="s"))
            while "s" not in eng.running_keys():
                await asyncio.sleep(0.002)
            new = await eng.transcribe(speech, Work.EARLY, key="s")
            return final, got, order, await old, new, eng.metrics.asr_cancelled

    final, (run, a, b), order, old, new, cancelled = asyncio.run(main())
    assert "museum" in final.text.lower()
    assert run is not None and run.text == final.text  # promoted: not stopped by the final
    assert a is not None and b is not None and a.text == b.text
    assert order == ["b", "a"]  # the promoted one went ahead as a final
    assert old is None and new is not None and new.text == final.text and cancelled == 1


def test_opening_partials_go_first_and_finals_do_not_stop_them(asr, synth):
    """A live transcript that opens a turn's text (opening=True) runs before live transcripts queued earlier,
    and a final transcript arriving while it runs does not stop it (its audio is short)."""
    speech = synth("The museum opens at nine and closes at five on weekdays.")
    short = speech[: len(speech) // 3]

    async def main():
        async with warm_engine(asr) as eng:
            busy = await hold_worker(eng, speech, 1.0, "busy")
            order = []
            old = asyncio.ensure_future(eng.transcribe(short, Work.LIVE, key="old"))
            # (the whole sentence: long enough to be seen running)
            new = asyncio.ensure_future(eng.transcribe(speech, Work.OPENING, key="new"))
            for name, fut in (("old", old), ("new", new)):
                fut.add_done_callback(lambda _f, n=name: order.append(n))
            await busy
            while "new" not in eng.running_keys():
                assert not new.done(), "the opening transcript ended before it was seen running"
                await asyncio.sleep(0.001)
            final = await eng.transcribe(speech, key="other")  # stops running live transcripts, not this one
            return order, await new, await old, final, eng.metrics.asr_cancelled

    order, new, old, final, cancelled = asyncio.run(main())
    assert order == ["new", "old"]
    assert new is not None and new.text == final.text and cancelled == 0
    assert old is not None and old.text and "museum" in final.text.lower()


def test_a_waiting_live_transcript_takes_its_turns_newest_audio():
    """The input buffer hands its newest samples to the engine's thread (AudioBuffer.since: None once it dropped
    the start asked for), whole and in order while the event loop appends and joins chunks (without its lock
    this fails: a chunk appended during a join is lost)."""
    import threading

    from speechrt.streaming.realtime.audio_buffer import AudioBuffer

    buf = AudioBuffer()
    buf.append(np.arange(10, dtype=np.float32))
    assert np.array_equal(buf.since(4), np.arange(4, 10)) and buf.since(buf.end).size == 0
    buf.drop_until(6)
    assert buf.since(4) is None and np.array_equal(buf.since(7), [7, 8, 9])
    # appends on one thread while another reads: every read is a whole, ordered prefix of what was written
    grow, seen, stop = AudioBuffer(), [], threading.Event()

    def reader():
        while not stop.is_set():
            a = grow.since(0)
            seen.append(bool(np.array_equal(a, np.arange(len(a), dtype=np.float32))))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(2000):
        grow.append(np.arange(i * 7, i * 7 + 7, dtype=np.float32))
        if i % 10 == 0:
            grow.slice(0, grow.end)  # (the event loop's reads join the chunks)
    stop.set()
    t.join()
    assert seen and all(seen) and np.array_equal(grow.since(0), np.arange(14000, dtype=np.float32))


def test_a_queued_live_transcript_is_of_the_newest_audio(asr, synth):
    """A live transcript asked for with the turn's first words transcribes what the turn holds when the worker
    takes it (the audio grew while it waited behind other work); `fresh` returning None (or failing) keeps the
    audio given."""
    sentence = "The museum opens at nine and closes at five on weekdays."
    speech = synth(sentence)
    start = speech[: len(speech) // 5]  # a word or two

    async def main():
        async with warm_engine(asr) as eng:
            busy = await hold_worker(eng, speech, 0.5, "busy")
            grown = asyncio.ensure_future(eng.transcribe(start, Work.LIVE, key="a", fresh=lambda: speech))
            kept = asyncio.ensure_future(eng.transcribe(start, Work.LIVE, key="b", fresh=lambda: None))
            broken = asyncio.ensure_future(eng.transcribe(start, Work.LIVE, key="d", fresh=lambda: 1 / 0))
            await busy
            return await grown, await kept, await eng.transcribe(start, Work.LIVE, key="c"), await broken

    grown, kept, alone, broken = asyncio.run(main())
    assert broken is not None and broken.text == alone.text  # (a failing `fresh` is logged; the worker goes on)
    assert grown is not None and "weekdays" in grown.text.lower() and "museum" in grown.text.lower()
    assert kept is not None and kept.text == alone.text and "weekdays" not in kept.text.lower()


def test_live_text_opens_with_one_hypothesis_then_follows_agreement():
    """Turn.agree: until words are sent, a hypothesis's words but its last (OPENING_WORDS at most) go out; then
    only words two hypotheses agree on, compared without case or punctuation; the final transcript completes
    the live text if it begins with it."""
    from speechrt.streaming.realtime.policy import OPENING_WORDS
    from speechrt.streaming.realtime.turn import Turn

    assert OPENING_WORDS == 1
    t = Turn("item", 0, sent=[])
    assert t.agree("Please") is None  # one word: the one being spoken
    assert t.agree("Please book a tab-") == "Please"
    assert t.agree("please book a table,") == " book a"  # "tab-" and "table," differ
    assert t.agree("Please book a table for two") == " table"
    assert t.final_delta("Please book a table for two at seven.") == " for two at seven."
    assert t.sent == ["Please", "book", "a", "table"]
    u = Turn("item", 0, sent=[])
    assert u.agree("The pack, the") == "The"
    assert u.agree("A package") is None and u.final_delta("A package should arrive.") is None  # unlike the live text
    assert Turn("item", 0).agree("Words") is None  # a session without live deltas


def test_a_word_that_ends_two_hypotheses_alike_is_not_agreed_on():
    """Two hypotheses over audio that ends inside the same word (an early transcript begun in a stop consonant's
    silence, a live round just after it; two opening rounds stopped at OPENING_TOKENS inside it) may both hear
    its first part: "drive to the air?" twice, then "airport?" in the final transcript. The word that ends both is
    not agreed on; it is once a hypothesis goes past it."""
    from speechrt.streaming.realtime.turn import Turn

    t = Turn("item", 0, sent=["How", "long"])
    assert t.agree("How long does it take to drive to the air?") is None
    assert t.agree("How long does it take to drive to the air?") == " does it take to drive to the"
    assert t.agree("How long does it take to drive to the airport? I") is None  # "airport?" heard once
    assert t.agree("How long does it take to drive to the airport? I need") == " airport? I"
    assert t.final_delta("How long does it take to drive to the airport? I need a taxi.") == " need a taxi."
    u = Turn("item", 0, sent=[])
    assert u.agree("Ac") is None and u.agree("Ac") is None  # an opening round's piece of a word, twice
    assert u.agree("Please book a tab") == "Please" and u.agree("Please book a tab") == " book a"


def test_a_later_pause_replaces_the_turns_queued_final(asr, synth):
    """A final transcript of a turn (up to a pause) still queued when one of the same turn arrives (up to a
    later pause) is replaced: it resolves to None and only the newer one runs. A queued final of the
    session's previous turn stays (its transcript is still owed)."""
    speech = synth("The museum opens at nine and closes at five on weekdays.")
    short = speech[: len(speech) // 2]

    async def main():
        async with warm_engine(asr) as eng:
            busy = await hold_worker(eng, speech, 2.0, "other")
            previous = asyncio.ensure_future(eng.transcribe(short, key="s", turn="t0"))
            first = asyncio.ensure_future(eng.transcribe(short, key="s", turn="t1"))
            await asyncio.sleep(0)
            second = await eng.transcribe(speech, key="s", turn="t1")
            return await busy, await previous, await first, second, eng.metrics.finals_superseded

    busy, previous, first, second, superseded = asyncio.run(main())
    assert first is None and superseded == 1
    assert "museum" in second.text.lower() and busy.text == second.text
    assert previous is not None and previous.text and previous.text != second.text


def test_local_agreement_commits_what_two_rounds_share():
    """A long turn commits the leading segments two commit rounds over the same start agree on (same words,
    ends within 0.5 s) and that end COMMIT_MARGIN before the end of the audio transcribed; the first
    disagreement stops it."""
    from speechrt.streaming.realtime.agreement import RATE, agreed
    from speechrt.streaming.realtime.policy import COMMIT_MARGIN

    before = [(0.0, 2.0, " Book a table."), (2.0, 4.1, " For two."), (4.1, 6.0, " Tonight")]
    now = [(0.0, 2.1, " Book a  table."), (2.1, 4.0, " For two."), (4.0, 6.5, " Tonight, please.")]
    assert [s[2] for s in agreed(before, now, 10 * RATE)] == [" Book a  table.", " For two."]
    assert len(agreed(before, now, int(4.0 * RATE) + COMMIT_MARGIN)) == 2
    assert len(agreed(before, now, int(3.9 * RATE) + COMMIT_MARGIN)) == 1  # the second ends too near the end
    moved = [(0.0, 2.7, " Book a table.")] + now[1:]  # the same words, but ending 0.7 s later: not agreed
    assert agreed(before, moved, 10 * RATE) == [] and agreed([], now, 10 * RATE) == []


def test_recent_load_is_the_busy_share_of_the_last_window():
    from speechrt.streaming.engine import RecentLoad

    load = RecentLoad(window=2.0)
    assert load.busy(100.0) == 0.0
    load.add(97.0, 98.5)  # half of it in the window that ends at 100
    load.add(99.0, 99.5, live=True)
    assert load.busy(100.0) == pytest.approx((0.5 + 0.5) / 2.0)
    assert load.busy(100.0, live=False) == pytest.approx(0.5 / 2.0)  # firm work: all but live transcripts
    assert load.busy(101.0) == pytest.approx(0.5 / 2.0) and len(load.steps) == 1  # the first step expired
    load.add(99.5, 103.0)
    assert load.busy(103.0) == 1.0
    for t in range(200):  # steps no one asks about do not pile up
        load.add(200.0 + t, 200.5 + t)
    assert len(load.steps) <= 3


def test_finals_take_the_loaded_margin_only_while_the_engine_is_loaded(asr, synth):
    """A final transcript taken after the worker spent the last 2 s on firm work (a held final) encodes its turn plus
    the loaded margin (3 s), not the session's 10 s, and is counted, as is an early transcript (final options, run
    among the live ones); a live one keeps its 1 s. A final taken by an idle engine, or by one busy with live
    transcripts only (they fill a fast CPU's spare time), keeps its 10 s. All give the sentence's words."""
    from speechrt.streaming.asr_options import FINAL_MARGIN_S, LOADED_FINAL_MARGIN_S, asr_options
    from speechrt.streaming.engine import LOADED_BUSY, LOADED_FIRM, Engine
    from speechrt.streaming.realtime.config import SessionConfig

    speech = synth("Please book a table for four at seven tonight.")
    opts = asr_options(SessionConfig(type="transcription"))
    assert opts.trim_margin == FINAL_MARGIN_S > LOADED_FINAL_MARGIN_S and 0 < LOADED_FIRM < LOADED_BUSY < 1

    async def main():
        eng = Engine(asr, loaded_margin=LOADED_FINAL_MARGIN_S)
        m = eng.metrics
        eng.start()
        try:
            assert await asyncio.to_thread(eng.wait_warm, 120)
            await asyncio.sleep(2.1)  # the warm-up leaves the window
            out = {"idle": await eng.transcribe(speech, key="a", turn="t0", options=opts)}
            out["calm"] = m.finals_loaded_margin, m.busy_fraction
            busy = await hold_worker(eng, speech, 2.0, "other")
            # a final, an early transcript (final options, run among the live ones) and a live one queue meanwhile
            loaded = asyncio.ensure_future(eng.transcribe(speech, key="b", turn="t0", options=opts))
            early = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="c", options=opts))
            live = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="d"))
            await busy
            out.update(loaded=await loaded, early=await early, live=await live)
            out["firm"] = m.finals_loaded_margin, m.busy_fraction, m.firm_fraction
            await asyncio.sleep(2.1)  # the held final leaves the window
            busy = await hold_worker(eng, speech, 2.0, "other", live=True)  # busy, on live work only
            after_live = asyncio.ensure_future(eng.transcribe(speech, key="e", turn="t0", options=opts))
            await busy
            out["after_live"] = await after_live
            out["live_only"] = m.finals_loaded_margin, m.busy_fraction, m.firm_fraction
            return out
        finally:
            eng.stop()

    out = asyncio.run(main())
    assert out["calm"][0] == 0 and out["calm"][1] < LOADED_BUSY
    count, busy, firm = out["firm"]
    assert count == 2 and busy >= LOADED_BUSY and firm >= LOADED_FIRM  # the final and the early one (not the live)
    count, busy, firm = out["live_only"]
    assert count == 2 and busy >= LOADED_BUSY and firm < LOADED_FIRM  # busy, but with live work: the full margin
    for key in ("idle", "loaded", "early", "live", "after_live"):
        assert "table" in out[key].text.lower() and "tonight" in out[key].text.lower(), out[key].text


def test_local_agreement_by_words_commits_a_prefix_of_fast_speech():
    """Fast speech without pauses (issue 49): two commit rounds' segments agree on none (one segment of all of it,
    its end moving; a word that flips), but their words do: the leading words they share, a flipped word or a
    fragment at the audio's start let through where the words around it agree, up to the last word that ends
    COMMIT_MARGIN before the end of the audio transcribed."""
    from speechrt.pipelines.whisper_timing import Word
    from speechrt.streaming.realtime.agreement import RATE, agreed, agreed_words, shared_words
    from speechrt.streaming.realtime.policy import COMMIT_MARGIN

    before = "The old lighthouse stood at the edge of the cliff for more".split()
    now = "The old Lyke house stood at the edge of the cliff for more than two hundred years.".split()
    assert agreed([(0.0, 9.0, " ".join(before))], [(0.0, 12.0, " ".join(now))], 20 * RATE) == []
    assert shared_words(before, now) == 13  # "lighthouse" / "Lyke house": the words around them agree
    assert shared_words(["been", *now[5:]], now[5:]) == len(now[5:])  # a fragment at the start
    assert shared_words(before, "The old man sat by the fire".split()) == 2  # then nothing agrees
    words = [Word(0.3 * i, 0.3 * i + 0.25, " " + w, 0.9) for i, w in enumerate(now)]
    samples = round(words[8].end * RATE) + COMMIT_MARGIN  # words 0-8 end COMMIT_MARGIN before the end
    assert agreed_words(before, words, samples) == 9
    assert agreed_words(before, words, 30 * RATE) == 13
    assert agreed_words(["A", *before], words, 30 * RATE) == 0


def test_a_word_commit_cuts_at_the_quietest_seam():
    """A commit by words cuts the audio at the quietest 10-ms hop near the boundary between two words, choosing
    among the boundaries of its last 4 s of words one after a clause's end (punctuation), else the quietest (not
    a word's first sound)."""
    from speechrt.pipelines.whisper_timing import Word
    from speechrt.streaming.realtime.long_turn import MIN_WORDS, seam
    from speechrt.streaming.realtime.policy import RATE

    rng = np.random.default_rng(0)
    audio = rng.uniform(-0.5, 0.5, 10 * RATE).astype(np.float32)  # speech without a pause: loud throughout
    words = [Word(0.4 * i, 0.4 * i + 0.4, f" w{i}", 0.9) for i in range(20)]
    dip = round(words[13].end * RATE) + RATE // 50  # quiet 20-40 ms after word 13's end (times are rough)
    audio[dip : dip + RATE // 50] *= 0.01
    k, cut = seam(audio, words, 16)
    assert k == 14 and dip <= cut < dip + RATE // 50
    words[11].word += ","  # a clause ends after word 11: its boundary goes first, the quietest point near it
    k, cut = seam(audio, words, 16)
    assert k == 12 and abs(cut - round(words[11].end * RATE)) <= RATE // 20
    words[11].word = " w11"
    audio[:] = 0.3  # no quiet seam at all: the last boundary
    k, cut = seam(audio, words, 16)
    assert k == 16 and abs(cut - round(words[15].end * RATE)) <= RATE // 20 and k >= MIN_WORDS


def test_a_long_final_runs_after_the_short_ones_queued_with_it():
    """A final of over LONE_FINAL of audio (a long turn's rest) is not batched with shorter ones, whose batch would
    end only when its many tokens are decoded: the short ones queued with it go first, then it (before a short
    one that came later: it waits for one batch at most)."""
    from speechrt.streaming.engine.transcripts import LONE_FINAL, TranscriptJob, TranscriptQueue

    def job(n, key):
        return TranscriptJob(np.zeros(n, np.float32), None, None, None, 0.0, key=key)

    q = TranscriptQueue()
    for j in (job(LONE_FINAL + 1, "long"), job(RATE_16K * 2, "a"), job(RATE_16K * 3, "b")):
        q.submit(j)
    assert [j.key for j in q.take_finals(8)] == ["a", "b"]
    q.submit(job(RATE_16K * 2, "c"))
    assert [j.key for j in q.take_finals(8)] == ["long"]
    assert [j.key for j in q.take_finals(8)] == ["c"]
    q.submit(job(LONE_FINAL + 1, "alone"))
    assert [j.key for j in q.take_finals(8)] == ["alone"] and not q.finals


def test_a_neighbours_final_is_not_held_behind_a_long_final(asr, synth):
    """On the engine: a long turn's final (12 s of speech) and a short turn's, queued together, are not one batch:
    the short one's transcript comes first (a batch's rows come back when its longest is decoded)."""
    long_speech = np.concatenate([synth(s) for s in SENTENCES_12S])
    short = synth("Turn off the lights in the kitchen.")

    async def main():
        async with warm_engine(asr) as eng:
            busy = await hold_worker(eng, short, 1.0, "other")
            order = []
            jobs = [
                asyncio.ensure_future(eng.transcribe(a, key=k, turn=k))
                for k, a in (("long", long_speech), ("short", short))
            ]
            for k, fut in zip(("long", "short"), jobs):
                fut.add_done_callback(lambda _f, k=k: order.append(k))
            await busy
            return order, [await j for j in jobs]

    order, (long_r, short_r) = asyncio.run(main())
    assert len(long_speech) > 12 * RATE_16K
    assert order == ["short", "long"], order
    assert "kitchen" in short_r.text.lower() and "museum" in long_r.text.lower()


RATE_16K = 16000
SENTENCES_12S = [
    "The museum opens at nine and closes at five on weekdays.",
    "Please book a table for two at seven tonight.",
    "The package should arrive on Monday morning.",
    "How long does it take to drive to the airport?",
]


@pytest.fixture(scope="module")
def tts():
    import speechrt

    return speechrt.load_tts(backend="torch")


def test_the_voice_and_the_language_model_do_not_wait_behind_speech_recognition(asr, lm, tts, synth):
    """Each model family has its own worker thread (issue 51): while the recognizer's worker is held in one step
    (a final, stalled 1.5 s first), a reply's tokens (the language model) and a sentence's audio (the voice) are
    made and delivered, their steps inside the held one's span; a stall watch on the language model's family does
    not fire (the recognizer's does). Within speech recognition finals still go first: a final queued after a live
    transcript comes back before it. Stopping the engine ends every worker thread."""
    from speechrt.streaming.engine import Engine, EngineStalled

    speech = synth("Turn off the lights in the kitchen.")

    async def main():
        eng = Engine(asr, lm, tts=tts)
        eng.start()
        try:
            assert await asyncio.to_thread(eng.wait_warm, 120)
            order = []
            busy = await hold_worker(eng, speech, 1.5, "held")
            busy.add_done_callback(lambda _f: order.append("held"))
            live = asyncio.ensure_future(eng.transcribe(speech, Work.LIVE, key="live"))
            final = asyncio.ensure_future(eng.transcribe(speech, key="final", turn="t"))
            for name, fut in (("live", live), ("final", final)):
                fut.add_done_callback(lambda _f, n=name: order.append(n))
            ids = lm.encode_chat([SYSTEM, {"role": "user", "content": "Name a color."}])
            _, q = eng.generate(ids, lm.options(max_tokens=4))
            while not (await eng.wait(q.get(), 0.5, "lm")).finish_reason:
                pass
            order.append("lm")
            _, chunks = eng.stream(tts.synthesize("Hello there."), "tts")
            while not isinstance(await eng.wait(chunks.get(), 0.5, "tts"), StopAsyncIteration):
                pass
            order.append("tts")
            with pytest.raises(EngineStalled):  # the recognizer's own watch sees its stall
                await eng.wait(asyncio.sleep(5), 0.2, "asr")
            results = await busy, await live, await final
            steps = {f: list(w.steps) for f, w in eng.workers.items()}
        finally:
            eng.stop()
        return order, results, steps, [w.thread.is_alive() for w in eng.workers.values()]

    order, results, steps, alive = asyncio.run(main())
    assert order[:3] == ["lm", "tts", "held"] and order.index("final") < order.index("live"), order
    held = max(steps["asr"], key=lambda s: s[1] - s[0])  # the stalled step
    for family in ("lm", "tts"):
        assert any(held[0] <= s[0] and s[1] <= held[1] for s in steps[family]), (family, held, steps[family])
    assert all("kitchen" in r.text.lower() for r in results), [r.text for r in results]
    assert alive == [False, False, False]


def test_a_long_final_yields_to_a_neighbours_final_and_goes_on_from_its_tokens(asr, synth):
    """A final over LONE_FINAL (a long turn's rest) that is decoding when a short final is queued (a neighbour's
    finished turn, issue 49) stops at its next step and goes back to the queue after the short one, its tokens so far
    its draft: run again, it checks them in one pass and ends with the transcript it would have made alone. A later
    final of its turn makes it unwanted; after MAX_YIELDS it runs to its end."""
    from speechrt.streaming.asr_options import LIVE
    from speechrt.streaming.engine import Metrics
    from speechrt.streaming.engine.faults import FaultPlan
    from speechrt.streaming.engine.transcripts import (
        LONE_FINAL,
        MAX_YIELDS,
        YIELDED,
        TranscriptJob,
        TranscriptQueue,
        run_jobs,
    )

    long_speech = np.concatenate([synth(s) for s in SENTENCES_12S[:3]])
    opts = LIVE  # the encoder over the audio and 1 s more, as the server's transcripts

    def job(audio, key):
        return TranscriptJob(audio, opts, None, None, 0.0, key=key, turn="t")

    alone = asr.transcribe_batch([long_speech], opts)[0]
    asks = []

    def urgent():  # a short final comes once the long one has decoded a few tokens
        asks.append(1)
        return len(asks) > 8

    q, m = TranscriptQueue(), Metrics()
    long = job(long_speech, "long")
    q.submit(long)
    assert q.take_finals(8) == [long]
    [(j, r, e)] = run_jobs(asr, [long], False, FaultPlan(), m, urgent)
    assert j is long and r is YIELDED and e is None and 0 < len(long.draft) < len(alone.tokens)
    assert long.draft == alone.tokens[: len(long.draft)]
    short = job(synth("Turn off the lights in the kitchen."), "short")
    q.submit(short)
    assert q.requeue(long) and [x.key for x in q.take_finals(8)] == ["short"] and q.take_finals(8) == [long]
    long.yields = MAX_YIELDS  # (it has yielded enough: it runs to its end, short finals queued or not)
    [(_, r, _)] = run_jobs(asr, [long], False, FaultPlan(), m, lambda: True)
    assert r.tokens == alone.tokens and "museum" in r.text.lower(), r.text
    q.submit(job(long_speech, "long"))  # a later final of its turn (a later pause) came meanwhile
    assert not q.requeue(long) and len(long_speech) > LONE_FINAL


def test_a_stopped_rounds_word_timing_is_not_run(asr, synth):
    """A long turn's commit round aligns its words on the engine (two steps of a streaming task); when the turn ends
    meanwhile, its round is stopped, and so is that task: its steps not begun are not run (the turn's final, or a
    neighbour's, would otherwise wait behind a decoder pass whose words nobody reads)."""
    from types import SimpleNamespace

    from speechrt.streaming.realtime.extras import aligned

    speech = synth("Turn off the lights in the kitchen.")
    session = SimpleNamespace(cfg=SimpleNamespace(language="en"))

    async def main():
        async with warm_engine(asr) as eng:
            tokens = (await eng.transcribe(speech, key="s")).tokens
            busy = await hold_worker(eng, speech, 0.5, "other")
            job = asyncio.ensure_future(aligned(session, eng, speech, tokens))
            while not eng.pending.tasks["asr"]:  # queued behind the held step
                await asyncio.sleep(0.002)
            task = eng.pending.tasks["asr"][0]
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            await busy
            while eng.queue_depth() or eng.stalled_for():
                await asyncio.sleep(0.01)
            return task

    task = asyncio.run(main())
    assert task.cancelled  # (before: it ran both steps for a round that was gone)
