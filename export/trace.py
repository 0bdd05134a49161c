"""Tracing torch modules into ONNX graphs (torch.onnx's TorchScript exporter) with I/O from manifest Tensors."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from speechrt.kernels import KernelSet
from speechrt.kernels.reference import OPS as REFERENCE

from .manifest import Tensor


def _layer_norm(x, weight, bias, eps=1e-5, residual=None):
    """kernels.reference.layer_norm with the normalized size taken from the weight: the tracer records
    x.shape[-1] as a graph value, which torch.onnx's layer_norm cannot take."""
    if residual is not None:
        x = x + residual
        return torch.nn.functional.layer_norm(x, (weight.numel(),), weight, bias, eps), x
    return torch.nn.functional.layer_norm(x, (weight.numel(),), weight, bias, eps)


def export_ops() -> KernelSet:
    """The torch reference kernel set, traceable by torch.onnx."""
    ops = dict(REFERENCE, layer_norm=_layer_norm)
    return KernelSet("torch", torch.device("cpu"), ops, {k: "torch" for k in ops})


def trace(module, args, path: Path, ins: list[Tensor], outs: list[Tensor], opset: int) -> None:
    """Trace `module(*args)` into `path`; axes named by strings in the Tensors' shapes are dynamic."""
    dyn = {t.name: {i: s for i, s in enumerate(t.shape) if isinstance(s, str)} for t in ins + outs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=[t.name for t in ins],
            output_names=[t.name for t in outs],
            dynamic_axes={k: v for k, v in dyn.items() if v},
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )
