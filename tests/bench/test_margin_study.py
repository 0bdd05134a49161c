"""benchmarks.margin_study on the conversation benchmark's questions: the server's final-transcript margin
(streaming.asr_options.FINAL_MARGIN_S) keeps the WER of whole 30-s windows on the engine the server runs (ONNX
Runtime int8) — equal on the Zen 4 it was chosen on; one word of slack over the 12 clips for other CPUs'
rounding — and encodes less than a whole window."""

from __future__ import annotations

import speechrt
from benchmarks import margin_study
from speechrt.bench.server_streams import QUESTIONS
from speechrt.models.wer import normalize
from speechrt.streaming.asr_options import FINAL_MARGIN_S


def test_the_final_margin_keeps_whole_windows_wer():
    data = [c for c in margin_study.clips(seeds=1) if c[0] in QUESTIONS]
    assert len(data) == len(QUESTIONS) * len(margin_study.SILENCES)
    asr = speechrt.load_asr(backend="onnxruntime", dtype="int8")
    whole, final = margin_study.study(asr, data, [None, FINAL_MARGIN_S])
    assert whole["wer"] < 0.1 and len(final["hyps"]) == len(data) and all(final["hyps"])
    words = sum(len(normalize(t)) for t, _ in data)
    assert final["wer"] <= whole["wer"] + 1 / words + 1e-9, [(t, h) for (t, _), h in zip(data, final["hyps"])]
    assert FINAL_MARGIN_S + max(len(a) for _, a in data) / margin_study.RATE < 30
