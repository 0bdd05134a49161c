"""`speechrt bench startup`: a real cold start (an empty cache: the speech recognizer's int8 graphs are exported)
and a warm one of `speechrt serve --transcription-only`, in one result file; the cold start's log is what a
user's log file would hold."""

from __future__ import annotations

from speechrt.bench.record import load


def test_cold_and_warm_start_of_serve(bench, tmp_path):
    out, logs = tmp_path / "s.json", tmp_path / "logs"
    r = bench("startup", "--cold", "1", "--warm", "1", "--transcription-only", "--log-dir", logs, "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    by = {(x.workload.split(" ")[0], x.metric): x for x in res.records}
    for kind in ("cold", "warm"):
        ready, first = by[(kind, "healthz_ready_s")], by[(kind, "healthz_first_answer_s")]
        assert 0 < first.value <= ready.value and ready.unit == "s" and ready.better == "lower"
        assert by[(kind, "cpu_s_to_ready")].value > 0 and by[(kind, "models_loaded_s")].value > 0
        assert ready.params["runners"].startswith("asr ") and ready.params["cache_mib"] > 0
    # what serve ran, as its /healthz said (the backend auto picks here, and its precision)
    assert "asr onnxruntime int8" in r.stdout or "asr torch" in r.stdout
    # the cold start's server log (stderr to a file): an export's progress as one line per stage, no redraws
    cold = (logs / "cold0.log").read_text()
    assert "\r" not in cold and "\x1b" not in cold
    stages = [ln for ln in cold.splitlines() if ln.startswith("speechrt: export asr")]
    if "asr onnxruntime" in r.stdout:  # exported on first use into the empty cache
        assert stages and stages[-1].split(": ", 2)[2].startswith("exported asr")
    assert not any(ln.startswith("speechrt: export") for ln in (logs / "warm0.log").read_text().splitlines())
