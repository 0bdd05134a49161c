"""Sentences after the first, vocoded for throughput when enough audio is ahead of the listener."""

from __future__ import annotations

import time

import numpy as np
import pytest

from speechrt.pipelines.tts import RELAX_FACTOR, RELAX_MARGIN_S, load_tts, relaxed, throughput_windows

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

FIRST = (
    "When the morning train finally pulled into the quiet station, the travelers gathered their heavy bags "
    "and walked slowly toward the bridge."
)  # ~6 s of audio: ample ahead of what follows
REST = "The sky was grey. A dog barked twice."


@pytest.fixture(scope="module")
def torch_tts():
    return load_tts(backend="torch")


def test_relaxed_needs_the_audio_ahead_to_cover_the_estimate():
    assert relaxed(3.0, 0.2)
    assert not relaxed(0.5, 0.2)  # 0.5 s ahead < 2 x 0.2 + 0.25
    edge = RELAX_FACTOR * 0.2 + RELAX_MARGIN_S
    assert relaxed(edge, 0.2) and not relaxed(edge - 1e-3, 0.2)
    assert not relaxed(-1.0, 0.0)  # the listener has caught up: first audio matters again


def test_throughput_windows_one_per_worker():
    assert throughput_windows(309, 2, 400, 11) == [(0, 154), (154, 309)]
    assert throughput_windows(1000, 2, 400, 11) == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert throughput_windows(60, 2, 400, 11) == [(0, 60)]  # halves under 4 x context: one window
    for frames in range(1, 900, 13):
        for parallel in (1, 2, 3, 4):
            w = throughput_windows(frames, parallel, 400, 11)
            assert w[0][0] == 0 and w[-1][1] == frames and all(a == b for (_, a), (b, _) in zip(w, w[1:]))
            assert max(b - a for a, b in w) <= 400
            assert len(w) == 1 or min(b - a for a, b in w) >= 44  # 4 x context
            assert len(w) % parallel == 0 or len(w) == max(1, frames // 44)  # fewer only where windows would be small


def _streamed(tts, text):
    return np.concatenate(list(tts.synthesize(text, noise_scale=0.0, noise_w=0.0)))


def _calls(tts):
    r, calls = tts.runner, []
    orig = r.vocode_async

    def counting(latent, a, b):
        calls.append((latent.frames, a, b))
        return orig(latent, a, b)

    r.vocode_async = counting
    return calls, lambda: delattr(r, "vocode_async")


def test_later_sentences_vocoded_for_throughput_sound_the_same(torch_tts):
    text = FIRST + " " + REST
    calls, undo = _calls(torch_tts)
    try:
        torch_tts.relax = False
        plain = _streamed(torch_tts, text)
        assert torch_tts.last_stats.relaxed_sentences == 0
        n_plain = len(calls)
        calls.clear()
        torch_tts.relax = True
        fast = _streamed(torch_tts, text)
    finally:
        undo()
        del torch_tts.relax
    st = torch_tts.last_stats
    assert st.relaxed_sentences == 2  # both sentences after the first: 6 s of audio were ahead
    assert len(fast) == len(plain) and np.abs(fast - plain).max() < 1e-5
    assert len(calls) < n_plain  # fewer, larger windows
    sentences = []  # the vocoder calls of each sentence, in order (each sentence's first window starts at 0)
    for frames, a, b in calls:
        if a == 0:
            sentences.append([])
        sentences[-1].append((frames, a, b))
    assert len(sentences) == 3
    ctx = torch_tts.runner.context_frames
    assert sentences[0][0][1:] == (0, 16 + ctx)  # the first sentence: a small first window, for first audio
    for s in sentences[1:]:  # the others: one window per worker (the whole sentence when it is short)
        F = s[0][0]
        plan = throughput_windows(F, torch_tts.runner.parallel, 400, ctx)
        assert s == [(F, max(0, a - ctx), min(F, b + ctx)) for a, b in plan]


def test_a_listener_that_caught_up_gets_first_audio_windows(torch_tts):
    """Text arriving slowly (an LLM): by the second sentence the first one's 0.6 s have been heard, so it is
    vocoded for first audio again."""

    def pieces():
        yield "Hello there. "
        time.sleep(1.5)
        yield "How are you today?"

    chunks = list(torch_tts.synthesize_stream(pieces()))
    assert chunks and torch_tts.last_stats.relaxed_sentences == 0


def test_audio_nobody_hears_while_it_is_made_is_all_for_throughput(torch_tts, tmp_path):
    """An array, a file, or a response encoded at its end: every sentence, the first too, is vocoded for
    throughput (first_audio=False), and sounds the same as when streamed."""
    text = "Good morning. " + REST
    streamed = _streamed(torch_tts, text)
    assert torch_tts.last_stats.relaxed_sentences < 3  # streamed: the first sentence for first audio
    whole = torch_tts.synthesize_array(text, noise_scale=0.0, noise_w=0.0)
    assert torch_tts.last_stats.relaxed_sentences == 3
    assert len(whole) == len(streamed) and np.abs(whole - streamed).max() < 1e-5
    st = torch_tts.synthesize_to_file(text, tmp_path / "a.f32", noise_scale=0.0, noise_w=0.0)
    assert st.relaxed_sentences == 3
    assert np.array_equal(np.fromfile(tmp_path / "a.f32", np.float32), whole)
