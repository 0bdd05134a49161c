"""Silero for many streams in one batched call per tick (SileroVAD.run_batch on ONNX Runtime, the server's runner on
the CPU; BatchedSilero, torch, its runner on a GPU, checked here on the CPU) against each stream run alone by the
sequence graph (what every stream ran before): recorded speech, noise and silence in chunks of many sizes (1 sample
to 4800), the streams' chunks interleaving tick by tick. Probabilities agree within 1e-5 and the speech start / stop
events a turn detector makes of them are the same."""

from __future__ import annotations

import nonspeech  # tests/nonspeech.py: the fixed-seed signals
import numpy as np
import pytest
import torch

from speechrt.cli_asr import sample_path
from speechrt.models import silero
from speechrt.models.audio import load_audio
from speechrt.models.silero import FRAME, SileroVAD
from speechrt.models.silero_batch import BatchedSilero
from speechrt.streaming.realtime.vad import ServerVadConfig, TurnDetector

SIZES = [1, 160, 333, 512, 1000, 4800, 1600]
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def reference():
    return SileroVAD()


@pytest.fixture(scope="module")
def recordings():
    sample = load_audio(str(sample_path()))
    passage = load_audio(str(sample_path().with_name("passage.flac")))[: 16000 * 12]
    quiet = np.zeros(16000 * 2, np.float32)
    return [  # each stream's audio: speech, speech after noise and silence, noises (the first and the last are
        # shorter: each pass sends one of them a sample at a time)
        sample[: 16000 * 3],
        np.concatenate([nonspeech.pink(2), quiet, passage[: 16000 * 6]]),
        passage[16000 * 6 :],
        np.concatenate([nonspeech.white(2), sample[: 16000 * 3], nonspeech.hum(2)]),
        nonspeech.tones(3),
        sample[::-1].copy(),
        np.concatenate([quiet[:8000], sample[: 16000 * 3]]),
    ]


def _ticks(rng, audios, sizes):
    """The streams' chunks (stream, chunk) tick by tick: each tick every stream sends the chunks (of its size) that
    make up a random share of up to 4000 samples, or nothing; a stream's chunks in order, the streams' interleaved."""
    pos = [0] * len(audios)
    while any(p < len(a) for p, a in zip(pos, audios)):
        tick = []
        for i in rng.permutation(len(audios)):
            want = int(rng.choice([0, int(rng.integers(1, 4000))]))
            end = min(len(audios[i]), pos[i] + want)
            while pos[i] < end:
                tick.append((i, audios[i][pos[i] : pos[i] + sizes[i]]))
                pos[i] += sizes[i]
        yield tick


def _run_ticks(runner, audios, sizes, seed):
    """Each stream's probabilities when every tick's frames run in one run_batch (as VadWorker runs them)."""
    streams = [runner.stream() for _ in audios]
    got = [[] for _ in audios]
    for tick in _ticks(np.random.default_rng(seed), audios, sizes):
        windows = [[] for _ in audios]
        for i, chunk in tick:
            windows[i].append(streams[i].take_frames(chunk))
        rows = [i for i in range(len(audios)) if windows[i]]
        probs, states = runner.run_batch([np.concatenate(windows[i]) for i in rows], [streams[i].state for i in rows])
        for i, p, s in zip(rows, probs, states):
            got[i].append(p)
            streams[i].state = s
    return [np.concatenate(g) for g in got]


def _events(probs):
    detector = TurnDetector(ServerVadConfig(silence_duration_ms=300))
    return detector.feed(probs)


@pytest.mark.parametrize("runner", ["onnxruntime", "torch"])
def test_one_batched_call_per_tick_gives_each_stream_its_own_speech_decisions(
    runner, reference, recordings, monkeypatch
):
    monkeypatch.setattr(silero, "BATCH_MIN", 1)  # (every tick batched, however few streams have frames in it)
    batched = SileroVAD() if runner == "onnxruntime" else BatchedSilero("cpu")
    if runner == "torch":  # (the GPU's runner, slower per call on the CPU: a shorter run, one thread)
        recordings = [r[: 16000 * 4] for r in recordings]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        _check_against_alone(batched, reference, recordings, 1 if runner == "torch" else 2)
    finally:
        if runner == "torch":
            torch.set_num_threads(threads)


def _check_against_alone(batched, reference, recordings, passes):
    for seed, sizes in enumerate([SIZES, SIZES[::-1]][:passes]):
        got = _run_ticks(batched, recordings, sizes, seed)
        for i, audio in enumerate(recordings):
            want = reference.stream().process(audio)  # the stream alone, all at once
            assert len(got[i]) == len(want) == len(audio) // FRAME, (i, sizes[i])
            np.testing.assert_allclose(got[i], want, **TOL, err_msg=f"stream {i}, chunks of {sizes[i]}")
            assert _events(got[i]) == _events(want), (i, sizes[i])


def test_the_recordings_hold_turns_and_silence(reference, recordings):
    speech = _events(reference.stream().process(recordings[1]))
    assert [k for k, _ in speech][:2] == ["start", "stop"], "the speech should make turns"
    quiet = reference.stream().process(recordings[1][: 16000 * 4])  # pink noise, then silence
    assert (quiet[-50:] < 0.2).all(), "the silence should hold no speech frame"


@pytest.mark.parametrize("batch_min", [1, 8])
def test_a_stream_state_moves_only_with_its_own_frames(reference, monkeypatch, batch_min):
    """A stream without a whole frame in a tick keeps its state; the others' rows move (batched, and in the calls per
    stream a tick of few streams runs)."""
    monkeypatch.setattr(silero, "BATCH_MIN", batch_min)
    runner = SileroVAD()
    a, b = runner.stream(), runner.stream()
    audio = load_audio(str(sample_path()))[: FRAME * 4]
    before = b.state.copy()
    probs, states = runner.run_batch([a.take_frames(audio), b.take_frames(audio[:100])], [a.state, b.state])
    assert len(probs[0]) == 4 and len(probs[1]) == 0
    np.testing.assert_array_equal(states[1], before)
    np.testing.assert_allclose(probs[0], reference.stream().process(audio), **TOL)
