"""Silero VAD on the embedded model: a chunk's frames in one call of the sequence graph (what every stream runs)
against one call of silero_vad.onnx per frame, on real speech cut into chunks of every size."""

from __future__ import annotations

import numpy as np
import pytest

from speechrt.models import silero
from speechrt.models.silero import CONTEXT, FRAME, WINDOW, SileroVAD

TEXTS = [
    "Could you turn the lights off in the kitchen, please?",
    "What time does the next train to Boston leave?",
    "Yes.",
    "The weather looks fine for the weekend.",
]


@pytest.fixture(scope="module")
def vads():
    fast, per_frame = SileroVAD(), SileroVAD(sequence=False)
    assert fast.sequence, "the installed silero-vad should ship the sequence graph (pyproject asks for >= 6.2.3)"
    assert not per_frame.sequence
    return fast, per_frame


def _cut(rng, audio):
    """The audio in chunks of random sizes: empty ones, ones shorter than a frame, several frames."""
    chunks, i = [], 0
    while i < len(audio):
        n = int(rng.choice([0, 1, 100, FRAME - 1, FRAME, FRAME + 1, 1600, 2400, 4000, int(rng.integers(1, 5000))]))
        chunks.append(audio[i : i + n])
        i += n
    return chunks


def test_frames_are_each_frame_after_the_previous_frames_last_samples(vads):
    rng = np.random.default_rng(0)
    audio = rng.standard_normal(FRAME * 7 + 300).astype(np.float32)
    stream = vads[0].stream()
    windows = np.concatenate([stream.take_frames(c) for c in _cut(rng, audio)])
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    assert windows.shape == (7, WINDOW)
    for i, w in enumerate(windows):
        np.testing.assert_array_equal(w, padded[i * FRAME : i * FRAME + WINDOW])
    np.testing.assert_array_equal(stream.pending, audio[7 * FRAME :])


@pytest.mark.parametrize("seed", [1, 2])
def test_a_chunks_frames_in_one_call_match_a_call_per_frame(vads, synth, seed):
    """Speech (with silence between, so both kinds of frame) cut differently per seed: every chunk's probabilities
    and the state after it equal the per-frame graph's."""
    fast, per_frame = vads
    rng = np.random.default_rng(seed)
    audio = np.concatenate(
        [np.concatenate([synth(t), np.zeros(int(rng.integers(0, 8000)), np.float32)]) for t in TEXTS]
    )
    a, b = fast.stream(), per_frame.stream()
    got, want = [], []
    for chunk in _cut(rng, audio):
        got.append(a.process(chunk))
        want.append(b.process(chunk))
        assert len(got[-1]) == len(want[-1])
        np.testing.assert_allclose(a.state, b.state, rtol=1e-5, atol=1e-6)
    g, w = np.concatenate(got), np.concatenate(want)
    assert len(g) == len(audio) // FRAME and not np.isnan(g).any()
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert w.max() > 0.8 and w.min() < 0.2, "the audio should hold both speech and silence frames"


def test_a_long_recording_runs_in_several_sequence_calls(vads, synth, monkeypatch):
    """speech_probs over more frames than one call takes: the same probabilities as the per-frame graph."""
    fast, per_frame = vads
    monkeypatch.setattr(silero, "MAX_SEQUENCE", 7)
    audio = synth(TEXTS[0])[: FRAME * 50 + 123]
    got, want = fast.speech_probs(audio), per_frame.speech_probs(audio)
    assert len(got) == 51
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
