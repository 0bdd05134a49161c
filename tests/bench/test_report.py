"""`speechrt bench report`: real runs merged with a second machine into one self-contained HTML page with
its charts (loaded in headless Chromium), and the Markdown form; docs/benchmarks.md is that Markdown of
the committed result files."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speechrt.bench import fingerprint
from speechrt.bench.record import Record, Repeats, Results, load

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SPEECHRT_CHROMIUM") or next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)


def _other_machine(src, out):
    """The run as if from a second machine (a GPU box, 1.5x faster) with LM and server rows, so the page
    has every chart: decode tok/s against batch, latency against streams, a roofline."""
    res = load(src)
    m = dict(
        res.machine,
        label="Test GPU box",
        gpus=[
            {
                "name": "NVIDIA H100 80GB HBM3",
                "vendor": "NVIDIA",
                "memory_gib": 79.1,
                "compute_capability": "9.0",
                "gfx_arch": None,
                "driver": "550.54",
                "runtime": "CUDA 12.4",
            }
        ],
    )
    res.records = [dataclasses.replace(r, value=r.value / 1.5) if r.better == "lower" else r for r in res.records]
    lm = dict(
        family="lm",
        model="smollm2-135m-instruct",
        engine="speechrt",
        backend="torch",
        precision="int4",
        device="cpu",
        unit="tok/s",
        better="higher",
    )
    for b, v in ((1, 50.0), (4, 120.0)):
        res.records.append(
            Record(
                workload=f"batch {b}, 16 tokens",
                metric="decode_tok_s",
                value=v,
                repeats=Repeats(2, v * 0.95, v, v * 1.02),
                params={"batch": b},
                **lm,
            )
        )
    srv = dict(
        family="server",
        model="whisper-tiny.en",
        engine="speechrt",
        backend="torch",
        precision="float32",
        device="cpu",
        unit="s",
        better="lower",
    )
    for n, p50, p95 in ((1, 0.2, 0.3), (2, 0.25, 0.4), (4, 0.5, 1.2)):
        for q, v in (("p50", p50), ("p95", p95)):
            res.records.append(
                Record(
                    workload=f"transcription, {n} streams",
                    metric=f"final_{q}_s",
                    value=v,
                    params={"streams": n, "mode": "transcription"},
                    **srv,
                )
            )
    probe = dict(
        family="kernels",
        model="-",
        engine="probe",
        backend="torch",
        precision="float16",
        device="cuda",
        workload="roofline probe",
        better="higher",
        params={"gpu": "NVIDIA H100 80GB HBM3"},
    )
    res.records += [
        Record(metric="copy_GBps", unit="GB/s", value=2900.0, **probe),
        Record(metric="matmul_TFLOPs", unit="TFLOP/s", value=600.0, **probe),
    ]
    k = dict(
        family="kernels",
        model="linear",
        engine="speechrt",
        backend="triton",
        precision="float16",
        device="cuda",
        workload="linear whisper enc 1500x384->1536",
        params={"bytes": 6_600_000, "flops": 1_769_472_000},
    )
    res.records += [
        Record(metric="time_us", unit="us", value=9.0, better="lower", **k),
        Record(metric="roof_fraction", unit="", value=0.33, better="higher", **k),
    ]
    res.write(out, machine=m)
    return out


def test_report_merges_machines_into_one_page(bench, tts_runs, tmp_path):
    b = _other_machine(tts_runs[0], tmp_path / "gpu-box.json")
    out = tmp_path / "site" / "report.html"
    r = bench("report", tts_runs[0], b, "--out", out, "--baseline", "0")
    assert r.returncode == 0, r.stderr
    pngs = sorted(p.name for p in out.parent.glob("report-*.png"))
    assert pngs == ["report-kernels.png", "report-lm.png", "report-server.png", "report-tts.png"], pngs
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 4  # self-contained: the charts are in the page too
    assert 'src="http' not in page and "<link" not in page
    assert "Test GPU box" in page and fingerprint.describe(load(tts_runs[0]).machine) in page
    # the second machine's rows are 1.5x faster than the baseline's, and ours are compared with Piper
    assert re.search(r"<td class=\"up\">1\.50x</td>", page), "no 1.50x ratio against the baseline"
    assert "x vs piper-tts float32" in page


def test_report_opens_in_chromium_with_its_plots(bench, tts_runs, tmp_path):
    if CHROMIUM is None:
        pytest.skip("needs a Chromium browser: `apt-get install -y chromium` (or set SPEECHRT_CHROMIUM)")
    b = _other_machine(tts_runs[0], tmp_path / "gpu-box.json")
    out = tmp_path / "report.html"
    assert bench("report", tts_runs[0], b, "--out", out).returncode == 0
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(args + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120).stdout
    # the page's load handler counts the images the browser decoded
    assert 'data-plots="4/4"' in dom, dom[:500]
    assert dom.count("<table") >= 3
    shot = tmp_path / "report.png"
    subprocess.run(
        args + ["--window-size=1400,2400", f"--screenshot={shot}", out.as_uri()], capture_output=True, timeout=120
    )
    if os.environ.get("SPEECHRT_REPORT_SCREENSHOT"):
        shutil.copy(shot, os.environ["SPEECHRT_REPORT_SCREENSHOT"])
    import matplotlib.image

    img = matplotlib.image.imread(shot)
    assert img.shape[:2] == (2400, 1400)
    assert img.std() > 0.05  # tables and charts, not a blank page


def test_markdown_names_each_runs_machine(bench, tts_runs, tmp_path):
    md = tmp_path / "bench.md"
    r = bench("report", *tts_runs, "--markdown", md)
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert (tmp_path / "bench" / "bench-tts.png").exists() and "](bench/bench-tts.png)" in text
    machine = load(tts_runs[0]).machine
    assert f"| {fingerprint.describe(machine)} |" in text
    assert text.count("| speechrt torch float32 | cpu |") == 2  # rtf and first audio, one column per run


def test_docs_benchmarks_md_is_generated_from_the_committed_results(tmp_path):
    """docs/benchmarks.md is the Markdown report of the committed result files, as its first lines say:
    regenerating it changes nothing but the output path in that line."""
    md = ROOT / "docs" / "benchmarks.md"
    lines = md.read_text().splitlines()
    cmd = re.search(r"generated by `speechrt bench (report .*?) --markdown docs/benchmarks.md`", lines[2])
    assert cmd, f"docs/benchmarks.md does not say which command generated it: {lines[2]!r}"
    args = cmd.group(1).split()
    assert all((ROOT / f).exists() for f in args[1:] if f.endswith(".json"))
    out = tmp_path / "benchmarks.md"
    r = subprocess.run(
        [sys.executable, "-m", "speechrt", "bench", *args, "--markdown", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = out.read_text().splitlines()
    assert len(got) == len(lines) and got[:2] + got[3:] == lines[:2] + lines[3:]
    assert sorted(p.name for p in (tmp_path / "benchmarks").glob("*.png")) == sorted(
        p.name for p in (ROOT / "docs" / "benchmarks").glob("benchmarks-*.png")
    )


def test_server_chart_names_each_run_once_under_its_panels():
    """Many runs (docs/benchmarks.md has dozens): each run is one legend entry shared by the panels, p50 solid
    and p95 dashed in its colour; before, every panel had its own legend of two entries per run over its plot."""
    import matplotlib.pyplot as plt

    from speechrt.bench import plots

    srv = dict(
        family="server",
        model="whisper-tiny.en",
        engine="speechrt",
        backend="onnxruntime",
        precision="int8",
        device="cpu",
        unit="s",
        better="lower",
    )
    runs = []
    for i in range(12):
        recs = [
            Record(
                workload=f"{mode}, {n} streams",
                metric=f"{m}_{q}_s",
                value=0.1 * (i + 1) * n + (q == "p95"),
                params={"streams": n, "mode": mode},
                **srv,
            )
            for n in (1, 4, 16)
            for q in ("p50", "p95")
            for mode, m in (("transcription", "final"), ("conversation", "v2v"))
        ]
        runs.append((f"machine {i}", Results(machine={}, records=recs)))
    fig = plots.server_latency(runs)
    axes = fig.get_axes()
    assert len(axes) == 2 and all(ax.get_legend() is None for ax in axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == sorted({f"speechrt onnxruntime int8 (machine {i})" for i in range(12)}), labels
    for ax in axes:
        styles = sorted(line.get_linestyle() for line in ax.get_lines() if line.get_linestyle() != ":")
        assert styles == ["-"] * 12 + ["--"] * 12  # each run's p50 and p95 (the ':' line is the 1-s bound)
    plt.close(fig)
