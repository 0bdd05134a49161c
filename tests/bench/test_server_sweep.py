"""`speechrt bench server --streams 1,2`: the load sweep against a real `speechrt serve`, real-time paced
speech, its records per level, and the highest level that keeps p95 final latency <= 1 s. The peer
(WhisperLive) needs its own virtual environment with network installs: its test runs only where one
exists (`speechrt bench server --setup-peer`, or $SPEECHRT_PEER_VENV)."""

from __future__ import annotations

import json

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
        assert any(
            s.what.startswith(f"{engine} ")
            and ("p95 final latency passed 1 s" in s.reason or "without a final transcript" in s.reason)
            for s in res.skipped
        )
    return rows


def test_sweep_against_speechrt(bench, tmp_path):
    out = tmp_path / "sweep.json"
    r = bench(
        "server", "--streams", "1,2", "--utterances", "2", "--client-processes", "2", "--peer", "none", "--json", out
    )
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
        families = {x.params["family"]: x.value for x in rows if x.metric == "engine_family_busy_fraction"}
        assert set(families) == {"asr", "lm", "tts"} and 0 < families["asr"] <= 1.05, families  # (one worker each)
        assert 0 < by[(n, "vad_cores")].value < by[(n, "server_cpu_cores")].value
        assert (n, "gpu_busy_fraction") not in by  # sampled on CUDA devices only
        assert by[(n, "client_processes")].value == n  # --client-processes 2, at most one a stream
        assert 0 <= by[(n, "client_cpu_busiest_fraction")].value <= 1 and by[(n, "client_cpu_cores")].value > 0
    assert "(server " in r.stdout and "engine busy" in r.stdout and ", VAD " in r.stdout and "GPU none" in r.stdout


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


def test_find_max_ramp_goes_past_32_streams_for_a_gpu_up_to_2048():
    import argparse

    from speechrt.bench import server

    p = argparse.ArgumentParser()
    server.add_arguments(p)
    assert server._levels(p.parse_args(["--find-max"]))[-1] == 24  # the default top: a 2-core CPU's range
    ramp = server._levels(p.parse_args(["--find-max", "--max-streams", "128"]))
    assert ramp[:11] == [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32] and ramp[11:] == [48, 64, 96, 128]
    assert server._levels(p.parse_args(["--find-max", "--max-streams", "1000"]))[-1] == 768
    assert server._levels(p.parse_args(["--find-max", "--max-streams", "4096"]))[-4:] == [768, 1024, 1536, 2048]
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


