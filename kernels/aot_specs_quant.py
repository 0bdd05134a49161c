"""What the AOT report compiles of the quantized linear kernels (kernels/triton_int4_matmul.py, triton_fp8_matmul.py):
each launch configuration their `config()` picks for bf16 activations, a one-row decode step and a 64-row
prefill, at the SmolLM2-135M shape (d 576, FFN 1536, vocab 49152) and the Llama-3.2-1B shape (d 2048, FFN 8192,
vocab 128256). N, K and the group size are runtime arguments, so one binary serves both shapes and every group
size of a K tile (G 32: the GGUF's blocks; G 128: AWQ / GPTQ); the int4 (s, z) pairs compile as float16 (Q4_0 /
Q4_1) and float32 (Q4_K, AWQ / GPTQ). The W8A8 variant (E4M3 operands on the fp8 tensor cores) compiles for
sm_90 only (the launcher takes it on compute capability >= 8.9; sm_80 and the AMD targets have no fp8e4nv);
the W8A16 variant, which reads the weights as bytes, for every target.

The fused decode-step kernels on quantized weights (kernels/triton_fused_quant.py) at the same shapes as their float
twins (aot_specs_fused.py: 1 and 64 rows; the Qwen3 head norms + Qwen2 bias at head dims 64 and 128): int4 with G 32 and
float16 (s, z) pairs and G 128 with float32 ones, fp8 and int8 per channel, the split-K sums of the projection +
residual, and the one-row split-K variants of every op (on NVIDIA merged in the launch; on AMD partial sums, whose
second launch is the float ops': aot_specs_fused.split_sum_specs). They read fp8 as bytes and meet the activations on
the 16-bit tensor / matrix cores (no fp8 dot: decode is bound by reading W), so each compiles for every target, sm_80
and gfx90a included."""

from __future__ import annotations

from dataclasses import replace

from .aot_specs import Spec, int_args, make_spec, one_row

SHAPES = "smollm2 d576 / llama-1b d2048"


