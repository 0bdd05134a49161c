"""Ahead-of-time compilation of every Triton kernel, at the models' shapes, for NVIDIA and AMD targets,
with no GPU present: registers, spills and shared memory per kernel and target, and whether the
matrix instructions (mma / wgmma on NVIDIA, v_mfma on AMD) were used by the matmul-like kernels.

Block sizes and warp counts come from each launcher's `config()` (aot_specs.py, aot_specs_fused.py,
aot_specs_quant.py), so what is compiled here is what the launchers run. Shapes: Whisper tiny (d 384, 6 heads of
64, 1500 audio / 448 text positions, MLP 1536) and SmolLM2-135M (hidden 576, 9 heads / 3 kv heads of 64, MLP
1536), plus head dim 128 attention; the fused decode-step kernels and the quantized linears also at the
Llama-3.2-1B shape (d 2048, 32 / 8 heads, FFN 8192), and the Whisper decoder step's at the tiny and
large-v3-turbo shapes (d 384 / 1280, vocabulary 51864 / 51866). A spec may name the only targets it compiles for.

Run `python -m speechrt.kernels.aot [--json PATH]` or `speechrt kernels report`. Under
TRITON_INTERPRET=1 the kernels are interpreter objects that cannot be compiled, so `report()` then
runs the compiles in a subprocess with the interpreter switched off.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from .aot_specs import Spec, specs
from .aot_specs_fused import fused_specs
from .aot_specs_quant import quant_specs

TARGETS = ("sm_80", "sm_90", "gfx90a", "gfx942")


def gpu_target(name: str):
    from triton.backends.compiler import GPUTarget

    if name.startswith("sm_") and name[3:].isdigit():
        return GPUTarget("cuda", int(name[3:]), 32)
    if re.fullmatch(r"gfx[0-9a-f]+", name):
        return GPUTarget("hip", name, 64)
    raise ValueError(f"unknown target {name!r}; valid: {', '.join(TARGETS)} (or any sm_NN / gfxNNN)")


@dataclass
class Result:
    kernel: str
    variant: str
    target: str
    ok: bool
    matmul: bool
    regs: int | None = None  # per-thread registers (NVIDIA) / VGPRs + AGPRs per lane (AMD)
    sgprs: int | None = None  # AMD scalar registers
    spills: int | None = None  # bytes spilled (NVIDIA spill stores) / registers spilled to scratch memory (AMD)
    scratch: int | None = None  # bytes of local (NVIDIA stack) / scratch (AMD) memory per thread
    smem: int | None = None  # shared memory / LDS bytes per program
    mma: bool | None = None
    pdl: bool | None = None  # the binary waits for the previous kernel (griddepcontrol; sm_90+ kernels with a PDL flag)
    seconds: float = 0.0
    error: str | None = None


def _ptxas_log(ptx: str, arch: int) -> str:
    """`ptxas -v`'s report on the kernel's PTX (same flags as Triton's build), for a kernel Triton took from its cache
    (a fresh compile prints it: _compile)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run(
            [
                get_ptxas(arch).path,
                "-lineinfo",
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name={sm_arch_from_capability(arch)}",
                src,
                "-o",
                os.path.join(d, "k.o"),
            ],
            capture_output=True,
            text=True,
        )
    log = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"ptxas -v failed: {log[-500:]}")
    return log


def _nvidia_resources(log: str) -> dict:
    """Registers, spills and stack from a `ptxas -v` report."""
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return {
        "regs": int(regs.group(1)) if regs else None,
        "spills": max(int(spill.group(1)), int(spill.group(2))) if spill else None,
        "scratch": int(stack.group(1)) if stack else None,
    }


def _compile(spec: Spec, tgt):
    """triton.compile of `spec` for the GPUTarget `tgt` -> (the kernel, the `ptxas -v` report Triton's own build of
    an NVIDIA binary printed, or "" where there was none: an AMD target, or a kernel from Triton's cache)."""
    import contextlib
    import io

    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    from .triton_pdl import target_has_pdl

    names = list(spec.fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec.aligned}
    constexprs = dict(spec.constexprs)
    if "PDL" in constexprs:  # a decode-step kernel: on sm_90+ as launched with triton_pdl.ENABLED (2 more instructions)
        constexprs["PDL"] = target_has_pdl(tgt.backend, tgt.arch)
    out = io.StringIO()
    with knobs.nvidia.scope(), contextlib.redirect_stdout(out):
        knobs.nvidia.dump_ptxas_log = True  # Triton's ptxas runs with -v: its report, not a second ptxas run
        k = triton.compile(
            ASTSource(spec.fn, spec.signature, constexprs, attrs), target=tgt, options=dict(spec.options)
        )
    return k, out.getvalue()


