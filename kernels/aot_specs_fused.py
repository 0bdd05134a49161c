"""What the AOT report compiles of the fused decode-step kernels (kernels/triton_fused.py): each launch
configuration its `config()` picks for a decode step of 1 and of 64 rows, in bf16, at the SmolLM2-135M shape
(d 576, 9 / 3 heads of 64, MLP 1536) and the Llama-3.2-1B shape (d 2048, 32 / 8 heads of 64, FFN 8192). The
widths are runtime arguments (both divisible by 16, as `aligned` tells the compiler), so one binary serves
both shapes; the Qwen3 variant (per-head norms, whole heads per program) and the Qwen2 bias compile apart. A one-row
step splits K where the grid under-fills the GPU and K is long (kernels/triton_fused_split.py: the 1B shape's Q/K/V;
int4 G 32 at SmolLM2's): the split variants of the ops at one row, which on NVIDIA add their splits up in the same
launch (the merge: triton_fused_split.merges()) and on AMD leave partial sums to the second launches, compiled too.

The Whisper decoder step's kernels (kernels/triton_fused_whisper.py, and linear_residual with its bias) in float16
(the GPU default of the ASR runners), 1 and 64 rows (a beam search's batch), at the Whisper tiny shape (d 384, 6
heads of 64, MLP 1536, vocabulary 51864) and the large-v3-turbo shape (d 1280, 20 heads of 64, MLP 5120, vocabulary
51866: not a multiple of 16, so the column count is not marked aligned) with one binary per epilogue; and the greedy
pick after a step (the logit rules and argmax in one launch), with and without the timestamp rules, and its split
launch for few rows (chunks of the vocabulary, then their merge)."""

from __future__ import annotations

from .aot_specs import Spec, int_args, make_spec, one_row

SHAPES = "smollm2 d576 / llama-1b d2048"
WHISPER = "whisper tiny d384 / large-v3-turbo d1280"


def qkv_signature() -> tuple[dict, tuple]:
    """The norm_qkv_rope kernels' argument types (bf16 activations and weights) and the args marked aligned."""
    ptrs = ("x_ptr", "g_ptr", "w_ptr", "b_ptr", "qn_ptr", "kn_ptr", "q_ptr", "kc_ptr", "vc_ptr")
    strides = ("sxm", "swn", "sct", "sqm", "sqh", "skb", "skh", "skt", "svb", "svh", "svt")
    types = {
        **{p: "*bf16" for p in ptrs},
        "cos_ptr": "*fp32",
        "sin_ptr": "*fp32",
        "pos_ptr": "*i64",
        "p_ptr": "*fp32",
        "ss_ptr": "*fp32",
        **int_args("M", "K", "K_SPLIT", "H", "HKV", "HALF", "s0", "sxk", "swk", *strides),
        "eps": "fp32",
    }
    return types, (*ptrs, "cos_ptr", "sin_ptr", "pos_ptr", "p_ptr", "ss_ptr", "K", "K_SPLIT", "HALF", *strides)


