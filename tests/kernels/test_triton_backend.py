"""The `triton` backend and the kernel commands on a machine without a GPU: clear errors that name the
alternative, never a slow run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from speechrt import backends
from speechrt.errors import UserError

pytest.importorskip("triton", reason="Triton is not installed (pip install 'speechrt[triton]')")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def speechrt(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "speechrt", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_triton_backend_registered():
    assert "triton" in backends.BACKENDS
    b = backends.get("triton")
    assert b.name == "triton" and b.kernels == "triton"
    assert "triton" in backends.available()


@no_gpu
@pytest.mark.parametrize("device", ["cpu", "auto", None])
def test_triton_backend_refuses_cpu(device):
    b = backends.get("triton")
    with pytest.raises(UserError, match=r"CUDA or ROCm GPU.*--backend torch"):
        b.asr("whisper-tiny.en", device=device)


@no_gpu
def test_transcribe_with_triton_backend_says_no_gpu():
    r = speechrt("transcribe", "--sample", "--backend", "triton")
    assert r.returncode == 2
    assert "backend 'triton'" in r.stderr and "--backend torch" in r.stderr
    assert "Traceback" not in r.stderr


@no_gpu
def test_bench_kernels_without_gpu_exits_clearly():
    r = speechrt("bench", "kernels")
    assert r.returncode == 2
    assert "CUDA or ROCm GPU" in r.stderr and "speechrt kernels report" in r.stderr
    assert "Traceback" not in r.stderr


def test_kernels_report_bad_target_lists_valid():
    r = speechrt("kernels", "report", "--targets", "sm_9x")
    assert r.returncode == 2 and "valid: sm_80, sm_90, gfx90a, gfx942" in r.stderr


def test_kernels_report_one_kernel_one_target():
    r = speechrt("kernels", "report", "--targets", "gfx942", "--kernels", "_rms_norm")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("_rms_norm_kernel")]
    assert len(lines) == 1 and "gfx942" in lines[0] and " yes " in lines[0]
