"""Silence and noise: Whisper's best-known failure is text invented where nobody speaks ("you" over
digital silence). The guards — the no-speech rule with temperature fallback (as faster-whisper), the
silence gate (silence_level_db) and the optional Silero VAD pre-filter (vad_filter) — keep five minutes of
non-speech free of text, and leave speech around a long gap transcribed at the right times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from nonspeech import NON_SPEECH, SR  # tests/nonspeech.py: the fixed-seed signals

import speechrt
from speechrt.errors import UserError
from speechrt.models.wer import wer
from speechrt.pipelines.asr import TranscribeOptions
from speechrt.pipelines.speech_regions import SpeechMap, VadOptions, speech_timestamps

DATA = Path(speechrt.__file__).parent / "data"


@pytest.fixture(scope="module")
def speech_with_gap():
    """The sample recording cut in two at its quietest 0.2 s near the middle, 60 s of zeros between ->
    (audio, the cut in seconds)."""
    d, sr = sf.read(DATA / "sample.wav", dtype="float32")
    assert sr == SR
    win, mid = SR // 5, len(d) // 2
    energy = [np.abs(d[i : i + win]).mean() for i in range(mid - 2 * SR, mid + 2 * SR, 160)]
    cut = mid - 2 * SR + int(np.argmin(energy)) * 160 + win // 2
    return np.concatenate([d[:cut], np.zeros(60 * SR, np.float32), d[cut:]]), cut / SR


def no_text(tr) -> bool:
    return tr.text.strip() == "" and all(not s.text.strip() for s in tr.segments)


@pytest.mark.parametrize("kind", list(NON_SPEECH))
def test_a_minute_of_non_speech_gives_no_text(asr, one_cpu_thread, kind):
    """60 s of each of five kinds of non-speech (five minutes in all), default options: no text (before
    the silence gate, 60 s of digital silence came out as "you you")."""
    tr = asr.transcribe(NON_SPEECH[kind](60))
    assert no_text(tr), (kind, tr.text, [(s.start, s.no_speech_prob, s.avg_logprob) for s in tr.segments])
    assert tr.duration == 60.0


def test_vad_filter_finds_no_speech_in_noise(asr, one_cpu_thread):
    for kind, make in NON_SPEECH.items():
        tr = asr.transcribe(make(15), vad_filter=True)
        assert no_text(tr) and tr.duration == 15.0, (kind, tr.text)


def test_speech_around_a_minute_of_silence(asr, one_cpu_thread, speech_with_gap):
    """Default options: the speech is transcribed, nothing in the gap, the second half after 60 s.
    vad_filter with word timestamps: segment and word times land on the recording's own timeline."""
    audio, cut = speech_with_gap
    ref = (DATA / "sample.txt").read_text()
    tr = asr.transcribe(audio)
    assert wer(ref, tr.text) <= 0.15, tr.text
    assert all(s.end <= cut + 0.5 or s.start >= 60.0 for s in tr.segments), [(s.start, s.end) for s in tr.segments]
    assert any(s.start >= 60.0 for s in tr.segments)

    tr = asr.transcribe(audio, vad_filter=True, word_timestamps=True)
    assert wer(ref, tr.text) <= 0.15, tr.text
    assert tr.duration == pytest.approx(len(audio) / SR)
    first, second = [s for s in tr.segments if s.end <= cut + 0.5], [s for s in tr.segments if s.start >= cut + 59.5]
    assert first and second and len(first) + len(second) == len(tr.segments), [(s.start, s.end) for s in tr.segments]
    words = [w for s in tr.segments for w in s.words]
    assert all(w.end <= cut + 0.5 or w.start >= cut + 59.5 for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    assert second[-1].end <= len(audio) / SR + 0.01


def test_hallucination_silence_threshold_keeps_the_speech(asr, one_cpu_thread, speech_with_gap):
    """faster-whisper's hallucination_silence_threshold (with word timestamps) on speech around 60 s of
    silence: the speech is kept, the gap stays empty, words stay in order."""
    audio, cut = speech_with_gap
    tr = asr.transcribe(audio, word_timestamps=True, hallucination_silence_threshold=2.0)
    assert wer((DATA / "sample.txt").read_text(), tr.text) <= 0.15, tr.text
    words = [w for s in tr.segments for w in s.words]
    assert all(w.end <= cut + 0.5 or w.start >= 60.0 for w in words), [(w.word, w.start, w.end) for w in words]
    with pytest.raises(UserError, match="needs word_timestamps=True"):
        asr.options(hallucination_silence_threshold=2.0)


def test_speech_map_restores_times_across_regions():
    """Two regions of a recording joined: times in the joined audio map back; a segment that ends just
    inside the next region's padding ends with its own region."""
    from speechrt.pipelines.whisper_long_form import Segment
    from speechrt.pipelines.whisper_timing import Word

    m = SpeechMap([{"start": 16000, "end": 48000}, {"start": 1_016_000, "end": 1_048_000}])
    assert m.join(np.arange(1_100_000, dtype=np.float32)).shape == (64000,)
    assert m.original_time(0.5) == 1.5 and m.original_time(2.5) == 64.0 and m.original_time(2.0, is_end=True) == 3.0
    segs = [
        Segment(0, 0.1, 2.2, " a", [], 0, 0, 0, 0),
        Segment(1, 2.4, 3.9, " b", [], 0, 0, 0, 0),
        Segment(
            2,
            1.0,
            3.0,
            " c",
            [],
            0,
            0,
            0,
            0,
            [Word(1.0, 1.5, " c", 1.0), Word(2.1, 2.5, " d", 1.0), Word(2.6, 3.0, " e", 1.0)],
        ),
    ]
    m.restore(segs)
    assert (segs[0].start, segs[0].end) == (1.1, 3.0)  # ends 0.2 s into region 2: its own region's end
    assert (segs[1].start, segs[1].end) == (63.9, 65.4)
    assert [(w.start, w.end) for w in segs[2].words] == [(2.0, 2.5), (63.6, 64.0), (64.1, 64.5)]
    assert (segs[2].start, segs[2].end) == (2.0, 64.5)


def test_speech_timestamps_follow_faster_whisper_rules():
    """The region finder on given probabilities (32 ms frames): hysteresis between threshold and
    neg_threshold, short pauses bridged, short regions dropped, padding split where regions are close."""
    p = np.array([0.0] * 10 + [0.9] * 20 + [0.4] * 5 + [0.9] * 10 + [0.1] * 100 + [0.9] * 2 + [0.0] * 100, np.float32)
    audio = np.zeros(len(p) * 512, np.float32)
    regions = speech_timestamps(
        audio, VadOptions(min_silence_duration_ms=500, speech_pad_ms=100, min_speech_duration_ms=100), probs=p
    )
    # frames 10-44 (0.4 is above neg_threshold 0.35: no pause); the 2-frame blip (64 ms) is dropped
    assert regions == [{"start": 10 * 512 - 1600, "end": 45 * 512 + 1600}]
    regions = speech_timestamps(audio, VadOptions(min_silence_duration_ms=500, speech_pad_ms=100), probs=p)
    assert len(regions) == 2 and regions[1]["start"] == 145 * 512 - 1600


def test_bad_options_say_what_is_valid(asr):
    with pytest.raises(UserError, match="silence_level_db must be None"):
        TranscribeOptions(silence_level_db=3)
    with pytest.raises(UserError, match="unknown VAD option.*valid: threshold"):
        asr.options(vad_filter=True, vad_parameters={"min_silence_ms": 100})
    with pytest.raises(UserError, match="threshold must be in"):
        TranscribeOptions(vad_filter=True, vad_parameters={"threshold": 1.5})
    assert TranscribeOptions(vad_filter=True).vad_parameters == VadOptions()
    # each scalar option's type is checked (these were taken, or failed inside the decoder)
    for kw, says in (
        ({"initial_prompt": 5}, "initial_prompt must be str or None, got 5"),
        ({"vad_filter": "yes"}, "vad_filter must be bool, got 'yes'"),
        ({"beam_size": 2.5}, "beam_size must be int"),
        ({"beam_size": True}, "beam_size must be int"),
        ({"no_speech_threshold": "0.6"}, "no_speech_threshold must be float or None"),
    ):
        with pytest.raises(UserError, match=f"invalid transcription option: {says}"):
            TranscribeOptions(**kw)
    assert TranscribeOptions(patience=2, no_speech_threshold=None, temperatures=[0.0, 0.5]).patience == 2
    assert TranscribeOptions(vad_parameters={"speech_pad_ms": 200}).vad_parameters.speech_pad_ms == 200


def test_cli_vad_filter(tmp_path, capsys, speech_with_gap):
    """`speechrt transcribe --vad-filter --json`: the file's own times; VAD parameters without the filter and
    a bad level are refused."""
    import json

    from speechrt.cli import main

    audio, cut = speech_with_gap
    short = np.concatenate([audio[: round(cut * SR)], audio[-(len(audio) - round(cut * SR) - 50 * SR) :]])  # 10 s gap
    path = tmp_path / "gap.wav"
    sf.write(path, short, SR)
    assert main(["transcribe", str(path), "--vad-filter", "--vad-speech-pad-ms", "300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert wer((DATA / "sample.txt").read_text(), out["text"]) <= 0.15, out["text"]
    segs = out["segments"]
    assert all(s["end"] <= cut + 0.5 or s["start"] >= cut + 9.5 for s in segs), segs
    assert any(s["start"] >= cut + 9.5 for s in segs) and out["duration"] == pytest.approx(len(short) / SR, abs=0.01)
    assert main(["transcribe", str(path), "--vad-min-silence-ms", "500"]) == 2
    assert "apply to --vad-filter" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["transcribe", str(path), "--silence-level-db", "loud"])
    assert "not a level in dBFS" in capsys.readouterr().err
