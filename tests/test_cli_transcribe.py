"""The `speechrt` command as a user runs it: a subprocess, real files."""
import json
import subprocess
import sys

import numpy as np
import soundfile as sf

from speechrt.models.wer import wer

from speechrt.cli_asr import sample_path

SAMPLE_TEXT = sample_path().with_suffix(".txt").read_text()


def speechrt(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "speechrt", *args], capture_output=True, text=True, timeout=timeout)


def test_transcribe_sample_json():
    r = speechrt("transcribe", "--sample", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert wer(SAMPLE_TEXT, out["text"]) <= 0.15, out["text"]
    segs = out["segments"]
    # a predicted end timestamp may land a little past the last sample (openai-whisper does not clamp it)
    assert segs and segs[0]["start"] == 0.0 and segs[-1]["end"] <= out["duration"] + 0.5
    assert all(s["start"] < s["end"] for s in segs)


def test_transcribe_stereo_48k_flac_with_segments_and_beam(tmp_path):
    from speechrt.models.audio import load_audio, resample

    a = resample(load_audio(sample_path()), 16000, 48000)
    p = tmp_path / "stereo.flac"
    sf.write(p, np.stack([a, 0.8 * a], 1), 48000)
    r = speechrt("transcribe", str(p), "--segments", "--beam-size", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines and all(line.startswith("[00:") and " --> " in line for line in lines)
    text = " ".join(line.split("] ", 1)[1] for line in lines)
    assert wer(SAMPLE_TEXT, text) <= 0.15, text


def test_bad_inputs_exit_2_with_clear_message(tmp_path):
    r = speechrt("transcribe", str(tmp_path / "nope.wav"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    notaudio = tmp_path / "a.wav"
    notaudio.write_text("hello")
    r = speechrt("transcribe", str(notaudio))
    assert r.returncode == 2 and "not a readable audio file" in r.stderr
    r = speechrt("transcribe", "--sample", "--model", "whisper-gigantic")
    assert r.returncode == 2 and "whisper-tiny.en" in r.stderr
    r = speechrt("transcribe", "--sample", "--backend", "nonesuch")
    assert r.returncode == 2 and "valid backends: torch" in r.stderr
    r = speechrt("transcribe", "--sample", "--beam-size", "0")
    assert r.returncode == 2 and "beam_size" in r.stderr
    r = speechrt("transcribe", "--sample", "--device", "cuda:3")
    assert r.returncode == 2 and "device" in r.stderr


def test_transcribe_word_timestamps():
    r = speechrt("transcribe", "--sample", "--word-timestamps", "--json")
    assert r.returncode == 0, r.stderr
    words = [w for s in json.loads(r.stdout)["segments"] for w in s["words"]]
    assert wer(SAMPLE_TEXT, "".join(w["word"] for w in words)) <= 0.15
    assert all(w["start"] <= w["end"] and 0 <= w["probability"] <= 1 for w in words)
    r = speechrt("transcribe", "--sample", "--word-timestamps")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines[0].startswith("[00:00.000 --> ") and len(lines) > len(words)
    assert lines[1].split()[-1] == words[0]["word"].strip()
