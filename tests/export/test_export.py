"""speechrt export and the onnxruntime runners of exported graphs, against the torch runners on the same
weights: Whisper logits (fp32) and transcripts, Llama greedy ids (int4 vs our torch int4; the factual prompt
answered as float32 answers it), VITS audio with noise 0 and with a seed; the manifest as the contract
(registry, CLI, errors). Exports are made once per session through the export cache (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from speechrt import backends
from speechrt.cli import main
from speechrt.errors import UserError
from speechrt.export import Manifest, cached_export, export_model
from speechrt.models.audio import utterance_mel
from speechrt.models.registry import ModelError, resolve, source_of
from speechrt.pipelines.asr import ASRPipeline, TranscribeOptions
from speechrt.pipelines.generation import GenerationOptions
from speechrt.pipelines.lm import LMPipeline
from speechrt.pipelines.lm_batching import stream
from speechrt.pipelines.tts import load_tts

PROMPTS = [
    "What is the capital of France?",
    "Who wrote Pride and Prejudice?",
    "Write a haiku about the sea.",
    "List three uses of copper.",
]
SPEECH = [
    "The museum opens at nine and closes at five on weekdays.",
    "I would like a cup of coffee with a little sugar, please.",
]


@pytest.fixture(scope="module")
def tts_export(tmp_path_factory):
    """The voice exported through the CLI, its progress written to a file (export.log beside it)."""
    out = tmp_path_factory.mktemp("tts") / "joe"
    with open(out.parent / "export.log", "w") as log:
        cmd = [sys.executable, "-m", "speechrt", "export", "tts", "--out", str(out)]
        assert subprocess.run(cmd, stderr=log, stdout=subprocess.DEVNULL, timeout=600).returncode == 0
    return out


def test_export_out_that_cannot_be_written_is_one_line_before_anything_loads(tmp_path, capsys, no_model_loads):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for out, says in [
        (a_file, f"{a_file}: is a file, not a directory; give a new or empty directory"),
        (a_file / "joe", f"{a_file} is a file, so no directory can be made under it"),
        (tmp_path / "full", "exists and is not empty"),
        ("/proc/speechrt-test/joe", "cannot write in /proc"),  # no process may, root included
    ]:
        assert main(["export", "tts", "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("speechrt export: error: --out ") and err.count("\n") == 1, err
        assert says in err, err
    # the Python API checks the same (export_model as imported above, not the tripwire)
    with pytest.raises(UserError, match="is a file, not a directory"):
        export_model("tts", None, a_file, progress=False)
    with pytest.raises(UserError, match="cannot write in /proc"):
        export_model("tts", None, "/proc/speechrt-test/joe", progress=False)


def test_export_progress_in_a_log_file_is_one_line_per_stage(tts_export):
    """stderr not a terminal (a server's log file): no progress bar redrawn with carriage returns, no partial
    line; one line per stage, in order, the last one saying where the export went (issue 49: a cold start's log
    held bars left in odd states)."""
    text = (tts_export.parent / "export.log").read_text()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    lines = [ln for ln in text.splitlines() if ln.startswith("speechrt: export tts")]
    stages = [ln.split(": ", 2)[2].rsplit(" (", 1)[0] for ln in lines]
    assert stages[:5] == ["starting", "reading the voice", "tracing text", "tracing flow", "tracing generator"]
    assert stages[-1].startswith("exported tts") and stages[-1].endswith(f"to {tts_export}")
    assert len(stages) == len(set(stages))  # each once
    assert all(ln.endswith(" s)") for ln in lines)


def _greedy(lm, ids, n=32):
    return [
        ev.token for ev in stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=n, stop_token_ids=()))
    ]


def test_manifest_is_the_contract(tts_export):
    m = Manifest.read(tts_export)
    assert m.family == "tts" and m.precision == "fp32" and set(m.graphs) == {"text", "flow", "generator"}
    assert m.source["format"] == "piper-onnx" and len(m.source["sha256"]) == 64 and m.opset == 17
    assert m.graph("flow").inputs[0].shape == (1, 192, "frames") and m.graph("generator").sha256
    assert 0 < m.extra["export_seconds"] < 60
    rm = resolve(str(tts_export), "tts")  # an export is a model path like any other
    assert rm.format == "speechrt-onnx" and source_of(rm).format == "piper-onnx"
    with pytest.raises(ModelError, match="is a tts model"):
        resolve(str(tts_export), "asr")
    with pytest.raises(UserError, match="not empty"):
        export_model("tts", None, tts_export, progress=False)
    with pytest.raises(UserError, match="valid: fp32, fp16, int8, int4"):
        export_model("tts", None, tts_export.parent / "x", "int3", progress=False)
    bad = json.loads((tts_export / "manifest.json").read_text())
    bad["format_version"] = 99
    (tts_export.parent / "old").mkdir()
    (tts_export.parent / "old" / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="export the model again"):
        Manifest.read(tts_export.parent / "old")


def test_vits_export_equals_torch(tts_export):
    """Our torch VITS exported in three pieces: the same audio with noise 0 and with the same seed."""
    ours, ref = load_tts(str(tts_export), "onnxruntime"), load_tts(None, "torch")
    assert ours.info.backend == "onnxruntime" and ours.info.format == "speechrt-onnx"
    text = "Exported from the torch model, it speaks the same words."
    for kw in (dict(noise_scale=0.0, noise_w=0.0), dict(seed=7)):
        a, b = ours.synthesize_array(text, **kw), ref.synthesize_array(text, **kw)
        assert a.shape == b.shape and np.isfinite(a).all() and np.abs(a).max() > 0.1
        assert np.abs(a - b).max() <= 1e-4, kw


@pytest.fixture(scope="module")
def asr_pair():
    m = resolve(None, "asr")
    return (
        ASRPipeline(backends.get("onnxruntime").asr(m, dtype="float32")),
        ASRPipeline(backends.get("torch").asr(m, dtype="float32")),
    )


def test_whisper_logits_and_transcripts(asr_pair, synth):
    ours, ref = asr_pair
    audio = synth(SPEECH[0])
    mel = utterance_mel(audio, 80, torch.device("cpu"))[None]
    prompt = torch.tensor([ours.tokenizer.sot_sequence("en", "transcribe") + [ours.tokenizer.no_timestamps]])
    with torch.inference_mode():
        sa, sb = ours.runner.start(ours.runner.encode(mel), 1, 16), ref.runner.start(ref.runner.encode(mel), 1, 16)
        for step in (prompt, torch.tensor([[440]]), torch.tensor([[2068]])):
            a, b = ours.runner.decode_step(sa, step, last_only=False), ref.runner.decode_step(sb, step, last_only=False)
            assert torch.isfinite(a).all() and (a - b).abs().max() <= 1e-3 * b.abs().max()
    # (identical greedy transcripts: tests/backends/test_conformance.py)


def test_whisper_trimmed_rows_match_torch(asr_pair):
    """The op-by-op graph encodes windows shorter than 30 s with each row's own length (a batch of a long and
    a short utterance), as the torch runner does: cross keys/values and logits of every row <= 1e-3 relative,
    fresh random input, odd frame counts; the step's cached bindings survive a reorder and a rewind."""
    ours, ref = (p.runner for p in asr_pair)
    assert ours.trims and "lengths" in [t.name for t in ours.manifest.graph("encoder").inputs]
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    mel = torch.randn(2, 80, 2 * 347, generator=g) * 0.5
    frames = [2 * 347, 301]
    ea, eb = ours.encode(mel, frames=frames), ref.encode(mel, frames=frames)
    assert ea.lengths.tolist() == eb.lengths.tolist() == [347, 151]
    sa, sb = ours.start(ea, 2, 24), ref.start(eb, 2, 24)
    for (ka, va), (kb, vb) in zip(sa.cross, sb.cross):
        for row, n in enumerate([347, 347, 151, 151]):
            for a, b in ((ka, kb), (va, vb)):
                assert (a[row, :, :n] - b[row, :, :n]).abs().max() <= 1e-3 * b[row, :, :n].abs().max()
    steps = [
        torch.randint(0, 50000, (4, 5), generator=g),
        torch.randint(0, 50000, (4, 1), generator=g),
        torch.randint(0, 50000, (4, 3), generator=g),
    ]
    for i, step in enumerate(steps):
        last = i == 1
        a, b = ours.decode_step(sa, step, last_only=last), ref.decode_step(sb, step, last_only=last)
        assert a.shape == b.shape and torch.isfinite(a).all()
        assert (a - b).abs().max() <= 1e-3 * b.abs().max()
        if i == 1:
            order = torch.tensor([3, 2, 1, 0])
            ours.reorder(sa, order), ref.reorder(sb, order)
            ours.rewind(sa, 5), ref.rewind(sb, 5)
    with pytest.raises(ValueError, match="an even count up to 3000"):
        ours.encode(torch.zeros(1, 80, 3001))


def test_whisper_int8_prompt_graph():
    """int8 runs steps of PROMPT_ROWS rows or more (a prompt; several sessions' rows) on a float32 copy of the
    decoder (int8 activations cost in proportion to the rows): its logits are the int8 step graph's one row
    at a time within int8's error, with the same best token at nearly every position, for a prompt and for a
    batch of 7 rows (an odd count, fresh random audio)."""
    import onnx

    from speechrt.backends.onnxruntime.asr import PROMPT_ROWS

    r = backends.get("onnxruntime").asr(resolve(None, "asr"), dtype="int8")
    assert r.prompt is not r.decoder and "8-bit blocks" in r.manifest.weights
    prompt = onnx.load(str(r.tokenizer_path.parent / r.manifest.graph("prompt").file))
    ops = {n.op_type for n in prompt.graph.node}
    assert "MatMulNBits" not in ops and "MatMul" in ops
    # the vocabulary projection reads the token table the embedding does: one copy (the graph was 184 MB, 108 now)
    tables = [t.name for t in prompt.graph.initializer if r.config.n_vocab in t.dims]
    assert tables == ["decoder.token_embedding.weight"] and "FusedMatMul" in ops
    enc = r.encode(torch.randn(1, 80, 3000) * 0.5)
    tokens = torch.tensor([[50257, 50362] + [440, 2068, 11, 1312] * 12])
    full = r.decode_step(r.start(enc, 1, 448), tokens, last_only=False)  # the float32 graph
    split = r.start(enc, 1, 448)
    steps = [r.decode_step(split, tokens[:, i : i + 1], last_only=False) for i in range(tokens.shape[1])]
    parts = torch.cat(steps, 1)  # the int8 step graph, one row at a time
    assert torch.isfinite(full).all() and (full - parts).abs().max() <= 0.05 * parts.abs().max()
    assert (full.argmax(-1) == parts.argmax(-1)).float().mean() >= 0.9

    n = 7
    assert n >= PROMPT_ROWS
    enc = r.encode(torch.randn(n, 80, 600) * 0.5, frames=[600, 450, 320, 600, 96, 510, 250])
    prompt = torch.tensor([[50257, 50362]] * n)
    both = r.start(enc, 1, 448)
    r.decode_step(both, prompt)
    batch = r.decode_step(both, torch.full((n, 1), 440))  # n rows: the float32 graph
    for i in range(n):
        one = r.start(type(enc)([s[i : i + 1] for s in enc.states], enc.lengths[i : i + 1]), 1, 448)
        r.decode_step(one, prompt[i : i + 1])
        alone = r.decode_step(one, torch.full((1, 1), 440))[0]  # 1 row: the int8 graph
        assert (batch[i] - alone).abs().max() <= 0.05 * alone.abs().max(), i
        assert torch.topk(alone, 5).indices.tolist().count(int(batch[i].argmax())) == 1, i


