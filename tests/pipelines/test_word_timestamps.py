"""Word timestamps (TranscribeOptions.word_timestamps) against faster-whisper's `word_timestamps=True` on the
same CTranslate2 weights (the embedded whisper-tiny.en), and the dynamic time warping against a brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from speechrt.cli_asr import sample_path
from speechrt.models.audio import load_audio
from speechrt.models.registry import resolve
from speechrt.pipelines.whisper_timing import dtw, median_filter


@pytest.fixture(scope="module")
def fw_model():
    fw = pytest.importorskip("faster_whisper")
    return fw.WhisperModel(str(resolve(None, "asr").path), device="cpu", compute_type="float32", cpu_threads=2)


def _paths(n, m):
    """Every monotonic path through an n x m grid from (0, 0) to (n-1, m-1) by steps (1,1), (1,0), (0,1)."""

    def walk(i, j):
        if (i, j) == (n - 1, m - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < m:
                for rest in walk(i + di, j + dj):
                    yield [(i, j)] + rest

    return list(walk(0, 0))


def test_dtw_finds_the_cheapest_path_of_a_brute_force_search():
    rng = np.random.default_rng(0)
    for n, m in itertools.product(range(1, 6), range(1, 7)):
        paths = _paths(n, m)
        for _ in range(4):
            x = rng.standard_normal((n, m)).astype(np.float32)
            rows, cols = dtw(x)
            path = list(zip(rows.tolist(), cols.tolist()))
            assert path in paths, (n, m, path)  # a valid path: starts at (0, 0), ends at the corner
            best = min(sum(float(x[i, j]) for i, j in p) for p in paths)
            assert sum(float(x[i, j]) for i, j in path) == pytest.approx(best, abs=1e-5)


def test_median_filter_reflects_at_the_edges():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 20)).astype(np.float32)
    out = median_filter(x, 7)
    ref = np.empty_like(x)
    for j in range(20):  # openai/whisper and CTranslate2: index -k reads k, 20 + k reads 18 - k
        idx = [abs(j + k) if abs(j + k) < 20 else 38 - abs(j + k) for k in range(-3, 4)]
        ref[..., j] = np.median(x[..., idx], axis=-1)
    np.testing.assert_array_equal(out, ref)
    assert median_filter(x[..., :3], 7) is not None  # shorter than the window: returned as is


@pytest.mark.parametrize("name", ["sample.wav", "passage.flac"])
def test_word_timestamps_match_faster_whisper(asr, fw_model, name):
    """Same words, and their start/end within 0.1 s (median) of faster-whisper's on the same weights;
    passage.flac is three whole windows, each starting after the last one's last word."""
    audio = load_audio(sample_path().with_name(name))
    ours = asr.transcribe(audio, 16000, word_timestamps=True, trim_context=False)  # faster-whisper's windows
    segs = list(fw_model.transcribe(audio, beam_size=1, vad_filter=False, word_timestamps=True)[0])
    a = [w for s in ours.segments for w in s.words]
    b = [w for s in segs for w in s.words]
    assert [w.word for w in a] == [w.word for w in b] and len(a) > 20
    diffs = np.abs([x.start - y.start for x, y in zip(a, b)] + [x.end - y.end for x, y in zip(a, b)])
    print(
        f"{name}: {len(a)} words, boundary |ours - faster-whisper| median {np.median(diffs):.3f} s, "
        f"p90 {np.percentile(diffs, 90):.3f} s, max {diffs.max():.3f} s"
    )
    assert np.median(diffs) <= 0.1 and np.percentile(diffs, 90) <= 0.2
    np.testing.assert_allclose([w.probability for w in a], [w.probability for w in b], atol=1e-3)
    assert [round(s.start, 2) for s in ours.segments] == [round(s.start, 2) for s in segs]
    assert all(w.start <= w.end for w in a) and all(x.start <= y.start for x, y in zip(a, a[1:]))
    assert ours.to_dict()["segments"][0]["words"][0].keys() == {"word", "start", "end", "probability"}


def test_word_timestamps_are_off_by_default(asr):
    t = asr.transcribe(sample_path())
    assert t.segments and all(s.words == [] for s in t.segments)
    assert "words" not in t.to_dict()["segments"][0]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_onnxruntime_word_timestamps_match_torch(asr, dtype):
    """The ONNX graphs output no attention weights: word timing runs the source model's torch decoder over
    the graphs' cross keys/values. float32: torch's words and times (within 0.02 s); int8 (its own
    encoder, which may hear a word differently): the same number of words, nearly all the same, times
    within 0.1 s (median). align() too."""
    pytest.importorskip("onnxruntime")
    from speechrt import backends
    from speechrt.pipelines.asr import ASRPipeline

    ort_asr = ASRPipeline(backends.get("onnxruntime").asr(resolve(None, "asr"), dtype=dtype))
    audio = load_audio(sample_path())
    a = [w for s in ort_asr.transcribe(audio, 16000, word_timestamps=True).segments for w in s.words]
    b = [w for s in asr.transcribe(audio, 16000, word_timestamps=True).segments for w in s.words]
    same = [x.word.strip(" .,").lower() == y.word.strip(" .,").lower() for x, y in zip(a, b)]
    assert len(a) == len(b) > 10 and (all(same) if dtype == "float32" else np.mean(same) >= 0.9)
    diffs = np.abs([x.start - y.start for x, y in zip(a, b)] + [x.end - y.end for x, y in zip(a, b)])
    assert (diffs.max() <= 0.02) if dtype == "float32" else (np.median(diffs) <= 0.1), diffs
    tokens = asr.transcribe_batch([audio], asr.options(without_timestamps=True))[0].tokens
    words, logprobs = ort_asr.align(audio, tokens)
    ref_words, ref_logprobs = asr.align(audio, tokens)
    assert [w.word for w in words] == [w.word for w in ref_words] and len(logprobs) == len(ref_logprobs)
    assert all(np.isfinite(lp) and lp <= 0 for _, _, lp in logprobs)


def test_onnxruntime_word_timestamps_name_a_missing_source_model():
    pytest.importorskip("onnxruntime")
    import dataclasses

    from speechrt import backends
    from speechrt.errors import UserError
    from speechrt.pipelines.asr import ASRPipeline

    runner = backends.get("onnxruntime").asr(resolve(None, "asr"), dtype="float32")
    runner.manifest = dataclasses.replace(runner.manifest, source={"path": "/nowhere/whisper", "format": "ct2-whisper"})
    with pytest.raises(UserError, match="/nowhere/whisper.*--backend torch"):
        ASRPipeline(runner).transcribe(sample_path(), word_timestamps=True)
