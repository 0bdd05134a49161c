"""Programmatic dependent launch (PDL), NVIDIA Hopper and later (sm_90+): a kernel of the decode steps may be
launched while the kernel before it in the stream is still running, so that its launch and the scheduling of its
programs overlap that kernel's tail instead of following it. A decode step is a chain of one- or two-microsecond
kernels (SmolLM2-135M: ~180 a token), where the gap between two kernels is a large share of the time.

Each kernel of the decode steps takes a PDL constexpr (default False: the plain kernel, as AMD and the interpreter
always run it) and opens with gate(PDL): wait until the kernel before it has finished and its writes are visible
(griddepcontrol.wait), then allow the next one to launch (griddepcontrol.launch_dependents). The wait comes first, so
a kernel never reads what its predecessor is still writing, and no more than two kernels of the chain are resident
at once. A kernel launched without PDL (a torch op between two Triton kernels) waits for its predecessor as usual,
and one launched with it after such an op starts when the op ends. CUDA graphs keep these edges (CUDA 12.3+).

ENABLED is off unless SPEECHRT_PDL=1 is set: no GPU run has timed it yet. `bench gpu`'s lm-fused and asr-fused checks
time the fused steps with it on ("fused-pdl") beside the plain ones and check their logits alike; with the variable
set, any command (`speechrt bench lm`, `speechrt serve`) runs its decode steps with it."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# True: decode-step kernels launch with PDL where the GPU has it (NVIDIA sm_90+)
ENABLED = os.environ.get("SPEECHRT_PDL") == "1"


@triton.jit
def gate(PDL: tl.constexpr):
    """A decode-step kernel's first statement: with PDL, wait for the previous kernel's writes, then let the next
    kernel launch (both no-ops on a launch without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def target_has_pdl(backend: str, arch) -> bool:
    """Whether a compile target has the instructions: NVIDIA ("cuda") of compute capability 9.0 or later (arch 90+)."""
    return backend == "cuda" and arch >= 90


@functools.cache
def _capable(index: int) -> bool:
    major, minor = torch.cuda.get_device_capability(index)
    return target_has_pdl("cuda", 10 * major + minor)


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` can launch with PDL: an NVIDIA GPU of compute capability 9.0 or later, kernels
    compiled (not the interpreter)."""
    if device.type != "cuda" or torch.version.hip is not None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def args(device: torch.device) -> dict:
    """A decode-step kernel's launch arguments for PDL: its constexpr and Triton's launch option when ENABLED and
    `device` supports it, else none (the plain kernel)."""
    return {"PDL": True, "launch_pdl": True} if ENABLED and supported(device) else {}