def test_whisper_int8_transcribes(synth):
    """int8 (MatMulInteger) is a different model numerically: it must still transcribe the test speech."""
    from speechrt.models.wer import wer

    asr = ASRPipeline(backends.get("onnxruntime").asr(resolve(None, "asr"), dtype="int8"))
    assert asr.info.precision == "int8"
    got = asr.transcribe_batch([synth(SPEECH[1])], TranscribeOptions(without_timestamps=True))
    assert wer(SPEECH[1], got[0].text) <= 0.1, got[0].text


def test_llama_int4_greedy_ids():
    """The GGUF's Q4_1 blocks, kept exactly (prompts at float32 activations, decode steps at int8 ones): the
    greedy ids equal float32's on at least 3 of 4 prompts, and our torch int4 runner's on the first.
    (Not on 3 of 4 as the issue asks: the torch int4 kernel's emulated bf16 activations leave float32's path
    on 2 of these 4 prompts, 4 of 6 in the benchmark's set, where this graph agrees with float32 on 5 of 6.)"""
    m = resolve(None, "lm")
    ours = LMPipeline(backends.get("onnxruntime").lm(m))
    assert ours.info.precision == "int4" and "prefill" in ours.runner.manifest.graphs
    assert "kept exactly" in ours.runner.manifest.weights
    got = [_greedy(ours, ours.encode_chat(p), 16) for p in PROMPTS]
    f32 = LMPipeline(backends.get("torch").lm(m, dtype="float32"))
    assert sum(g == _greedy(f32, f32.encode_chat(p), 16) for g, p in zip(got, PROMPTS)) >= 3
    t4 = LMPipeline(backends.get("torch").lm(m, dtype="int4"))
    assert got[0] == _greedy(t4, t4.encode_chat(PROMPTS[0]), 16)
    assert ours.tokenizer.decode(got[0]).startswith("The capital of France is Paris.")


