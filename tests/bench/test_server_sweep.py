"""`speechrt bench server --streams 1,2`: the load sweep against a real `speechrt serve`, real-time paced
speech, its records per level, and the highest level that keeps p95 final latency <= 1 s. The peer
(WhisperLive) needs its own virtual environment with network installs: its test runs only where one
exists (`speechrt bench server --setup-peer`, or $SPEECHRT_PEER_VENV)."""

from __future__ import annotations

import pytest

from speechrt.bench import whisper_live
from speechrt.bench.record import load


def _check_sweep(res, engine, levels):
    rows = [r for r in res.records if r.engine == engine]
    ran = sorted({r.params["streams"] for r in rows if "streams" in r.params})
    assert ran and ran == levels[: len(ran)], ran
    by = {(r.params.get("streams"), r.metric): r for r in rows}
    ok, meets = [], []
    for n in ran:
        p50, p95 = by[(n, "final_p50_s")], by[(n, "final_p95_s")]
        assert 0 < p50.value <= p95.value < 60
        assert p95.repeats.n == p50.params["utterances"] - p50.params["lost"]
        assert by[(n, "wer")].value <= 25.0  # Whisper tiny.en on clean synthetic speech
        if p95.value <= 1.0 and p50.params["lost"] == 0:
            ok.append(n)
            live = by.get((n, "partial_p50_s"))
            alone = by.get((n, "wer_same_utterances_alone"), by[(n, "wer")])
            if (live is None or live.value <= 1.0) and by[(n, "wer")].value <= alone.value + 1.0:
                meets.append(n)
    (best,) = [r for r in rows if r.metric == "max_streams_p95_final_le_1s"]
    assert best.value == max(ok, default=0)
    (capacity,) = [r for r in rows if r.metric == "max_streams_meeting_targets"]
    assert capacity.value == max(meets, default=0) <= best.value
    if len(ran) < len(levels):  # it stopped: the last level it ran missed the bound, and the rest are skips
        assert ran[-1] not in ok
        assert any(s.what.startswith(f"{engine} ") and "p95 final latency passed 1 s" in s.reason for s in res.skipped)
    return rows


