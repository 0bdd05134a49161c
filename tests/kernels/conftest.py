"""Triton kernels run on the CPU through the Triton interpreter here.

`triton.jit` decides at decoration time whether a kernel is interpreted, so TRITON_INTERPRET=1 is set
before the kernel modules are imported (at collection), then removed again so that tests elsewhere in
the session keep their normal kernel choice; the `interpret` fixture sets it for the tests that run
kernels (kernels.select('triton', 'cpu') requires it).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest

# the kernel tests skip themselves without Triton; the reference tests still run
HAVE_TRITON = importlib.util.find_spec("triton") is not None
# triton.language's own helpers (tl.sum's combine function, ...) are decorated when triton is first
# imported, so the variable must be set before that, not just before our modules
if HAVE_TRITON and "triton" not in sys.modules:
    _prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from speechrt import kernels as _k

        for _mod in _k.TRITON_MODULES:
            importlib.import_module(_mod)
        importlib.import_module("speechrt.kernels.triton_decode_attention")
    finally:
        if _prev is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = _prev


@pytest.fixture
def interpret(monkeypatch):
    if not HAVE_TRITON:
        pytest.skip("Triton is not installed (pip install 'speechrt[triton]')")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_norm

    if not isinstance(triton_norm._layer_norm_kernel, InterpretedFunction):
        pytest.fail("speechrt.kernels.triton_* were imported before tests/kernels/conftest.py set "
                    "TRITON_INTERPRET=1; run the kernel tests in their own process")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
