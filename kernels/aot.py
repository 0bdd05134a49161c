"""Ahead-of-time compilation of every Triton kernel, at the models' shapes, for NVIDIA and AMD targets,
with no GPU present: registers, spills and shared memory per kernel and target, and whether the
matrix instructions (mma / wgmma on NVIDIA, v_mfma on AMD) were used by the matmul-like kernels.

Block sizes and warp counts come from each launcher's `config()`, so what is compiled here is what the
launchers run. Shapes: Whisper tiny (d 384, 6 heads of 64, 1500 audio / 448 text positions, MLP 1536)
and SmolLM2-135M (hidden 576, 9 heads / 3 kv heads of 64, MLP 1536), plus head dim 128 attention.

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
from dataclasses import asdict, dataclass, field

TARGETS = ("sm_80", "sm_90", "gfx90a", "gfx942")


def gpu_target(name: str):
    from triton.backends.compiler import GPUTarget

    if name.startswith("sm_") and name[3:].isdigit():
        return GPUTarget("cuda", int(name[3:]), 32)
    if re.fullmatch(r"gfx[0-9a-f]+", name):
        return GPUTarget("hip", name, 64)
    raise ValueError(f"unknown target {name!r}; valid: {', '.join(TARGETS)} (or any sm_NN / gfxNNN)")


@dataclass(frozen=True)
class Spec:
    kernel: str  # the @triton.jit function's name
    variant: str  # model / shape it was specialized for
    fn: object = field(repr=False)
    signature: dict = field(repr=False)
    constexprs: dict = field(repr=False)
    options: dict = field(repr=False)  # num_warps, num_stages
    aligned: tuple = field(repr=False)  # args the JIT would specialize as 16-aligned / divisible by 16
    matmul: bool = False  # expected to run on the matrix units


@dataclass
class Result:
    kernel: str
    variant: str
    target: str
    ok: bool
    matmul: bool
    regs: int | None = None  # per-thread registers (NVIDIA) / VGPRs + AGPRs per lane (AMD)
    sgprs: int | None = None  # AMD scalar registers
    spills: int | None = None  # bytes spilled (NVIDIA spill stores) / spilled registers (AMD)
    scratch: int | None = None  # bytes of local (NVIDIA stack) / scratch (AMD) memory per thread
    smem: int | None = None  # shared memory / LDS bytes per program
    mma: bool | None = None
    seconds: float = 0.0
    error: str | None = None


def _spec(fn, variant, types, constexprs, options, aligned=(), matmul=False):
    """types: arg -> Triton type for the runtime args ('*fp16', 'i32', 'fp32'); every other arg must
    be a constexpr in `constexprs`."""
    names = list(fn.arg_names)
    sig = {}
    for n in names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in types:
            sig[n] = types[n]
        else:
            raise KeyError(f"{fn.__name__}: no type for argument {n!r}")
    opts = {k: options[k] for k in ("num_warps", "num_stages") if k in options}
    return Spec(fn.__name__, variant, fn, sig, dict(constexprs), opts, tuple(aligned), matmul)


def _ints(*names):
    return {n: "i32" for n in names}


def specs(hip: bool = False) -> list[Spec]:
    """Every kernel at the shapes the models run it with (fp16 activations, as on GPUs), with the
    launch configuration its launcher picks on NVIDIA or, with `hip`, on AMD."""
    import torch

    from . import triton_act as act
    from . import triton_attention as att
    from . import triton_decode_attention as dec
    from . import triton_int8_matmul as i8
    from . import triton_matmul as mm
    from . import triton_norm as norm
    from . import triton_rotary as rot

    f16 = torch.float16
    out = []

    # norms: rows of d with the residual fused; whisper LayerNorm d=384, SmolLM2 RMSNorm d=576
    strides = ("stride_x", "stride_r", "stride_y", "stride_s")
    c = norm.config(384)
    out.append(
        _spec(
            norm._layer_norm_kernel,
            "whisper d384 +res",
            {
                **{p: "*fp16" for p in ("x_ptr", "r_ptr", "w_ptr", "b_ptr", "y_ptr", "s_ptr")},
                **_ints("N", *strides),
                "eps": "fp32",
            },
            {"HAS_RES": True, "HAS_BIAS": True, "BLOCK": c["BLOCK"]},
            c,
            ("x_ptr", "r_ptr", "w_ptr", "b_ptr", "y_ptr", "s_ptr", "N", *strides),
        )
    )
    c = norm.config(576)
    out.append(
        _spec(
            norm._rms_norm_kernel,
            "smollm2 d576 +res",
            {
                **{p: "*fp16" for p in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr")},
                **_ints("N", *strides),
                "eps": "fp32",
            },
            {"HAS_RES": True, "BLOCK": c["BLOCK"]},
            c,
            ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr", "N", *strides),
        )
    )

    # activations: MLP width 1536 in both models
    c = act.config(1536)
    out.append(
        _spec(
            act._gelu_kernel,
            "whisper mlp 1536 +bias",
            {"x_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*fp16", **_ints("N", "stride_x", "stride_y")},
            {"HAS_BIAS": True, "BLOCK": c["BLOCK"]},
            c,
            ("x_ptr", "b_ptr", "y_ptr", "N", "stride_x", "stride_y"),
        )
    )
    out.append(
        _spec(
            act._silu_mul_kernel,
            "smollm2 mlp 1536",
            {"g_ptr": "*fp16", "u_ptr": "*fp16", "y_ptr": "*fp16", **_ints("N", "stride_g", "stride_u", "stride_y")},
            {"BLOCK": c["BLOCK"]},
            c,
            ("g_ptr", "u_ptr", "y_ptr", "N", "stride_g", "stride_u", "stride_y"),
        )
    )

    # rotary: SmolLM2 9 query / 3 key heads of 64
    c = rot.config(9, 32)
    rs = (
        "sqb",
        "sqh",
        "sqt",
        "skb",
        "skh",
        "skt",
        "scb",
        "sct",
        "ssb",
        "sst",
        "sqob",
        "sqoh",
        "sqot",
        "skob",
        "skoh",
        "skot",
    )
    out.append(
        _spec(
            rot._rotary_kernel,
            "smollm2 9/3 heads d64",
            {
                **{p: "*fp16" for p in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr")},
                "cos_ptr": "*fp32",
                "sin_ptr": "*fp32",
                **_ints("T", "H", "HKV", "HALF", *rs),
            },
            {"BLOCK_H": c["BLOCK_H"], "BLOCK_HALF": c["BLOCK_HALF"]},
            c,
            ("q_ptr", "k_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr", "HALF", "sqh", "sqt", "skh", "skt"),
        )
    )

    # linear: whisper encoder (M = 1500 positions) and batch-1 decode, the two configs the launcher picks
    lin_types = {
        "x_ptr": "*fp16",
        "w_ptr": "*fp16",
        "b_ptr": "*fp16",
        "y_ptr": "*fp16",
        **_ints("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym"),
    }
    lin_aligned = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym")
    for variant, M, N, K in (("whisper enc 1500x384->1536", 1500, 1536, 384), ("decode 1x576->1536", 1, 1536, 576)):
        c = mm.config(M, N, K, f16)
        out.append(
            _spec(
                mm._linear_kernel,
                variant,
                lin_types,
                {
                    "HAS_BIAS": True,
                    "PRECISION": mm.precision(f16),
                    "UPCAST": False,
                    **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                },
                c,
                lin_aligned,
                matmul=True,
            )
        )

    # int8 weight-only linear: SmolLM2 batch-1 decode (gate/up 576->1536) and a 128-token prefill
    i8_types = {
        "x_ptr": "*fp16",
        "w_ptr": "*i8",
        "s_ptr": "*fp16",
        "b_ptr": "*fp16",
        "y_ptr": "*fp16",
        **_ints("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym"),
    }
    for variant, M in (("smollm2 decode 1x576->1536", 1), ("smollm2 prefill 128x576->1536", 128)):
        c = i8.config(M, 1536, 576, f16)
        out.append(
            _spec(
                i8._linear_int8_kernel,
                variant,
                i8_types,
                {
                    "HAS_BIAS": False,
                    "PRECISION": i8.precision(f16),
                    "UPCAST": False,
                    **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")},
                },
                c,
                ("x_ptr", "w_ptr", "s_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym"),
                matmul=True,
            )
        )

    # flash attention: whisper encoder (non-causal), SmolLM2 prefill (causal, GQA), head dim 128
    att_strides = ("sqb", "sqh", "sqt", "skb", "skh", "skt", "svb", "svh", "svt", "sob", "soh", "sot")
    att_types = {
        **{p: "*fp16" for p in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")},
        "len_ptr": "*i32",
        **_ints(*att_strides, "H", "GROUP", "Tq", "Tk", "D"),
        "qk_scale": "fp32",
    }
    att_aligned = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "len_ptr", *att_strides, "D")
    for variant, Tq, D, causal in (
        ("whisper encoder 1500 d64", 1500, 64, False),
        ("smollm2 prefill causal d64", 512, 64, True),
        ("prefill causal d128", 512, 128, True),
    ):
        c = att.config(Tq, D, f16, hip=hip, causal=causal)
        out.append(
            _spec(
                att._attention_kernel,
                variant,
                att_types,
                {
                    "CAUSAL": causal,
                    "HAS_LENS": False,
                    "PRECISION": att.precision(f16),
                    "UPCAST": False,
                    **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D")},
                },
                c,
                att_aligned,
                matmul=True,
            )
        )

    # decode attention over the KV cache: SmolLM2 (9 query / 3 key-value heads, 2048-token cache,
    # per-sequence lengths: the grouped kernel), Whisper cross-attention (6 heads over 1500 encoder
    # states: the per-head kernel), head dim 128 grouped (32 / 8 heads) and per-head
    dec_common = {
        **{p: "*fp16" for p in ("q_ptr", "k_ptr", "v_ptr")},
        "len_ptr": "*i32",
        "po_ptr": "*fp32",
        "plse_ptr": "*fp32",
        **_ints("sqb", "sqh", "skb", "skh", "skt", "svb", "svh", "svt", "GROUP", "Tk", "D", "SPLIT_LEN", "NUM_SPLITS"),
        "qk_scale": "fp32",
    }
    dec_aligned = (
        "q_ptr",
        "k_ptr",
        "v_ptr",
        "len_ptr",
        "po_ptr",
        "plse_ptr",
        "sqb",
        "sqh",
        "skb",
        "skh",
        "skt",
        "svb",
        "svh",
        "svt",
        "D",
        "SPLIT_LEN",
    )
    for variant, B, H, Hkv, Tk, D, lens in (
        ("smollm2 B=8 9/3 heads cache 2048 d64 +lengths", 8, 9, 3, 2048, 64, True),
        ("whisper cross B=5 6 heads 1500 d64", 5, 6, 6, 1500, 64, False),
        ("B=4 32/8 heads cache 4096 d128 +lengths", 4, 32, 8, 4096, 128, True),
        ("B=4 16 heads cache 4096 d128 +lengths", 4, 16, 16, 4096, 128, True),
    ):
        group = H // Hkv
        c = dec.config(B * Hkv, Tk, D, group)
        if group > 1:
            out.append(
                _spec(
                    dec._decode_attention_grouped_kernel,
                    variant,
                    {**dec_common, "HKV": "i32"},
                    {
                        "HAS_LENS": lens,
                        "PRECISION": dec.precision(f16),
                        "UPCAST": False,
                        **{k: c[k] for k in ("BLOCK_G", "BLOCK_N", "BLOCK_D")},
                    },
                    c,
                    dec_aligned,
                    matmul=True,
                )
            )
        else:
            out.append(
                _spec(
                    dec._decode_attention_kernel,
                    variant,
                    {**dec_common, "H": "i32"},
                    {"HAS_LENS": lens, "BLOCK_N": c["BLOCK_N"], "BLOCK_D": c["BLOCK_D"]},
                    c,
                    dec_aligned,
                )
            )
        out.append(
            _spec(
                dec._decode_reduce_kernel,
                variant,
                {
                    "po_ptr": "*fp32",
                    "plse_ptr": "*fp32",
                    "o_ptr": "*fp16",
                    **_ints("H", "D", "sob", "soh", "NUM_SPLITS"),
                },
                {"BLOCK_S": max(2, 1 << (c["NUM_SPLITS"] - 1).bit_length()), "BLOCK_D": c["BLOCK_D"]},
                {"num_warps": 2},
                ("po_ptr", "plse_ptr", "o_ptr", "D", "sob", "soh"),
            )
        )
    return out


def _nvidia_resources(ptx: str, arch: int) -> dict:
    """Registers, spills and stack from `ptxas -v` on the kernel's PTX (same flags as Triton's build)."""
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
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return {
        "regs": int(regs.group(1)) if regs else None,
        "spills": max(int(spill.group(1)), int(spill.group(2))) if spill else None,
        "scratch": int(stack.group(1)) if stack else None,
    }


def _amd_resources(asm: str) -> dict:
    def num(key):
        m = re.search(rf"^\s*-?\s*\.{key}:\s+(\d+)", asm, re.M)
        return int(m.group(1)) if m else None

    agprs = num("agpr_count") or 0
    vgprs = num("vgpr_count")
    scratch = re.search(r"; ScratchSize: (\d+)", asm)
    return {
        "regs": vgprs + agprs if vgprs is not None else None,
        "sgprs": num("sgpr_count"),
        "spills": (num("vgpr_spill_count") or 0) + (num("sgpr_spill_count") or 0),
        "scratch": int(scratch.group(1)) if scratch else None,
    }


def compile_spec(spec: Spec, target: str) -> Result:
    import triton
    from triton.compiler import ASTSource

    t0 = time.perf_counter()
    res = Result(spec.kernel, spec.variant, target, False, spec.matmul)
    try:
        tgt = gpu_target(target)
        names = list(spec.fn.arg_names)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec.aligned}
        k = triton.compile(
            ASTSource(spec.fn, spec.signature, spec.constexprs, attrs), target=tgt, options=dict(spec.options)
        )
        res.smem = int(k.metadata.shared)
        if tgt.backend == "cuda":
            ptx = k.asm["ptx"]
            res.mma = bool(re.search(r"^\s*(wgmma\.mma_async|mma\.sync)", ptx, re.M))
            for key, val in _nvidia_resources(ptx, tgt.arch).items():
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
    per_vendor = {hip: specs(hip) for hip in (False, True)}
    for i, s in enumerate(per_vendor[False]):
        if kernels and not any(k in s.kernel for k in kernels):
            continue
        for t in targets:
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
    head = ("kernel", "variant", "target", "ok", "regs", "spills", "smem", "mma", "s")
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
