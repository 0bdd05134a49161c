"""Op implementations for the models: a pure-torch reference and Triton kernels that replace it.

`select(impl, device)` returns a frozen `KernelSet`; models are built with one and never switch later.
`cpu_decode` is apart from the sets: a whole Llama forward in C for x86 CPUs with AVX2 (the torch
backend's int4 on the CPU, backends/torch/cpu_lm.py), its matmul defined by `reference.block_linear`.
"""

from __future__ import annotations

import importlib
import logging

import torch

log = logging.getLogger(__name__)

IMPLS = ("torch", "triton", "auto")

# Modules that provide Triton versions of ops: module path -> op names it exports in `OPS`.
# Each is imported only when a Triton kernel set is asked for.
TRITON_MODULES: dict[str, tuple[str, ...]] = {
    "speechrt.kernels.triton_norm": ("layer_norm", "rms_norm"),
    "speechrt.kernels.triton_act": ("gelu", "silu_mul", "gelu_tanh_mul"),
    "speechrt.kernels.triton_rotary": ("rotary",),
    "speechrt.kernels.triton_matmul": ("linear",),
    "speechrt.kernels.triton_int8_matmul": ("linear_int8",),
    "speechrt.kernels.triton_int4_matmul": ("pack_int4", "linear_int4"),
    "speechrt.kernels.triton_fp8_matmul": ("linear_fp8",),
    # prefill/encoder flash attention; single-query calls go to triton_decode_attention (split-K)
    "speechrt.kernels.triton_attention": ("attention",),
}


class KernelSet:
    """A frozen mapping from op name to callable, read as attributes: `ops.rms_norm(x, w, eps)`."""

    __slots__ = ("impl", "device", "_ops", "sources")

    def __init__(self, impl: str, device: torch.device, ops: dict, sources: dict):
        object.__setattr__(self, "impl", impl)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "_ops", dict(ops))
        object.__setattr__(self, "sources", dict(sources))  # op -> "torch" | "triton"

    def __getattr__(self, name):
        ops = object.__getattribute__(self, "_ops")
        try:
            return ops[name]
        except KeyError:
            raise AttributeError(f"kernel set has no op {name!r}; ops: {', '.join(sorted(ops))}") from None

    def __setattr__(self, name, value):
        raise AttributeError("KernelSet is frozen; build a new one with kernels.select()")

    def __contains__(self, name):
        return name in self._ops

    def names(self):
        return sorted(self._ops)

    def __repr__(self):
        return f"KernelSet(impl={self.impl!r}, device={self.device}, ops={self.sources})"


def _triton_ops() -> dict:
    ops = {}
    for mod, names in TRITON_MODULES.items():
        m = importlib.import_module(mod)
        for n in names:
            ops[n] = m.OPS[n]
    return ops


def _missing(name: str):
    def op(*args, **kwargs):
        raise RuntimeError(
            f"kernel set 'triton' has no Triton version of op {name!r}; build the model with the "
            "'auto' kernel set (falls back to the torch reference per op) or use --backend torch"
        )

    op.__name__ = f"missing_{name}"
    return op


def select(impl: str = "auto", device: str | torch.device = "cpu") -> KernelSet:
    """Kernel set for `impl` in {'torch', 'triton', 'auto'} on `device`.

    'triton' requires Triton and a GPU (or TRITON_INTERPRET=1 for correctness runs on the CPU); an op
    without a Triton version raises naming the op when a model calls it. 'auto' uses Triton where it can and falls back
    to the reference per op, logging why.
    """
    from .reference import OPS as REF

    device = torch.device(device)
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel implementation {impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "torch":
        return KernelSet("torch", device, REF, {k: "torch" for k in REF})
    import os

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    reason = None
    try:
        import triton  # noqa: F401
    except ImportError:
        reason = "Triton is not installed (pip install 'speechrt[triton]')"
    if reason is None and device.type != "cuda" and not interpret:
        reason = (
            f"Triton kernels need a CUDA or ROCm device, got {device} "
            "(set TRITON_INTERPRET=1 to run them in the interpreter)"
        )
    tri = {} if reason else _triton_ops()
    if impl == "triton":
        if reason:
            raise RuntimeError(f"kernel set 'triton' unavailable: {reason}")
        ops = dict(tri)
        for k in sorted(set(REF) - set(tri)):  # a model that calls one of these fails naming it
            ops[k] = _missing(k)
        return KernelSet("triton", device, ops, {k: ("triton" if k in tri else "missing") for k in ops})
    if reason:
        log.info("kernels: using the torch reference: %s", reason)
    ops = {k: tri.get(k, f) for k, f in REF.items()}
    for k in REF:
        if k not in tri and not reason:
            log.info("kernels: op %s has no Triton version; using the torch reference", k)
    return KernelSet("auto", device, ops, {k: ("triton" if k in tri else "torch") for k in REF})
