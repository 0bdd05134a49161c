"""`speechrt say`: text argument or stdin, WAV / raw pcm16 / float32 / stdout, controls, and clear errors."""

from __future__ import annotations

import io
import json
import sys
import wave

import numpy as np
import pytest

from speechrt.cli import main


def test_say_to_wav(tmp_path, capsys):
    out = tmp_path / "hello.wav"
    assert main(["say", "Hello from the command line. It speaks two sentences.", "-o", str(out)]) == 0
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
        assert w.getnframes() > 22050 * 1.5
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert np.abs(pcm).max() > 3000
    assert "real-time factor" in capsys.readouterr().err


def test_say_from_stdin_raw_resampled(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Text piped in.\nA second line arrives later.\n"))
    out = tmp_path / "piped.raw"
    assert main(["say", "-o", str(out), "--sample-rate", "16000", "--rate", "1.2", "--seed", "1"]) == 0
    pcm = np.fromfile(out, "<i2")
    assert 16000 * 1.0 < len(pcm) < 16000 * 6


def test_say_to_stdout_f32_onnxruntime(capsysbinary):
    assert (
        main(
            [
                "say",
                "Short.",
                "-o",
                "-",
                "--format",
                "f32",
                "--backend",
                "onnxruntime",
                "--noise-scale",
                "0",
                "--noise-w",
                "0",
            ]
        )
        == 0
    )
    audio = np.frombuffer(capsysbinary.readouterr().out, np.float32)
    assert len(audio) > 22050 * 0.3 and np.abs(audio).max() <= 1.0


@pytest.mark.parametrize(
    "argv, match",
    [
        (["say", "", "-o", "x.wav"], "nothing to say"),
        (["say", "hello"], "no output given"),
        (["say", "hello 你好", "-o", "x.wav"], "unsupported characters"),
        (["say", "hello", "-o", "x.wav", "--backend", "nope"], "valid backends"),
        (["say", "hello", "-o", "x.wav", "--rate", "0"], "rate must be in"),
        (["say", "hello", "-o", "x.wav", "--voice", "no-such-voice"], "registered tts models"),
    ],
)
def test_say_errors(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_say_rejects_a_file_that_is_not_a_piper_voice(tmp_path, capsys):
    fake = tmp_path / "fake.onnx"
    fake.write_bytes(b"\x08\x07not really onnx")
    (tmp_path / "fake.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}}))
    assert main(["say", "hello", "-o", str(tmp_path / "x.wav"), "--voice", str(fake)]) == 2
    assert "not a Piper voice config" in capsys.readouterr().err
