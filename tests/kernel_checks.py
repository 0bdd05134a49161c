"""What the Triton kernel tests share: the device they run on (SPEECHRT_TEST_DEVICE, see tests/kernels/conftest.py),
the dtypes a kernel claims with their tolerances, seeded random inputs, the comparison of a kernel's output with
its reference's, and mutants of a kernel module (checks that must catch them)."""

from __future__ import annotations

import os

import torch

DEVICE = os.environ.get("SPEECHRT_TEST_DEVICE", "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}  # bf16: 2 of its ulps


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def close(out, expected, truth=None, tol=None):
    """out (the kernel's) equals expected (the reference's: same shape and dtype, finite) within `tol` (default
    TOL of the dtype). With `truth` (the reference in float32 on the same inputs), 16-bit: the kernel, which may
    round at other points than the unfused ops (see kernels/triton_fused.py), is also no further from it than the
    reference is (x1.5)."""
    assert out.shape == expected.shape and out.dtype == expected.dtype, (out.shape, expected.shape, out.dtype)
    assert torch.isfinite(expected).all(), "non-finite values in the reference output (bad test input)"
    assert torch.isfinite(out).all(), "non-finite values in the kernel output"
    rtol, atol = tol or TOL[expected.dtype]
    if truth is not None and expected.dtype != torch.float32:
        err, ref_err = ((t.float() - truth.float()).abs().amax().item() for t in (out, expected))
        assert err <= 1.5 * ref_err + atol, (err, ref_err)
    torch.testing.assert_close(out.float(), expected.float(), rtol=rtol, atol=atol)


def mutant_module(module, old: str, new: str, count: int, tmp_path):
    """`module` (a speechrt.kernels module) loaded again from its source with each of its `count` occurrences of `old`
    replaced by `new` (its relative imports made absolute): a mutant the tests must catch."""
    import importlib.util
    import inspect
    import re

    src = re.sub(r"^from \. import ", "from speechrt.kernels import ", inspect.getsource(module), flags=re.M)
    src = re.sub(r"^from \.(\w)", r"from speechrt.kernels.\1", src, flags=re.M)
    assert src.count(old) == count, (old, src.count(old))
    name = "mutant_" + module.__name__.rsplit(".", 1)[-1]
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    mutant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutant)
    return mutant


class LaunchTrace:
    """While installed (monkeypatch), the Triton interpreter's launches: `launched` (kernel names), `gated` (whether
    each passed triton_pdl's arguments: tests patch triton_pdl.args to a marker); and inside `with trace.ops():` the
    torch ops that compute something outside those launches (`torch_ops`: views, allocations, dtype promotion and
    no-op conversions left out)."""

    def __init__(self, monkeypatch):
        from triton.runtime.interpreter import InterpretedFunction

        self.launched, self.gated, self.torch_ops, self._inside = [], [], [], []
        run = InterpretedFunction.run

        def counted(fn, *a, **k):
            self.launched.append(fn.fn.__name__)
            self.gated.append("PDL" in k)
            self._inside.append(1)
            try:
                return run(fn, *a, **k)
            finally:
                self._inside.pop()

        monkeypatch.setattr(InterpretedFunction, "run", counted)

    def ops(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        trace = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                views = func.is_view or func.overloadpacket.__name__ in ("empty", "empty_strided", "promote_types")
                if not trace._inside and not views and not (args and out is args[0]):  # (a no-op .to: its input)
                    trace.torch_ops.append(func.overloadpacket.__name__)
                return out

        return Ops()