@pytest.fixture(scope="module")
def full_server(asr):
    """A real speechrt server (in a thread of this process) that admits two sessions."""
    import asyncio
    import threading

    from speechrt.streaming.config import ServerOptions
    from speechrt.streaming.server import SpeechServer

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    srv = SpeechServer(ServerOptions(port=0, max_sessions=2), asr)
    asyncio.run_coroutine_threadsafe(srv.start(), loop).result(60)
    yield f"ws://127.0.0.1:{srv.port}/v1/realtime"
    asyncio.run_coroutine_threadsafe(srv.shutdown(graceful=False), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


def _short_recordings():
    """Two of the benchmark's recordings with 0.8 s of silence after the speech instead of 2 s: short levels."""
    from speechrt.bench.server_streams import RATE, SENTENCES, recordings

    return [(t, pcm[: 2 * int((s1 + 0.8) * RATE)], s0, s1) for t, pcm, s0, s1 in recordings(SENTENCES[:2])]


def test_two_client_processes_gather_every_stream_as_one_process_does(full_server):
    """A level's streams sent from two client processes (stream i from process i mod 2, each on its own event loop)
    come back as from one: a result per stream and utterance, each with its final transcript and latencies, and the
    level's load: the server's cores and engine busy share from /metrics, no GPU on a CPU, the clients' cores and
    the busiest client process's share of its core."""
    import argparse
    import math
    import os

    from speechrt.bench import server
    from speechrt.bench.server_clients import ClientPool
    from speechrt.bench.server_engines import Speechrt
    from speechrt.bench.server_results import load_text, summary
    from speechrt.bench.server_streams import spoken
    from speechrt.models.wer import wer

    p = argparse.ArgumentParser()
    server.add_arguments(p)
    recs = _short_recordings()
    got = {}
    for processes in (2, 1):
        args = p.parse_args(["--url", full_server, "--utterances", "1", "--client-processes", str(processes)])
        with ClientPool(spoken(recs), processes) as clients:
            e = Speechrt(args, False, clients)
            results = e.level(recs, 2)
        assert [(r["stream"], r["utterance"]) for r in results] == [(0, 0), (1, 0)]  # none lost, none twice
        assert [r["text"] for r in results] == [recs[0][0], recs[1][0]]  # stream i speaks recording i first
        for r in results:
            assert 0 < r["final"] < 10 and wer(r["text"], r["transcript"]) <= 0.25, r
        row = {**summary(2, results, False), **e.last}
        assert row["lost"] == 0 and row["refused"] == 0 and row["utterances"] == 2
        assert row["client_processes"] == processes and row["gpu_busy"] is None  # a CPU: no GPU sampled
        for key in ("engine_busy", "client_cpu_share"):
            assert 0 <= row[key] <= 1.05, (key, row[key])
        for key in ("server_cpu_cores", "client_cpu_cores", "host_cpu_cores"):
            assert math.isfinite(row[key]) and 0 < row[key] <= (os.cpu_count() or 1) + 0.5, (key, row[key])
        # the host's cores count every process's; the two are timed over windows that differ a little (the load's
        # from the bench process, each client's inside it: a 0.41-core client beside a 0.38-core host was seen)
        assert row["host_cpu_cores"] >= 0.75 * row["client_cpu_cores"], row
        assert row["engine_busy"] > 0 and "GPU none" in load_text(row)
        got[processes] = results
    # the same fields per utterance whichever way the streams were sent (live deltas may or may not have come)
    assert [set(r) - {"partial"} for r in got[2]] == [set(r) - {"partial"} for r in got[1]]


def test_find_max_stops_at_the_first_failing_level(full_server, bench, tmp_path):
    """--find-max ramps 1, 2, 4 streams against a server that is full (its two sessions held open): the first level's
    session is refused (`session_limit_reached`), which is a level that fails (its utterance has no final), not a
    crash; the ramp stops there, the levels above are recorded as skipped, and the level's load is reported."""
    import time
    import urllib.request

    from websockets.sync.client import connect

    from speechrt.bench.server_engines import http_base

    for _ in range(100):  # the last test's sessions closed
        with urllib.request.urlopen(http_base(full_server) + "/healthz") as h:
            if json.load(h)["sessions"] == 0:
                break
        time.sleep(0.1)
    held = [connect(full_server + "?intent=transcription") for _ in range(2)]
    try:
        for ws in held:
            assert json.loads(ws.recv())["type"] == "session.created"
        out = tmp_path / "ramp.json"
        r = bench(
            "server", "--url", full_server, "--find-max", "--max-streams", "4", "--utterances", "1",
            "--client-processes", "2", "--final-wait", "5", "--peer", "none", "--json", out,
        )  # fmt: skip
    finally:
        for ws in held:
            ws.close()
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    ran = sorted({x.params["streams"] for x in res.records if "streams" in x.params})
    assert ran == [1]
    (skip,) = [s for s in res.skipped if s.what.startswith("speechrt ")]
    assert skip.what == "speechrt 2,4 streams" and "4 utterances without a final transcript at 1 streams" in skip.reason
    assert "1 refused" in skip.reason and "1 sessions refused or not connected" in r.stdout
    by = {x.metric: x for x in res.records if x.params.get("streams") == 1}
    assert by["wer"].params["lost"] == by["wer"].params["utterances"] == 4  # stream 0 would speak every recording
    assert by["client_processes"].value == 1  # one stream: one process, whatever --client-processes allows
    assert 0 <= by["client_cpu_busiest_fraction"].value <= 1 and 0 <= by["engine_busy_fraction"].value <= 1.05
    assert "gpu_busy_fraction" not in by and "GPU none" in r.stdout
    (best,) = [x for x in res.records if x.metric == "max_streams_p95_final_le_1s"]
    assert best.value == 0


def test_client_processes_default_from_the_streams_and_the_cores(bench):
    """--client-processes auto: one process per 128 streams, at most half the cores, at least one; a bad value is
    one clear line."""
    from speechrt.bench.server_clients import default_processes

    assert [default_processes(n, 16) for n in (1, 128, 129, 1024, 2048)] == [1, 1, 2, 8, 8]
    assert default_processes(1024, 8) == 4 and default_processes(2048, 2) == 1 and default_processes(64, 1) == 1
    r = bench("server", "--client-processes", "0")
    assert r.returncode == 2 and "--client-processes must be a positive number or auto, got '0'" in r.stderr


def test_the_gpu_ramp_asks_bench_server_for_bounded_levels():
    """`bench gpu`'s server-ramp: bench server's options for its ramp parse, with short levels that stop early."""
    import argparse

    from speechrt.bench import gpu, gpu_server, server

    p = argparse.ArgumentParser()
    gpu.add_arguments(p)
    a = gpu_server.server_args(p.parse_args(["--device", "cuda:1"]), "ramp.json")
    assert server._levels(a) == [1, 64, 128, 256, 512, 1024, 2048] and a.device == "cuda:1"
    assert a.utterances == 2 and a.final_wait == 10 and a.time_budget == 360 and a.client_processes == "auto"
    assert a.peer == "none" and not a.keep_going and a.json == "ramp.json"


def test_each_workers_engine_busy_share_is_read_from_metrics_that_list_workers():
    """/metrics read generically: per-worker (or per-replica) engine_busy_seconds_total series give each worker's
    busy share and the level's engine_busy is their mean; a page with one engine gives no per-worker shares, and its
    model families' busy seconds where it lists them."""
    from speechrt.bench.server_load import engine_shares, parse_counters

    one = parse_counters(
        "speechrt_engine_busy_seconds_total 4.5\nspeechrt_process_cpu_seconds_total 9\n",
        "speechrt_",
        ("engine_busy_seconds_total",),
    )
    assert one == {"engine_busy_seconds_total": 4.5} and engine_shares(one, one, 1.0) == {}
    page = (
        "speechrt_engine_busy_seconds_total 3.0\n"
        'speechrt_worker_engine_busy_seconds_total{worker="0"} 1.0\n'
        'speechrt_worker_engine_busy_seconds_total{worker="1"} 2.0\n'
    )
    later = page.replace("} 1.0", "} 6.0").replace("} 2.0", "} 4.5")
    before, after = (parse_counters(t, "speechrt_", ("engine_busy_seconds_total",)) for t in (page, later))
    assert engine_shares(before, after, 10.0) == {"0": 0.5, "1": 0.25}
    ray = 'speechrt_replica_engine_busy_seconds_total{replica="a",node="n1"} 2.5\n'
    assert parse_counters(ray, "speechrt_cluster_", ())["workers"] == {"a": 2.5}
    # one engine, a worker thread per model family: each family's seconds (the level's engine_busy: the busiest)
    fam = 'speechrt_engine_family_busy_seconds_total{family="asr"} 2.0\n'
    fam += 'speechrt_engine_family_busy_seconds_total{family="tts"} 0.5\n'
    assert parse_counters(fam, "speechrt_", ())["families"] == {"asr": 2.0, "tts": 0.5}


def test_no_level_starts_past_the_time_budget(full_server, bench, tmp_path):
    """--time-budget: a level that would start past it is not run, and is recorded as skipped with the reason."""
    out = tmp_path / "budget.json"
    r = bench(
        "server", "--url", full_server, "--streams", "1,2", "--time-budget", "0", "--peer", "none", "--json", out
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    assert not [x for x in res.records if "streams" in x.params]
    assert [(s.what, s.reason) for s in res.skipped] == [("speechrt 1,2 streams", "past --time-budget 0 s")]
    assert "(levels 1,2 not run: past --time-budget 0 s)" in r.stdout
