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


@pytest.mark.parametrize(
    "out, says",
    [
        ("{tmp}/no/such/dir/x.wav", "the directory {tmp}/no/such/dir does not exist"),
        ("{tmp}", "is a directory; give a file path, such as {tmp}/out.wav"),
        ("{tmp}/a-file/x.wav", "{tmp}/a-file is a file, not a directory"),
        ("/proc/speechrt-test.wav", "cannot write in /proc"),  # no process may, root included
    ],
)
def test_say_output_path_errors_come_before_the_voice_loads(out, says, tmp_path, capsys, no_model_loads):
    (tmp_path / "a-file").write_text("not a directory")
    assert main(["say", "hello", "-o", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speechrt say: error: -o/--output ") and err.count("\n") == 1, err
    assert says.format(tmp=tmp_path) in err, err


def test_python_say_checks_its_path_before_the_voice_loads(tmp_path, no_model_loads):
    import speechrt
    from speechrt.errors import UserError

    with pytest.raises(UserError, match="does not exist"):
        speechrt.say("Hello.", tmp_path / "missing" / "x.wav")
    with pytest.raises(UserError, match="is a directory"):
        speechrt.say("Hello.", tmp_path)