def test_llama_int4_export_about_the_gguf_size(tmp_path):
    """The int4 export's two graphs (decode steps on the blocks, prompts on float matrices) keep each block once, in
    one weights file that both read: on disk within 1.5x the GGUF it comes from (SmolLM2-135M Q4_1: 98 MB -> 115 MB;
    with float32 copies of every weight in the prompts' graph and of the embedding in both, 768 MB). The prompts'
    graph gets its float matrices when it loads: every DequantizeLinear is folded into an initializer, so that no
    prompt dequantizes the model again."""
    import onnx

    from speechrt.backends.onnxruntime.providers import session

    m = resolve(None, "lm")
    d = cached_export("lm", m, "int4")
    man = Manifest.read(d)
    assert {g.data for g in man.graphs.values()} == {"weights.bin"} and man.opset >= 21
    size = sum(f.stat().st_size for f in d.iterdir())
    assert size < 1.5 * m.path.stat().st_size, (size, m.path.stat().st_size)
    prompts = str(d / man.graph("prefill").file)
    assert any(n.op_type == "DequantizeLinear" for n in onnx.load(prompts, load_external_data=False).graph.node)
    session(prompts, ["CPUExecutionProvider"], 1, save_optimized=str(tmp_path / "p.onnx"), fold_dequantize=True)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "p.onnx"), load_external_data=False).graph.node}
    assert "DequantizeLinear" not in ops and {"FusedMatMul", "Gemm", "Gather"} <= ops, ops


def test_exported_dir_and_dtype_errors():
    m = resolve(None, "lm")
    d = cached_export("lm", m, "int4")
    assert cached_export("lm", m, "int4") == d  # made once
    rm = resolve(str(d), "lm")
    with pytest.raises(UserError, match="int4 export.*--precision fp32"):
        backends.get("onnxruntime").lm(rm, dtype="float32")
    with pytest.raises(UserError, match="valid:"):
        backends.get("onnxruntime").lm(m, dtype="int3")
    with pytest.raises(UserError, match="already an export"):
        export_model("lm", str(d), d.parent / "again", progress=False)


def test_llama_float16_activations_for_gpu_providers():
    """What GPU execution providers run (their GroupQueryAttention has no float32 kernel): the int4 graph with
    float16 activations, norms, rotary tables and cache, the file's 4-bit blocks unchanged. Run here on the
    CPU provider, fed the same tokens as the float32-activation graph: the prompt's logits within 1e-2 of the
    largest, the decode steps' within 0.15, the same greedy choice after the prompt and on 4 of 5 steps; a
    float32 language model on a GPU is refused, naming what runs there."""
    from speechrt.backends.onnxruntime.exports import gpu_lm_export
    from speechrt.backends.onnxruntime.lm import OrtLMRunner
    from speechrt.backends.threads import ThreadPolicy

    m = resolve(None, "lm")
    d16 = cached_export("lm", m, "int4", activations="float16")
    d32 = cached_export("lm", m, "int4")
    assert d16 != d32
    m16 = Manifest.read(d16)
    assert m16.precision == "int4" and m16.cache["dtype"] == "float16" and "float16 activations" in m16.weights
    threads = ThreadPolicy.build(torch.device("cpu"), None)
    runners = [OrtLMRunner(d, Manifest.read(d), ["CPUExecutionProvider"], threads, m.name, None) for d in (d16, d32)]
    assert runners[0].new_cache(1, 8).k.dtype == torch.float16
    ids = LMPipeline(runners[1]).encode_chat("What is the capital of France?")
    logits = []
    for r in runners:
        cache = r.new_cache(1, len(ids) + 8)
        out = [r.prefill(cache, 0, torch.tensor(ids))]
        for t in (504, 3458, 282, 4649, 314):
            out.append(r.decode_step(cache, [0], torch.tensor([t]))[0])
        logits.append(torch.stack([o.float().reshape(-1) for o in out]))
    assert logits[0].dtype == torch.float32 and torch.isfinite(logits[0]).all()
    err = ((logits[0] - logits[1]).abs().amax(-1) / logits[1].abs().amax(-1)).tolist()
    # the prompt's graph: float16 weights against float32 ones (0.004 here); the decode steps: MatMulNBits,
    # which on the CPU quantizes either graph's activations to int8 per block (up to 0.075 apart here, AMD
    # EPYC AVX2; against torch float32 on an H100, no int8: 0.004, docs/gpu.md)
    assert err[0] < 1e-2 and max(err) < 0.15, err
    same = (logits[0].argmax(-1) == logits[1].argmax(-1)).tolist()
    assert same[0] and sum(same[1:]) >= 4, same
    assert gpu_lm_export(m, "int4", "fp16")[0] == d16  # the GPU's int4 is this export
    with pytest.raises(UserError, match="runs in float16.*valid dtypes on a GPU: float16, int4, int8"):
        gpu_lm_export(m, "float32", "fp16")
    with pytest.raises(UserError, match="export it with --activations float16"):
        gpu_lm_export(resolve(str(d32), "lm"), None, "fp16")
    with pytest.raises(UserError, match="weight-only precisions int4 and int8.*not ort fp32"):
        export_model("lm", None, d16.parent / "bad", "fp32", activations="float16", progress=False)
    with pytest.raises(UserError, match="not standard int8"):
        export_model("lm", None, d16.parent / "bad", "int8", variant="standard", activations="float16", progress=False)
    with pytest.raises(UserError, match="for language models"):
        export_model("asr", None, d16.parent / "bad", activations="float16", progress=False)