def test_sweep_against_speechrt(bench, tmp_path):
    out = tmp_path / "sweep.json"
    r = bench("server", "--streams", "1,2", "--utterances", "2", "--peer", "none", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    rows = _check_sweep(res, "speechrt", [1, 2])
    from speechrt.backends.auto import choose

    auto = choose("asr", "cpu")  # the server runs --backend auto: the records name what it chose
    assert {x.backend for x in rows} == {auto.backend}
    assert {x.precision for x in rows} <= ({auto.dtype} if auto.dtype else {"float32", "bfloat16"})
    assert "highest level with p95 final-transcript latency <= 1 s" in r.stdout
    by = {(x.params.get("streams"), x.metric): x for x in rows}
    # the single stream spoke every recording (3), so level 2's utterances have their WER alone beside
    assert by[(1, "wer")].params["utterances"] == 3 and (2, "wer_same_utterances_alone") in by
    assert 0 <= by[(2, "live_text_unlike_final")].value <= by[(2, "wer")].params["utterances"]
    # each level's load, from the server's /metrics: its process's CPU cores, its engine's time in model steps and
    # its voice activity detection thread's cores
    import os

    for n in (1, 2):
        assert 0 < by[(n, "server_cpu_cores")].value <= (os.cpu_count() or 1) + 0.5
        assert 0 < by[(n, "engine_busy_fraction")].value <= 1.05
        assert 0 < by[(n, "vad_cores")].value < by[(n, "server_cpu_cores")].value
        assert (n, "gpu_busy_fraction") not in by  # sampled on CUDA devices only
    assert "(server " in r.stdout and "engine busy" in r.stdout and ", VAD " in r.stdout


def test_level_summary_compares_the_same_utterances_alone():
    """_summary: the WER of a level's utterances as the single stream heard them, and the utterances whose
    live deltas did not add up to their final transcript."""
    from speechrt.bench.server_results import summary as _summary

    alone = _summary(
        1,
        [
            {"text": "turn off the lights", "transcript": "Turn off the lights.", "final": 0.2},
            {"text": "add milk and eggs", "transcript": "And no can eggs.", "final": 0.3},
        ],
        False,
    )
    assert alone["wer"] == 3 / 8 and alone["live_inconsistent"] == 0
    loaded = [
        {
            "text": "add milk and eggs",
            "transcript": "And milk and eggs.",
            "final": 0.5,
            "partial": 0.9,
            "live_consistent": False,
        },
        {"text": "add milk and eggs", "transcript": "And no can eggs.", "final": 0.6, "live_consistent": True},
    ]
    row = _summary(2, loaded, False, alone)
    assert row["wer"] == 4 / 8 and row["wer_alone"] == 6 / 8  # alone, both were "And no can eggs."
    assert row["live_inconsistent"] == 1 and row["partial"]["samples"] == [0.9]
    assert row["ok"] and row["meets"]  # final p95 0.6 s, live p50 0.9 s, WER below the same utterances alone
    slow_live = _summary(2, [dict(loaded[0], partial=1.5)], False, alone)
    assert slow_live["ok"] and not slow_live["meets"]  # live text p50 over 1 s
    worse = _summary(
        2, [{"text": "turn off the lights", "transcript": "Turn of the light.", "final": 0.4}], False, alone
    )
    assert worse["ok"] and worse["wer"] == 0.5 and worse["wer_alone"] == 0 and not worse["meets"]
    stranger = _summary(2, [{"text": "a sentence alone never spoke", "transcript": "", "final": 1.0}], False, alone)
    assert "wer_alone" not in stranger and stranger["wer"] == 1.0


def test_streams_must_be_positive(bench):
    r = bench("server", "--streams", "1,0")
    assert r.returncode == 2 and "--streams must be a positive number or a comma list" in r.stderr


@pytest.mark.skipif(
    whisper_live.unavailable(whisper_live.DEFAULT_VENV) is not None,
    reason="the WhisperLive peer is not installed: `speechrt bench server --setup-peer` "
    "(or set SPEECHRT_PEER_VENV); its install needs the package index",
)
def test_sweep_with_the_whisper_live_peer(bench, tmp_path):
    out = tmp_path / "sweep.json"
    r = bench("server", "--streams", "1", "--utterances", "2", "--peer", "whisper-live", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    _check_sweep(res, "speechrt", [1])
    peer = [x for x in res.records if x.engine == "whisper-live"]
    assert peer and {x.backend for x in peer} == {"ctranslate2"}
    ours = [x for x in res.records if x.engine == "speechrt" and x.metric == "final_p50_s"]
    assert ours and all(x.peer == "whisper-live int8" for x in ours)
    assert any(n.startswith("peer: whisper-live 0.10.0") for n in res.notes)


def test_long_recording_speaks_without_a_pause():
    """--long-turn's recording: the given recordings' speech back to back, 0.15 s apart, until the length
    asked, with their text in order and the speech span measured."""
    import numpy as np

    from speechrt.bench.server_streams import RATE
    from speechrt.bench.server_streams import long_recording as _long_recording

    def rec(text, n):
        pcm = np.concatenate([np.zeros(RATE // 2), np.full(n, 1000), np.zeros(RATE)]).astype("<i2").tobytes()
        return text, pcm, 0.5, 0.5 + n / RATE

    text, pcm, s0, s1 = _long_recording([rec("one", RATE * 2), rec("two", RATE * 3)], 9.0)
    assert text == "one two one two" and s0 == 0.5
    speech = np.frombuffer(pcm, "<i2")[int(s0 * RATE) : int(round(s1 * RATE))]
    assert abs(len(speech) / RATE - (10 + 3 * 0.15)) < 1e-6
    assert (speech != 0).sum() == 10 * RATE and len(pcm) // 2 == int(round(s1 * RATE)) + 2 * RATE


def test_dense_speech_keeps_no_pause_over_80_ms():
    """--long-turn-speech dense: squeeze cuts the lead and tail silence and every quiet stretch over 80 ms to 80 ms
    (its two ends kept), and keeps the sounds whole."""
    import numpy as np

    from speechrt.bench.server_streams import RATE, squeeze

    tone = np.sin(np.arange(RATE // 2) / 3).astype(np.float32) * 0.5  # 0.5 s of sound
    gap = np.zeros(RATE * 3 // 10, np.float32)  # a 300-ms pause
    short = np.zeros(RATE // 20, np.float32)  # a 50-ms one
    out = squeeze(np.concatenate([gap, tone, gap, tone, short, tone, gap]))
    assert len(out) == 3 * len(tone) + RATE * 8 // 100 + len(short)
    assert np.abs(out[: RATE // 100]).max() > 0.1 and np.abs(out[-RATE // 100 :]).max() > 0.1  # no lead or tail
    assert squeeze(np.zeros(RATE, np.float32)).size == 0


def test_find_max_ramp_goes_past_32_streams_for_a_gpu_up_to_what_the_server_admits():
    import argparse

    from speechrt.bench import server

    p = argparse.ArgumentParser()
    server.add_arguments(p)
    assert server._levels(p.parse_args(["--find-max"]))[-1] == 24  # the default top: a 2-core CPU's range
    ramp = server._levels(p.parse_args(["--find-max", "--max-streams", "128"]))
    assert ramp[:11] == [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32] and ramp[11:] == [48, 64, 96, 128]
    assert server._levels(p.parse_args(["--find-max", "--max-streams", "1000"]))[-1] == 256  # serve --max-sessions 256
    assert server._levels(p.parse_args(["--streams", "64,1,8"])) == [1, 8, 64]


def test_gpu_sampling_maps_torch_devices_to_nvml_and_samples_nothing_on_a_cpu(monkeypatch):
    from speechrt.bench.server_load import GpuBusy, nvml_index

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_index("cuda") == 0 and nvml_index("cuda:3") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert nvml_index("cuda") == 2 and nvml_index("cuda:1") == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert nvml_index("cuda:0") == 0
    with GpuBusy("cpu") as g:
        pass
    assert g.samples == []
