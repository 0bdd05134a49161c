"""A normal (non-editable) wheel install works: the top-level folders land inside `speechrt` only."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_layout_and_import(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    whl = next(tmp_path.glob("speechrt-*.whl"))
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"speechrt", whl.name.split("-")[0] + "-" + whl.name.split("-")[1] + ".dist-info"}, tops
    for must in (
        "speechrt/models/whisper.py",
        "speechrt/backends/torch/asr.py",
        "speechrt/kernels/reference.py",
        "speechrt/data/sample.wav",
        "speechrt/data/passage.flac",
        "speechrt/cli.py",
        "speechrt/kernels/cpu_decode.c",
    ):
        assert must in names, must
    site = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(whl)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    code = (
        "import speechrt, speechrt.models.whisper as w, speechrt.cli_asr as c;"
        "print(w.__file__); print(c.sample_path().exists())"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(site)) and r.stdout.splitlines()[1] == "True"