def test_serve_loads_onnxruntime_models():
    """`speechrt serve --asr-backend onnxruntime --lm-backend onnxruntime` loads both from exports (made on first
    use), beside the torch voice."""
    import argparse

    from speechrt import cli_serve

    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    # (the voice's backend named: `auto` picks onnxruntime for it on some CPU kinds)
    asr, lm, tts = cli_serve.load_models(
        p.parse_args(["--asr-backend", "onnxruntime", "--lm-backend", "onnxruntime", "--tts-backend", "torch"])
    )
    assert (asr.info.backend, lm.info.backend, tts.info.backend) == ("onnxruntime", "onnxruntime", "torch")
    assert asr.info.format == lm.info.format == "speechrt-onnx" and lm.info.precision == "int4"
    reply = "".join(lm.chat("What is the capital of France?", max_tokens=8))
    assert "Paris" in reply


def test_backend_auto_follows_the_table():
    from speechrt.backends import auto

    kind = auto.machine_kind("cpu")
    assert kind in ("amx", "avx512", "avx2", "generic")
    assert auto.machine_kind("cuda") == ("rocm" if torch.version.hip else "nvidia")
    gpu_lm = auto.choose("lm", "cuda")  # measured on an H200: triton, or torch where Triton is missing
    assert (gpu_lm.backend, gpu_lm.dtype) == (
        ("triton", "bfloat16") if "triton" in backends.available("lm") else ("torch", None)
    )
    c = auto.choose("lm", "cpu")
    assert c == auto.TABLE.get((kind, "lm"), c) and c.backend in backends.available("lm")
    r = backends.get("auto").tts(resolve(None, "tts"))
    assert r.info.backend == auto.choose("tts", "cpu").backend
    with pytest.raises(UserError, match="valid backends: .*auto"):
        backends.get("fastest")


def test_the_python_api_defaults_to_auto_as_the_cli_and_the_server_do():
    """One default everywhere: speechrt.load_asr / load_lm / load_tts / transcribe / say and the pipelines'
    loaders take backend='auto', as `speechrt transcribe|chat|say|serve` and the server's ModelConfig do, and
    build what auto chooses on this machine (backend and precision), not torch."""
    import inspect

    import speechrt
    import speechrt.pipelines.asr
    import speechrt.pipelines.lm
    import speechrt.pipelines.tts
    from speechrt.backends import auto
    from speechrt.cli import build_parser
    from speechrt.streaming.config import ModelConfig

    api = [speechrt.load_asr, speechrt.load_lm, speechrt.load_tts, speechrt.transcribe, speechrt.say]
    api += [speechrt.pipelines.asr.load_asr, speechrt.pipelines.lm.load_lm, speechrt.pipelines.tts.load_tts]
    for f in api:
        assert inspect.signature(f).parameters["backend"].default == "auto", f
    parser = build_parser()
    for command in ("transcribe", "chat", "say", "serve"):
        assert parser.parse_args([command]).backend == "auto", command
    assert ModelConfig().backend == "auto"
    # the language model is built through the same line of its loader (and costs seconds more to load)
    for family, load in (("asr", speechrt.load_asr), ("tts", speechrt.load_tts)):
        choice, info = auto.choose(family, "cpu"), load().info
        assert info.backend == choice.backend and info.precision == (choice.dtype or info.precision), (family, info)


def test_backend_auto_imports_only_the_backends_it_asks_about():
    """Resolving `auto` for the CPU imports the backend it picks, not every installed one: importing triton alone
    took 0.3 s of a server's start on a CPU, where it cannot run."""
    code = (
        "import sys; from speechrt.backends.auto import choose\n"
        "picked = {choose(f, 'cpu').backend for f in ('asr', 'lm', 'tts')}\n"
        "print(sorted(picked), sorted(m for m in ('triton', 'tensorrt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    picked, imported = out.stdout.strip().split("] [")
    assert imported.strip("[]") == "" or all(m.strip("' ") in picked for m in imported.strip("[]").split(","))


def test_backend_auto_on_an_amx_cpu(monkeypatch):
    """An AMX CPU (measured on 2 cores of a Xeon) gets onnxruntime for every family, int8 speech recognition
    and int4 language model, not torch's bf16 (slower there: ASR 2.40 s vs int8's 1.04 s); an AVX2 CPU
    never gets the AMX table's entries."""
    from speechrt.backends import auto

    monkeypatch.setattr(
        auto, "cpu_features", lambda: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    )
    assert auto.machine_kind("cpu") == "amx"
    got = {f: (auto.choose(f, "cpu").backend, auto.choose(f, "cpu").dtype) for f in ("asr", "lm", "tts")}
    assert got == {"asr": ("onnxruntime", "int8"), "lm": ("onnxruntime", "int4"), "tts": ("onnxruntime", None)}
    monkeypatch.setattr(auto, "cpu_features", lambda: frozenset({"avx2"}))
    assert auto.machine_kind("cpu") == "avx2" and auto.choose("asr", "cpu").why.startswith("bench asr, AMD EPYC")


def test_backend_auto_on_an_avx512_cpu(monkeypatch):
    """AVX-512 without AMX (measured on an AMD EPYC Zen 4): the language model on the CPU int4 kernel (284 tok/s
    at batch 1 vs onnxruntime-genai's 198 and our int4 graph's 122), its int4 graph where the kernel cannot
    run; speech recognition int8 and the voice on onnxruntime."""
    from speechrt.backends import auto

    monkeypatch.setattr(auto, "cpu_features", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert auto.machine_kind("cpu") == "avx512"
    lm = auto.choose("lm", "cpu")
    kernel = auto.NEEDS["cpu int4 kernel"]() is None
    assert (lm.backend, lm.dtype) == (("torch", "int4") if kernel else ("onnxruntime", "int4"))
    assert "Zen 4" in lm.why
    assert (auto.choose("asr", "cpu").backend, auto.choose("asr", "cpu").dtype) == ("onnxruntime", "int8")
    assert auto.choose("tts", "cpu").backend == "onnxruntime"


def test_backend_auto_takes_the_runner_up_where_a_choice_cannot_run(monkeypatch):
    """A choice that needs the CPU int4 kernel (torch int4 on AVX2 machines) gives way to its runner-up where
    the kernel cannot run (here: turned off), saying why."""
    from speechrt.backends import auto

    kind = auto.machine_kind("cpu")
    entry = auto.Choice(
        "torch",
        "int4",
        "measured",
        needs="cpu int4 kernel",
        instead=auto.Choice("onnxruntime", "int4", "the runner-up"),
    )
    monkeypatch.setitem(auto.TABLE, (kind, "lm"), entry)
    if auto.NEEDS["cpu int4 kernel"]() is None:
        assert auto.choose("lm", "cpu") == entry
    monkeypatch.setenv("SPEECHRT_CPU_DECODE", "0")
    c = auto.choose("lm", "cpu")
    assert (c.backend, c.dtype) == ("onnxruntime", "int4")
    assert "SPEECHRT_CPU_DECODE=0" in c.why and "the runner-up" in c.why
