"""`speechrt bench all`: the plan follows the backend registry, and a real --quick run of one family gives
one file with every backend that runs here, the peer measured once, and a skip with the reason for the
backend that cannot run here."""

from __future__ import annotations

import io

import pytest
import torch

from speechrt import backends
from speechrt.bench.record import load
from speechrt.bench.suite import Progress, Step, plan, serves
from speechrt.bench.tts import SENTENCES
from speechrt.errors import UserError


def test_plan_has_a_step_per_available_backend_and_precision():
    """The full run: every backend and precision; --quick one step per model family (the next test)."""
    by = {}
    for s in plan(["asr", "lm", "tts", "server", "kernels"], "cpu", False, None):
        by.setdefault(s.family, []).append(s)
    assert [s.what for s in by["asr"]] == backends.available("asr")
    assert [s.what for s in by["tts"]] == backends.available("tts")
    assert all("--dtypes" in s.args and "float32,auto" in s.args for s in by["asr"])
    assert [s.args[s.args.index("--mode") + 1] for s in by["server"]] == ["transcription", "conversation"]
    assert by["kernels"][0].args == ("--device", "cpu")
    quick = plan(["server", "kernels"], "cpu", True, None)
    assert [s.args[s.args.index("--mode") + 1] for s in quick[:2]] == ["transcription", "conversation"]
    assert quick[2].args == ("--device", "cpu")
    full = plan(["lm"], "cpu", False, 2)
    assert {s.args[s.args.index("--dtype") + 1] for s in full} >= {"int4", "int8", "float32"}
    assert all(s.args[-2:] == ("--threads", "2") for s in full)


def _backend_and_dtype(step: Step) -> tuple[str, str]:
    a = step.args
    b = a[a.index("--backend" if "--backend" in a else "--backends") + 1]
    flag = next((f for f in ("--dtypes", "--dtype") if f in a), None)
    return b, a[a.index(flag) + 1] if flag else "auto"


def test_quick_steps_time_what_serve_runs(monkeypatch):
    """bench all --quick times each model family once, on the backend and precision `speechrt serve` with its
    defaults loads here (the ASR's int8 graph where serve runs it, not float32: issue 49), and says which; on every
    kind of CPU the table knows."""
    from speechrt import cli_serve
    from speechrt.backends import auto
    from speechrt.cli import build_parser
    from speechrt.pipelines.asr import load_asr

    served = cli_serve.model_config(build_parser().parse_args(["serve"]))
    steps = plan(["asr", "lm", "tts"], "cpu", True, None)
    assert [s.family for s in steps] == ["asr", "lm", "tts"]
    for s in steps:
        backend, dtype = served.runs(s.family)
        assert _backend_and_dtype(s) == (backend, dtype or "auto")
        assert s.what.startswith(f"{backend} {dtype or 'default precision'}") and "as serve runs it" in s.what
    # what the server's configuration loads is what the ASR step times
    asr = load_asr(None, *served.asked("asr"))
    assert (asr.info.backend, asr.info.precision) == _backend_and_dtype(steps[0])
    for flags in ({"avx2"}, {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}):
        monkeypatch.setattr(auto, "cpu_features", lambda flags=flags: frozenset(flags))
        for s in plan(["asr", "lm", "tts"], "cpu", True, None):
            c = auto.choose(s.family, "cpu")
            assert _backend_and_dtype(s) == (c.backend, c.dtype or "auto")


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
    assert (tmp_path / "a.log").read_text().count("$ ") == 1  # --quick: the backend serve runs, once
    ours = {x.backend for x in res.records if x.engine == "speechrt"}
    assert ours == {serves("tts", "cpu")[0]}
    assert any(n.startswith(f"tts {serves('tts', 'cpu')[0]} default precision (as serve runs it)") for n in res.notes)
    piper = [x for x in res.records if x.engine == "piper-tts"]
    assert len(piper) == 2 * len(SENTENCES)  # each text x rtf, first audio
    assert all(x.peer == "piper-tts float32" for x in res.records if x.engine == "speechrt")
    assert not res.skipped


def test_a_backend_that_cannot_run_here_is_a_skip(bench, tmp_path):
    """The full run's steps include backends that need a GPU: without one, a skip with the reason."""
    if torch.cuda.is_available() or "triton" not in backends.available("tts"):
        pytest.skip("needs a machine without a GPU and with triton installed")
    from speechrt.bench.suite import NO_PEERS, _run_step

    (step,) = [s for s in plan(["tts"], "cpu", False, None) if s.what == "triton"]
    step = Step(step.family, step.what, (*step.args[:-2], "--repeats", "1", *NO_PEERS["tts"]), step.estimate_s)
    with open(tmp_path / "log", "w") as log:
        rc, err = _run_step(step, tmp_path / "t.json", log)
    assert rc == 2 and "CUDA or ROCm GPU" in err and "--backend torch" in err


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
    # a report makes its missing directories, under a directory it may write in, not under a file
    from speechrt.outputs import check_output_file

    assert check_output_file(tmp_path / "site" / "r.html", "--out", make_parents=True) == tmp_path / "site" / "r.html"
    with pytest.raises(UserError, match="is a file, not a directory"):
        check_output_file(a_file / "site" / "r.html", "--out", make_parents=True)
