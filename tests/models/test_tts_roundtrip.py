"""Round trip: our synthesis (torch VITS, streamed in windows, resampled to 16 kHz) transcribed by the
project's own Whisper (speechrt.load_asr) must give back the text: corpus WER <= 5% on 20 sentences.
(The onnxruntime backend's audio equals the torch backend's within 1e-3: tests/backends/test_onnxruntime_tts.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import speechrt
from speechrt.models.wer import wer

SENTENCES = [
    "The weather will be sunny tomorrow with a light breeze from the west.",
    "Please remember to close the windows before you leave the house.",
    "She bought three apples, a loaf of bread and a bottle of milk.",
    "Our train was delayed because of a signal problem near the station.",
    "He plays the piano every evening after dinner.",
    "Can you tell me the way to the nearest post office?",
    "The children built a sand castle on the beach.",
    "Turn left at the traffic lights and then go straight ahead.",
    "My sister is studying chemistry at the university.",
    "The library has thousands of books about history and science.",
    "We watched a documentary about whales last night.",
    "The restaurant on the corner serves excellent pasta.",
    "Dogs need regular exercise and a healthy diet.",
    "The river flows quietly through the green valley.",
    "I would like a cup of coffee with a little sugar, please.",
    "The new phone has a bigger screen and a better camera.",
    "Farmers are worried about the lack of rain this summer.",
    "The pilot announced that we would land in twenty minutes.",
    "Reading before bed helps many people fall asleep.",
    "The company plans to open a new office in the spring.",
]


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _transcribe_groups(asr, audios, texts, max_seconds=24.0):
    """Sentences joined with short pauses into clips of at most `max_seconds` (one Whisper window each, so
    the 30-second encoder runs a few times instead of once per sentence) -> (reference, hypothesis) pairs."""
    pad = np.zeros(int(0.4 * 16000), np.float32)
    refs, hyps, clip, words = [], [], [], []
    for audio, text in list(zip(audios, texts)) + [(None, None)]:
        if clip and (audio is None or sum(map(len, clip)) + len(audio) + len(pad) > max_seconds * 16000):
            hyps.append(asr.transcribe(np.concatenate(clip + [pad]), sample_rate=16000).text)
            refs.append(" ".join(words))
            clip, words = [], []
        if audio is not None:
            clip += [pad, audio]
            words.append(text)
    return refs, hyps


def test_synthesized_speech_transcribes_back():
    tts = speechrt.load_tts(backend="torch")
    asr = speechrt.load_asr(backend="torch")
    audios = []
    for i, text in enumerate(SENTENCES):
        audio = np.concatenate(list(tts.synthesize(text, sample_rate=16000, seed=i)))
        assert audio.dtype == np.float32 and len(audio) > 16000 * 0.8
        audios.append(audio)
    refs, hyps = _transcribe_groups(asr, audios, SENTENCES)
    assert len(refs) >= 3 and " ".join(refs) == " ".join(SENTENCES)
    score = wer(refs, hyps)
    assert score <= 0.05, list(zip(refs, hyps))
