"""`bench lm --grammar json`: our engine with every sequence under the benchmark's JSON schema writes every token asked
for (the schema never closes early, so both runs do the same work), and the ratio line compares each backend with
itself without the grammar."""

from __future__ import annotations

from speechrt.bench.lm import _grammar_ratios
from speechrt.bench.lm_engines import GRAMMAR_TAG, Ours


def test_the_grammar_engine_writes_every_token_asked_for(one_cpu_thread):
    eng = Ours(None, "cpu", None, 1, "torch", grammar=True)
    assert eng.grammar is not None and "JSON schema grammar" in eng.note
    ids = eng.lm.encode_chat("Describe a person as JSON.")
    ttft, tps = eng.run([ids, ids], 12)  # (Ours.run asserts that every sequence wrote its 12 tokens)
    assert ttft > 0 and tps > 0


def test_grammar_ratio_line(capsys):
    row = lambda tps: {"rows": [{"batch": 1, "tps": tps, "tps_median": tps}]}  # noqa: E731
    _grammar_ratios({"speechrt torch": row(100.0), f"speechrt torch {GRAMMAR_TAG}": row(95.0)}, [1])
    out = capsys.readouterr().out
    assert "grammar overhead, speechrt torch, batch 1: 95.0 vs 100.0 decode tok/s" in out and "0.950x" in out