def fused_specs(hip: bool = False) -> list[Spec]:
    import torch

    from . import triton_fused as fu
    from .triton_matmul import precision

    bf16 = torch.bfloat16
    out = []
    qkv_types, qkv_aligned = qkv_signature()
    for variant, M, bias, qk_norm, split in (
        (f"{SHAPES} M=1", 1, False, False, False),
        (f"{SHAPES} M=1 split-K" + " merged" * (not hip), 1, False, False, True),
        (f"{SHAPES} M=64", 64, False, False, False),
        ("qwen3 head norms + qwen2 bias d64 M=8", 8, True, True, False),
    ):
        c = fu.config(M, bf16, 32, whole_head=qk_norm)
        cx = {"HAS_BIAS": bias, "QK_NORM": qk_norm, "SPLIT": split, "MERGE": split and not hip}
        cx.update(PRECISION=precision(bf16), UPCAST=False)
        cx.update({k: c[k] for k in ("BLOCK_M", "BLOCK_HALF", "BLOCK_K")}, **one_row(M))
        out.append(make_spec(fu._norm_qkv_rope_kernel, variant, qkv_types, cx, c, qkv_aligned, matmul=True))

    mm_types = {**int_args("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym")}
    gu_types = {**{p: "*bf16" for p in ("x_ptr", "g_ptr", "w_ptr", "y_ptr")}, **mm_types, "eps": "fp32"}
    gu_types.update({"p_ptr": "*fp32", "ss_ptr": "*fp32", "K_SPLIT": "i32"})
    gu_aligned = ("x_ptr", "g_ptr", "w_ptr", "y_ptr", "p_ptr", "ss_ptr", "N", "K", "K_SPLIT", "sxm", "swn", "sym")
    for M, split in ((1, False), (1, True), (64, False)):
        c = fu.config(M, bf16)
        cx = {"PRECISION": precision(bf16), "UPCAST": False, **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}}
        cx.update(one_row(M))
        rp = {p: "*bf16" for p in ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "y_ptr")}
        out.append(
            make_spec(
                fu._linear_residual_kernel,
                f"{SHAPES} o/down proj M={M}" + ((" split-K" + " merged" * (not hip)) if split else ""),
                {**rp, **mm_types, "srm": "i32", "p_ptr": "*fp32", "K_SPLIT": "i32"},
                {**cx, "HAS_BIAS": False, "SPLIT": split, "MERGE": split and not hip},
                c,
                (*rp, "p_ptr", "N", "K", "K_SPLIT", "sxm", "swn", "srm", "sym"),
                matmul=True,
            )
        )
        variant = f"{SHAPES} mlp 1536 / 8192 M={M}" + ((" split-K" + " merged" * (not hip)) if split else "")
        cx.update(SPLIT=split, MERGE=split and not hip)
        out.append(make_spec(fu._norm_gate_up_kernel, variant, gu_types, cx, c, gu_aligned, True))
    # the final norm folded into the output projection (vocabulary 49152 / 128256), float32 logits
    nl = {**{p: "*bf16" for p in ("x_ptr", "g_ptr", "w_ptr")}, "y_ptr": "*fp32", **mm_types, "eps": "fp32"}
    for M in (1, 64):
        c = fu.config(M, bf16)
        cx = {"PRECISION": precision(bf16), "UPCAST": False, **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}}
        na = ("x_ptr", "g_ptr", "w_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym")
        variant = f"{SHAPES} final norm + logits M={M}"
        out.append(make_spec(fu._norm_logits_kernel, variant, nl, {**cx, **one_row(M)}, c, na, matmul=True))
    # the step's embeddings and key counts (one block of 1024 columns at both widths; tokens and positions contiguous,
    # their unit strides specialized as a launch does)
    ti = {"tok_ptr": "*i64", "emb_ptr": "*bf16", "pos_ptr": "*i64", "s_ptr": "*bf16", "len_ptr": "*i32"}
    ti.update(int_args("d", "se", "ssm"))
    ta = ("emb_ptr", "s_ptr", "d", "se", "ssm")
    cx = {"BLOCK": 1024, "stok": 1, "spos": 1}
    out.append(make_spec(fu._token_inputs_kernel, f"{SHAPES} embeddings", ti, cx, {"num_warps": 4}, ta))
    return out + split_sum_specs() + whisper_specs(hip)


