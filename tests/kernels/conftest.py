"""Triton kernels run on the CPU through the Triton interpreter here.

`triton.jit` decides at decoration time whether a kernel is interpreted, so tests/conftest.py (loaded
before any test module, whatever the order of collection) imports the kernel modules with
TRITON_INTERPRET=1; the `interpret` fixture sets it for the tests that run kernels
(kernels.select('triton', 'cpu') requires it).

SPEECHRT_TEST_DEVICE=cuda (or cuda:N) runs the kernel tests compiled on that GPU instead: nothing is
interpreted then (tests/conftest.py leaves TRITON_INTERPRET alone too).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HAVE_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = os.environ.get("SPEECHRT_TEST_DEVICE", "cpu")


@pytest.fixture
def interpret(monkeypatch):
    if not HAVE_TRITON:
        pytest.skip("Triton is not installed (pip install 'speechrt[triton]')")
    if DEVICE != "cpu":
        import torch

        if not torch.cuda.is_available():
            pytest.fail(f"SPEECHRT_TEST_DEVICE={DEVICE}, but PyTorch sees no CUDA or ROCm GPU")
        return
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_norm

    if not isinstance(triton_norm._layer_norm_kernel, InterpretedFunction):
        pytest.fail(
            "speechrt.kernels.triton_* were imported before tests/conftest.py set "
            "TRITON_INTERPRET=1; run the kernel tests in their own process"
        )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
