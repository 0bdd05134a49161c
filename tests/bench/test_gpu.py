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
        "lm-quant",
        "roofline",
        "server-ramp",
    ):
        assert "no CUDA or ROCm GPU is visible to PyTorch here" in by[name].detail
        assert f"SKIP {name}" in r.stdout
    ort = by["onnxruntime"]  # runs wherever a GPU provider is installed, a GPU or not
    assert ort.status != "skip" or "no GPU execution provider in this onnxruntime build" in ort.detail
    assert res.machine["gpus"] == [] and res.machine["software"]["packages"]["torch"]


def test_bench_gpu_lists_valid_checks(bench):
    r = bench("gpu", "--checks", "kernels,warp")
    assert r.returncode == 2 and "unknown check(s) warp; valid: gpu, kernels, asr-triton" in r.stderr


def test_provider_comparison_on_the_cpu_provider():
    ok, bad = compare_providers(["CPUExecutionProvider"])
    assert not bad and len(ok) == 1
    assert ok[0].startswith("CPUExecutionProvider (session runs on CPUExecutionProvider): max diff 0 over ")


def test_fused_step_benchmark_runs_up_to_its_gpu_part(monkeypatch):
    """The lm-fused check's plan (bytes per step at both shapes) and its cases on a tiny config, run here on the CPU
    by the Triton interpreter, uncaptured: fused, unfused and torch-eager steps timed, their logits compared,
    records written with the fraction of a bandwidth. On a GPU the same code captures the steps in graphs."""
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


def test_quantized_step_benchmark_runs_up_to_its_gpu_part(monkeypatch):
    """The lm-quant check's cases on a tiny config, run here on the CPU by the Triton interpreter, uncaptured: the
    bf16 (fused, unfused), int4 and fp8 steps timed, the quantized steps' logits within tolerance of the bf16 models
    of their dequantized weights, records written with the bytes (int4 and fp8 read less than bf16) and the
    fraction of a bandwidth. On a GPU the same code captures the steps in graphs at the Llama-3.2-1B shape."""
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
    for f in ("int4", "fp8"):
        p = by[f].params
        assert p["kernel_rel_err"] < 2e-2 and 0 < p["quantization_rel_err"] < 0.5, p
        assert p["bytes"] < by["bf16"].params["bytes"]
        assert p["speedup_vs_bf16_unfused"] == 1.0 and by[f].peer == "bf16"
    assert by["bf16"].params["bytes"] == by["bf16-fused"].params["bytes"]
    assert by["int4"].params["fraction_of_bandwidth"] == pytest.approx(by["int4"].params["bytes"] / 1e-3 / 10e9)