def split_sum_specs() -> list[Spec]:
    """The second launch of a split-K norm-folded op (kernels/triton_fused_split.py): its partial sums added up and
    the op's epilogue, at one row (the Qwen3 + Qwen2 variant: whole heads of 64, as its first launch's tiles)."""
    import torch

    from . import triton_fused as fu
    from . import triton_fused_split as fs

    out = []
    types, aligned = qkv_signature()
    types = {k: v for k, v in types.items() if k not in ("x_ptr", "g_ptr", "w_ptr", "K_SPLIT", "sxm", "sxk")}
    types = {k: v for k, v in types.items() if k not in ("swn", "swk")} | int_args("SPLITS")
    aligned = tuple(a for a in aligned if a in types)
    for what, qk_norm in (("", False), (" qwen3 head norms + qwen2 bias d64", True)):
        c = fu.config(1, torch.bfloat16, 32, whole_head=qk_norm)
        cx = {"HAS_BIAS": qk_norm, "QK_NORM": qk_norm, "BLOCK_M": c["BLOCK_M"], "BLOCK_HALF": c["BLOCK_HALF"], "M": 1}
        variant = f"{SHAPES} M=1 split-K sums + rotary + cache{what}"
        out.append(make_spec(fs._sum_qkv_kernel, variant, types, cx, {"num_warps": 4}, aligned))
    c = fu.config(1, torch.bfloat16)
    out.append(
        make_spec(
            fs._sum_gate_up_kernel,
            f"{SHAPES} mlp 1536 / 8192 M=1 split-K sums + silu * up",
            {"p_ptr": "*fp32", "ss_ptr": "*fp32", "y_ptr": "*bf16", **int_args("SPLITS", "M", "N", "K", "sym")}
            | {"eps": "fp32"},
            {"BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], "M": 1},
            {"num_warps": 4},
            ("p_ptr", "ss_ptr", "y_ptr", "N", "K", "sym"),
        )
    )
    for M in (1, 64):
        c = fu.config(M, torch.bfloat16)
        out.append(
            make_spec(
                fs._sum_residual_kernel,
                f"{SHAPES} o/down proj split-K sums + residual M={M}",
                {**{p: "*bf16" for p in ("b_ptr", "r_ptr", "y_ptr")}, "p_ptr": "*fp32"}
                | int_args("SPLITS", "M", "N", "srm", "sym"),
                {"HAS_BIAS": False, "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], **one_row(M)},
                {"num_warps": 4},
                ("p_ptr", "b_ptr", "r_ptr", "y_ptr", "N", "srm", "sym"),
            )
        )
    return out


def whisper_specs(hip: bool = False) -> list[Spec]:
    import torch

    from . import triton_fused as fu
    from . import triton_fused_whisper as fw
    from .triton_matmul import precision

    f16 = torch.float16
    ptrs = ("x_ptr", "g_ptr", "b_ptr", "w_ptr", "bias_ptr", "y_ptr", "kc_ptr", "vc_ptr")
    strides = ("sxm", "swn", "sym", "skb", "skh", "skt", "svb", "svh", "svt")
    types = {
        **{p: "*fp16" for p in ptrs},
        "pos_ptr": "*i64",
        **int_args("M", "N", "K", "HD", "D", "sxk", "swk", "spos", *strides),
        "eps": "fp32",
    }
    aligned = (*ptrs, "pos_ptr", "K", "HD", "D", *strides)
    out = []
    for what, epilogue, bias, Ms in (
        ("ln + qkv + bias + cache write", fw.QKV_CACHE, True, (1, 64)),
        ("ln + fc1 + bias + gelu", fw.GELU, True, (1, 64)),
        ("ln + cross q + bias", fw.PLAIN, True, (1,)),
        ("ln + logits (vocab 51864 / 51866)", fw.PLAIN, False, (64,)),
    ):
        for M in Ms:
            c = fu.config(M, f16)
            cx = {"EPILOGUE": epilogue, "HAS_BIAS": bias, "PRECISION": precision(f16), "UPCAST": False, **one_row(M)}
            cx.update({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")})
            out.append(make_spec(fw._norm_linear_kernel, f"{WHISPER} {what} M={M}", types, cx, c, aligned, matmul=True))
    ip = {"tok_ptr": "*i64", "temb_ptr": "*fp16", "pemb_ptr": "*fp16", "pos_ptr": "*i64", "cl_ptr": "*i64"}
    ip.update({"s_ptr": "*fp16", "sl_ptr": "*i32", "cl32_ptr": "*i32", **int_args("d", "stok", "ste", "spe", "ssm")})
    for d in (384, 1280):
        c = fw.inputs_config(d)
        cx = {"HAS_CL": True, "BLOCK": c["BLOCK"]}
        aligned = (*(p for p in ip if p.endswith("_ptr")), "d", "ste", "spe", "ssm")
        out.append(make_spec(fw._step_inputs_kernel, f"whisper d{d} embeddings + lengths", ip, cx, c, aligned))
    rp = ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "y_ptr")
    for M in (1, 64):
        c = fu.config(M, f16)
        cx = {"HAS_BIAS": True, "PRECISION": precision(f16), "UPCAST": False, **one_row(M)}
        cx.update({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")})
        out.append(
            make_spec(
                fu._linear_residual_kernel,
                f"{WHISPER} out / fc2 proj + bias M={M}",
                {**{p: "*fp16" for p in rp}, **int_args("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym", "srm")}
                | {"p_ptr": "*fp32", "K_SPLIT": "i32"},
                {**cx, "SPLIT": False},
                c,
                (*rp, "p_ptr", "N", "K", "K_SPLIT", "sxm", "swn", "srm", "sym"),
                matmul=True,
            )
        )
    # the greedy pick after a step (kernels/triton_whisper_pick.py), with and without the timestamp rules
    from . import triton_whisper_pick as wp

    pt = {"x_ptr": "*fp32", "sup_ptr": "*u8", "st_ptr": "*i64", "ids_ptr": "*i64", "lp_ptr": "*fp32"}
    pt.update(int_args("V", "sx", "n", "tb", "eot"))
    for ts in (True, False):
        c = wp.config(51864)
        cx = {"TIMESTAMPS": ts, "BLOCK": c["BLOCK"]}
        variant = f"whisper vocabulary 51864 / 51866 pick{' + timestamp rules' if ts else ''}"
        out.append(make_spec(wp._whisper_pick_kernel, variant, pt, cx, c, ("x_ptr", "sup_ptr", "st_ptr", "sx")))
    # its split launch for few rows (1 row: 102 chunks, 8 rows: 15): the chunks' partial states, merged by each row's
    # last chunk on NVIDIA, by a second launch on AMD (triton_decode_attention.merges_in_launch)
    pp = {**pt, "pf_ptr": "*fp32", "pi_ptr": "*i32", **int_args("CHUNK")}
    for ts, rows in ((True, 1), (False, 1), (True, 8)):
        cx = {"TIMESTAMPS": ts, "BLOCK": wp.SPLIT_BLOCK, "BLOCK_C": wp.split_config(rows, 51865, 132)["BLOCK_C"]}
        cx["MERGE"] = not hip
        variant = f"whisper vocabulary 51864 / 51866 pick, chunks{' + timestamp rules' if ts else ''}, {rows} row"
        variant += ("s" if rows > 1 else "") + (" merged" if not hip else "")
        aligned = ("x_ptr", "sup_ptr", "st_ptr", "pf_ptr", "pi_ptr", "sx", "CHUNK")
        out.append(make_spec(wp._whisper_pick_part_kernel, variant, pp, cx, {"num_warps": 4}, aligned))
    pm = {"pf_ptr": "*fp32", "pi_ptr": "*i32", "ids_ptr": "*i64", "lp_ptr": "*fp32", **int_args("n", "CHUNKS")}
    for rows in (1, 8):
        sc = wp.split_config(rows, 51865, 132)
        cx = {"BLOCK_C": sc["BLOCK_C"]}
        variant = f"whisper pick, merge of {sc['CHUNKS']} chunks ({rows} row{'s' if rows > 1 else ''}, 132 SMs)"
        out.append(make_spec(wp._whisper_pick_combine_kernel, variant, pm, cx, {"num_warps": 1}, ("pf_ptr", "pi_ptr")))
    # the repetition stop's step in a language model's decode block (kernels/triton_repeats.py)
    from . import triton_repeats as tr

    pt = {n: "*i64" for n in ("last_ptr", "run_ptr", "need_ptr", "t_ptr", "last_out", "run_out")}
    pt.update({"done_ptr": "*u8", "done_out": "*u8", **int_args("sl", "sr", "sn")})
    rp = ("last_ptr", "run_ptr", "need_ptr", "last_out", "run_out", "sl", "sr", "sn")
    out.append(
        make_spec(tr._repeat_step_kernel, "repetition stop step, 32 span lengths", pt, {"P": 32}, {"num_warps": 1}, rp)
    )
    return out
