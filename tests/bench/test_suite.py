"""`speechrt bench all`: the plan follows the backend registry, and a real --quick run of one family gives
one file with every backend that runs here, the peer measured once, and a skip with the reason for the
backend that cannot run here."""

from __future__ import annotations

import io

import torch

from speechrt import backends
from speechrt.bench.record import load
from speechrt.bench.suite import Progress, Step, plan
from speechrt.bench.tts import SENTENCES


def test_plan_has_a_step_per_available_backend_and_precision():
    by = {}
    for s in plan(["asr", "lm", "tts", "server", "kernels"], "cpu", True, None):
        by.setdefault(s.family, []).append(s)
    assert [s.what for s in by["asr"]] == backends.available("asr")
    assert [s.what for s in by["tts"]] == backends.available("tts")
    assert [s.what for s in by["lm"]] == [f"{b} auto" for b in backends.available("lm")]
    assert all("--dtypes" in s.args and "float32,auto" in s.args for s in by["asr"])
    assert [s.args[s.args.index("--mode") + 1] for s in by["server"]] == ["transcription", "conversation"]
    assert by["kernels"][0].args == ("--device", "cpu")
    full = plan(["lm"], "cpu", False, 2)
    assert {s.args[s.args.index("--dtype") + 1] for s in full} >= {"int4", "int8", "float32"}
    assert all(s.args[-2:] == ("--threads", "2") for s in full)


def test_progress_estimate_scales_with_the_finished_steps():
    steps = [Step("asr", str(i), (), 10.0) for i in range(4)]
    stream = io.StringIO()
    p = Progress(steps, stream)
    assert p.eta(0) == 40
    p.finished(0, 20.0)  # the first step took twice its estimate: the rest will too
    assert p.eta(1) == 60
    p.show(1)
    line = stream.getvalue()
    assert line.startswith("[######..................] 1/4 asr 1") and "~1:00 left" in line


def test_quick_run_of_one_family(bench, tmp_path):
    out = tmp_path / "a.json"
    r = bench("all", "--quick", "--families", "tts", "--json", out, "--machine", "ci box")
    assert r.returncode == 0, r.stdout + r.stderr
    res = load(out)
    assert res.machine["label"] == "ci box" and res.command.startswith("speechrt bench all --quick")
    assert (tmp_path / "a.log").read_text().count("$ ") == len(backends.available("tts"))
    ours = {x.backend for x in res.records if x.engine == "speechrt"}
    runs_here = [b for b in backends.available("tts") if b != "triton" or torch.cuda.is_available()]
    assert ours == set(runs_here)
    piper = [x for x in res.records if x.engine == "piper-tts"]
    assert len(piper) == 2 * len(SENTENCES)  # once (each text x rtf, first audio), in the first step only
    # every row of ours is compared with Piper, the later backends' rows too (measured in the same run)
    assert all(x.peer == "piper-tts float32" for x in res.records if x.engine == "speechrt")
    if not torch.cuda.is_available() and "triton" in backends.available("tts"):
        (skip,) = res.skipped
        assert skip.what == "triton" and "CUDA or ROCm GPU" in skip.reason and "--backend torch" in skip.reason


def test_result_paths_that_cannot_be_written_are_one_line_before_any_step(
    tmp_path, capsys, monkeypatch, no_model_loads
):
    """Every benchmark's output options are checked before it starts (a result file that cannot be written would
    otherwise fail after minutes of measuring)."""
    import speechrt.bench.suite
    from speechrt.cli import main

    def no_plan(*args, **kwargs):
        raise AssertionError("the suite was planned before the error")

    monkeypatch.setattr(speechrt.bench.suite, "plan", no_plan)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    for argv, says in [
        (["all", "--quick", "--json", str(tmp_path)], f"--json {tmp_path}: is a directory"),
        (["all", "--quick", "--log", str(tmp_path / "no" / "x.log")], "does not exist"),
        (["asr", "--json", str(a_file / "asr.json")], f"{a_file} is a file, not a directory"),
        (["report", str(a_file), "--out", "/proc/speechrt-test.html"], "cannot write in /proc"),
        (["report", str(a_file), "--markdown", str(tmp_path / "r.md"), "--images", str(a_file)], "--images"),
    ]:
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("speechrt bench: error: --") and err.count("\n") == 1 and says in err, (argv, err)
