"""The `speechrt` command as a user runs it: a subprocess, real files."""

import json
import subprocess
import sys

import numpy as np
import soundfile as sf

from speechrt.cli_asr import sample_path
from speechrt.models.wer import wer

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


def test_bad_inputs_exit_2_with_clear_message(tmp_path, capsys):
    r = speechrt("transcribe", str(tmp_path / "nope.wav"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    # the rest through the same entry point in this process (a subprocess each costs a torch import)
    from speechrt.cli import main

    def run(*args):
        code = main(["transcribe", *args])
        return code, capsys.readouterr().err

    notaudio = tmp_path / "a.wav"
    notaudio.write_text("hello")
    for args, says in [
        ((str(notaudio),), "not a readable audio file"),
        (("--sample", "--model", "whisper-gigantic"), "whisper-tiny.en"),
        (("--sample", "--backend", "nonesuch"), "valid backends: torch"),
        (("--sample", "--beam-size", "0"), "beam_size"),
        (("--sample", "--device", "cuda:3"), "device"),
    ]:
        code, err = run(*args)
        assert code == 2 and says in err and err.startswith("speechrt transcribe: error:"), (args, err)


def test_several_files_to_output_dir_as_srt_with_a_progress_bar(tmp_path):
    copy = tmp_path / "copy.flac"
    sf.write(copy, sf.read(sample_path())[0], 16000)
    out = tmp_path / "out"
    r = speechrt("transcribe", str(sample_path()), str(copy), "--format", "srt", "--output-dir", str(out), "--progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "sample.wav: " in r.stderr and "%|" in r.stderr  # tqdm's bar, on stderr
    for name in ("sample.srt", "copy.srt"):
        srt = (out / name).read_text()
        assert srt.startswith("1\n00:00:00,000 --> 00:00:0")
        text = " ".join(block.split("\n", 2)[2] for block in srt.strip().split("\n\n"))
        assert wer(SAMPLE_TEXT, text) <= 0.15, text


def test_formats_of_several_files_are_printed_one_after_another(tmp_path):
    r = speechrt("transcribe", "--sample", str(sample_path()), "--format", "json")
    assert r.returncode == 0, r.stderr
    parts = r.stdout.split("==> ")[1:]
    assert len(parts) == 2 and all(p.startswith(str(sample_path())) for p in parts)
    texts = [json.loads(p.split(" <==\n", 1)[1])["text"] for p in parts]
    assert texts[0] == texts[1] and wer(SAMPLE_TEXT, texts[0]) <= 0.15
    r = speechrt("transcribe", "--sample", "--format", "tsv")
    assert r.returncode == 2 and "valid: text, json, verbose_json, srt, vtt" in r.stderr


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


def test_whole_windows_flag_encodes_the_last_window_whole(monkeypatch, capsys, tmp_path):
    """By default the last window (a few seconds of audio) is encoded over its audio and a margin (that,
    tests/pipelines/test_asr.py checks on the whole passage; trim_context=False's whole-window transcript,
    tests/models/test_whisper.py against faster-whisper); --whole-windows
    must reach the pipeline: on the passage's first 34 s (two windows, the last holding ~4 s, which the default
    would trim) every window is encoded whole, 30 s. The real pipeline runs; its runner's encode is wrapped to
    record each window's length."""
    import speechrt.pipelines.asr as asr_module
    from speechrt.cli import main
    from speechrt.models.audio import N_FRAMES, SAMPLE_RATE, load_audio

    lengths, load = [], asr_module.load_asr

    def loading(*a, **k):
        asr = load(*a, **k)
        encode = asr.runner.encode
        asr.runner.encode = lambda mel, *rest: lengths.append(mel.shape[-1]) or encode(mel, *rest)
        return asr

    monkeypatch.setattr(asr_module, "load_asr", loading)
    clip = tmp_path / "first34s.wav"
    sf.write(clip, load_audio(sample_path().with_name("passage.flac"))[: 34 * SAMPLE_RATE], SAMPLE_RATE)
    ref = sample_path().with_name("passage.txt").read_text()
    assert main(["transcribe", str(clip), "--backend", "torch", "--json", "--whole-windows"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(lengths) >= 2 and set(lengths) == {N_FRAMES}, lengths
    head = " ".join(ref.split()[:12])
    assert wer(head, " ".join(out["text"].split()[:12])) <= 0.1, out["text"]


def test_output_dir_that_cannot_be_made_is_one_line_before_the_model_loads(tmp_path, capsys, no_model_loads):
    from speechrt.cli import main

    a_file = tmp_path / "notes.txt"
    a_file.write_text("a file where the directory should be")
    for out, says in [
        (a_file, f"{a_file}: is a file, not a directory"),
        (a_file / "subs", f"{a_file} is a file, so no directory can be made under it"),
        ("/proc/speechrt-test/subs", "cannot write in /proc"),  # no process may, root included
    ]:
        assert main(["transcribe", "--sample", "--format", "srt", "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("speechrt transcribe: error: --output-dir ") and err.count("\n") == 1, err
        assert says in err, err