def _amd_resources(asm: str) -> dict:
    def num(key):
        m = re.search(rf"^\s*-?\s*\.{key}:\s+(\d+)", asm, re.M)
        return int(m.group(1)) if m else None

    agprs = num("agpr_count") or 0
    vgprs = num("vgpr_count")
    scratch = re.search(r"; ScratchSize: (\d+)", asm)
    scratch = int(scratch.group(1)) if scratch else None
    # spills to memory: VGPRs', and SGPRs' where the kernel has scratch (without it they went to VGPR lanes)
    return {
        "regs": vgprs + agprs if vgprs is not None else None,
        "sgprs": num("sgpr_count"),
        "spills": (num("vgpr_spill_count") or 0) + ((num("sgpr_spill_count") or 0) if scratch else 0),
        "scratch": scratch,
    }


def compile_spec(spec: Spec, target: str) -> Result:
    t0 = time.perf_counter()
    res = Result(spec.kernel, spec.variant, target, False, spec.matmul)
    try:
        tgt = gpu_target(target)
        k, log = _compile(spec, tgt)
        res.smem = int(k.metadata.shared)
        if tgt.backend == "cuda":
            ptx = k.asm["ptx"]
            res.mma = bool(re.search(r"^\s*(wgmma\.mma_async|mma\.sync)", ptx, re.M))
            res.pdl = "griddepcontrol.wait" in ptx
            if "Used " not in log:
                log = _ptxas_log(ptx, tgt.arch)
            for key, val in _nvidia_resources(log).items():
                setattr(res, key, val)
        else:
            asm = k.asm["amdgcn"]
            res.mma = "v_mfma" in asm
            for key, val in _amd_resources(asm).items():
                setattr(res, key, val)
        res.ok = True
    except Exception as e:  # a failed compile is a row of the report, not a crash of it
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        res.error = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
    res.seconds = time.perf_counter() - t0
    return res


def problems(r: Result) -> list[str]:
    """What is wrong with one row: failed, spilled, or a matmul-like kernel without matrix instructions."""
    out = []
    if not r.ok:
        out.append(f"compile failed: {r.error}")
    else:
        if r.spills:
            out.append(f"{r.spills} spilled")
        if r.matmul and not r.mma:
            out.append("no matrix instructions")
    return out


def _compile_here(targets, kernels=None) -> list[Result]:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default
    rows = []
    per_vendor = {hip: specs(hip) + fused_specs(hip) + quant_specs(hip) for hip in (False, True)}
    for i, s in enumerate(per_vendor[False]):
        if kernels and not any(k in s.kernel for k in kernels):
            continue
        for t in targets:
            if s.targets is None or t in s.targets:
                rows.append(compile_spec(per_vendor[gpu_target(t).backend == "hip"][i], t))
    return rows


def _interpreted() -> bool:
    """True when the kernels in this process were decorated for the interpreter (not compilable)."""
    from triton.runtime.jit import JITFunction

    from . import triton_norm

    return os.environ.get("TRITON_INTERPRET") == "1" or not isinstance(triton_norm._layer_norm_kernel, JITFunction)


def report(targets=TARGETS, kernels=None) -> list[Result]:
    """Compile every kernel (or those whose name contains one of `kernels`) for `targets`."""
    if _interpreted():
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.json")
            cmd = [sys.executable, "-m", "speechrt.kernels.aot", "--json", path, "--targets", ",".join(targets)]
            if kernels:
                cmd += ["--kernels", ",".join(kernels)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode not in (0, 1):
                raise RuntimeError(f"AOT compile subprocess failed ({r.returncode}):\n{r.stderr[-2000:]}")
            with open(path) as f:
                return [Result(**row) for row in json.load(f)]
    return _compile_here(targets, kernels)


def format_table(rows: list[Result]) -> str:
    head = ("kernel", "variant", "target", "ok", "regs", "spills", "smem", "mma", "pdl", "s")
    lines = [head]
    for r in rows:
        regs = "-" if r.regs is None else (f"{r.regs}" + (f"/s{r.sgprs}" if r.sgprs is not None else ""))
        mma = "-" if r.mma is None else ("yes" if r.mma else ("NO" if r.matmul else "no"))
        lines.append(
            (
                r.kernel,
                r.variant,
                r.target,
                "yes" if r.ok else "FAILED",
                regs,
                "-" if r.spills is None else str(r.spills),
                "-" if r.smem is None else str(r.smem),
                mma,
                "yes" if r.pdl else "-",
                f"{r.seconds:.1f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.error:
            text.append(f"{r.kernel} [{r.variant}] {r.target}: {r.error}")
    return "\n".join(text)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m speechrt.kernels.aot", description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--kernels", default=None, help="comma list of substrings of kernel names")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = report(a.targets.split(","), a.kernels.split(",") if a.kernels else None)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    print(format_table(rows))
    return 1 if any(problems(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
