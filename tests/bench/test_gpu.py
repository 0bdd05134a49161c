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