def quant_specs(hip: bool = False) -> list[Spec]:
    import torch

    from . import triton_fp8_matmul as f8
    from . import triton_int4_matmul as i4
    from .triton_matmul import precision

    bf16 = torch.bfloat16
    out = []
    w4_types = {
        "x_ptr": "*bf16",
        "w_ptr": "*u8",
        "y_ptr": "*fp32",
        **int_args("M", "N", "K", "G", "K_SPLIT", "sxm", "sxk", "swn", "sym", "sys_"),
    }
    for M, G, sz, y in (
        (1, 32, "fp16", "fp32"),
        (1, 128, "fp32", "fp32"),
        (64, 32, "fp16", "bf16"),
        (64, 128, "fp32", "bf16"),
    ):
        c = i4.config(M, 8192, 2048, bf16, G)
        cx = {"PRECISION": precision(bf16), "UPCAST": False, **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}}
        cx.update(one_row(M))
        out.append(
            make_spec(
                i4._linear_w4_kernel,
                f"{SHAPES} M={M} G={G} scales {sz}" + (" split-K" if M == 1 else ""),
                {**w4_types, "sz_ptr": f"*{sz}", "y_ptr": f"*{y}"},
                cx,
                c,
                ("x_ptr", "w_ptr", "sz_ptr", "y_ptr", "N", "K", "G", "K_SPLIT", "sxm", "swn", "sym", "sys_"),
                matmul=True,
            )
        )
    out.append(
        make_spec(
            i4._sum_splits_kernel,
            f"{SHAPES} M=1 split-K sums",
            {"p_ptr": "*fp32", "y_ptr": "*bf16", **int_args("SPLITS", "MN")},
            {"BLOCK": i4.SUM_BLOCK},
            {"num_warps": 4},
            ("p_ptr", "y_ptr", "MN"),
        )
    )
    f8_types = {
        "x_ptr": "*bf16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "y_ptr": "*bf16",
        **int_args("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym"),
    }
    for M, act in ((1, False), (64, False), (64, True)):
        c = f8.config(M, 8192, 2048, bf16, act)
        cx = {"ACT_FP8": act, "PRECISION": precision(bf16), "UPCAST": False, **one_row(M)}
        cx.update({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")})
        spec = make_spec(
            f8._linear_fp8_kernel,
            f"{SHAPES} M={M} " + ("W8A8" if act else "W8A16"),
            {**f8_types, "w_ptr": "*fp8e4nv"} if act else f8_types,
            cx,
            c,
            ("x_ptr", "w_ptr", "s_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym"),
            matmul=True,
        )
        out.append(replace(spec, targets=("sm_90",)) if act else spec)
    return out + fused_quant_specs(hip)


# (format, group size, scales' type, rows): what each quantized fused kernel compiles as
FUSED_CASES = (("int4", 32, "fp16", 1, 0), ("int4", 128, "fp32", 64, 0), ("fp8", 0, "fp32", 1, 0))
FUSED_CASES += (("fp8", 0, "fp32", 64, 0), ("int8", 0, "bf16", 1, 0))
# the Qwen3 variants of norm_qkv_rope (head norms: whole heads per program, + the Qwen2 bias): head dim 64 and 128
QWEN3_CASES = (("int4", 32, "fp16", 8, 64), ("int4", 128, "fp32", 64, 128), ("fp8", 0, "fp32", 64, 128))


def fused_quant_specs(hip: bool = False) -> list[Spec]:
    import torch

    from . import triton_fused_quant as fq
    from . import triton_fused_split as fs
    from .aot_specs_fused import qkv_signature
    from .triton_matmul import precision

    bf16 = torch.bfloat16
    code = {"int4": fq.INT4, "fp8": fq.FP8, "int8": fq.INT8}
    out = []
    rows_types = int_args("M", "N", "K", "G", "sxm", "sxk", "swn", "swk", "sym")
    rows_aligned = ("x_ptr", "w_ptr", "sz_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym")
    qkv_types, qkv_aligned = qkv_signature()
    split_cases = tuple((*case[:4], 0, True) for case in FUSED_CASES if case[3] == 1)  # K split at one row
    for fmt, G, sz, M, head_dim, split in (*((*c, False) for c in (*FUSED_CASES, *QWEN3_CASES)), *split_cases):
        wq = {"w_ptr": "*i8" if fmt == "int8" else "*u8", "sz_ptr": f"*{sz}"}
        base = {"FMT": code[fmt], "PRECISION": precision(bf16), "UPCAST": False}
        what = f"{SHAPES} {fmt}" + (f" G={G} scales {sz}" if G else "")
        qk_norm = head_dim > 0
        c = fq.fused_config(code[fmt], G)(M, bf16, head_dim // 2 or 32, qk_norm)
        cx = {
            **base,
            **one_row(M),
            "HAS_BIAS": qk_norm,
            "QK_NORM": qk_norm,
            "SPLIT": split,
            "MERGE": split and not hip,  # the launcher's default on each vendor (triton_fused_split.merges)
            **{k: c[k] for k in ("BLOCK_M", "BLOCK_HALF", "BLOCK_K")},
        }
        types = {**qkv_types, **wq, "G": "i32"}
        variant = f"{what} M={M}" + (f" qwen3 head norms (D {head_dim}) + qwen2 bias" if qk_norm else "")
        variant += (" split-K" + " merged" * (not hip)) if split else ""
        out.append(make_spec(fq._norm_qkv_rope_q_kernel, variant, types, cx, c, (*qkv_aligned, "sz_ptr", "G"), True))
        if qk_norm:
            continue
        c = fq.fused_config(code[fmt], G)(M, bf16)
        cx = {**base, **one_row(M), **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}}
        types = {**{p: "*bf16" for p in ("x_ptr", "g_ptr", "y_ptr")}, **wq, **rows_types, "eps": "fp32"}
        types |= {"p_ptr": "*fp32", "ss_ptr": "*fp32", "K_SPLIT": "i32"}
        aligned = (*rows_aligned, "g_ptr", "p_ptr", "ss_ptr", "K_SPLIT")
        variant = f"{what} mlp 1536 / 8192 M={M}" + ((" split-K" + " merged" * (not hip)) if split else "")
        cxg = {**cx, "SPLIT": split, "MERGE": split and not hip}
        out.append(make_spec(fq._norm_gate_up_q_kernel, variant, types, cxg, c, aligned, True))
        if split:
            continue
        rp = {p: "*bf16" for p in ("x_ptr", "b_ptr", "r_ptr", "y_ptr")}
        types = {**rp, **wq, **rows_types, "srm": "i32"}
        aligned = (*rows_aligned, "b_ptr", "r_ptr", "srm")
        tiles = -(-M // c["BLOCK_M"]) * (2048 // c["BLOCK_N"])
        split = fs.k_splits(tiles, 2048, c["BLOCK_K"])[0] > 1  # what the launcher picks at the 1B shape's o projection
        cxr = {**cx, "HAS_BIAS": False, "SPLIT": split, "MERGE": split and not hip}
        types = {**types, "p_ptr": "*fp32", "K_SPLIT": "i32"}
        variant = f"{what} o/down proj M={M}" + ((" split-K" + " merged" * (not hip)) if split else "")
        out.append(
            make_spec(fq._linear_residual_q_kernel, variant, types, cxr, c, (*aligned, "p_ptr", "K_SPLIT"), True)
        )
    return out
