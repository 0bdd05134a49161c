"""What the AOT report compiles: every Triton kernel at the shapes the models run it with (Whisper tiny, SmolLM2-135M,
head dim 128 attention), each with the launch configuration its launcher's `config()` picks on NVIDIA or AMD."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    targets: tuple | None = None  # only these targets (None: every one)


# The K strides of every linear's activations and weights: 1 at the models' launches (contiguous along K), and a
# launch specializes an int argument equal to 1 as the constant 1 (as it does the row count of a one-row step:
# one_row), so the report compiles them as that constant: the binary the GPU runs.
UNIT = ("sxk", "swk")


def one_row(M: int) -> dict:
    """The row count as a constexpr where the launch makes it one: 1 (Triton specializes an int argument equal to 1)."""
    return {"M": 1} if M == 1 else {}


def make_spec(fn, variant, types, constexprs, options, aligned=(), matmul=False, capped=False):
    """types: arg -> Triton type for the runtime args ('*fp16', 'i32', 'fp32'); every other arg must
    be a constexpr in `constexprs`. The K strides (UNIT) are the constant 1, as the models' launches make them; a
    decode-step kernel's PDL flag is False here, and aot._compile turns it on for sm_90+ (triton_pdl). A fused op's
    MERGE (its K splits, or the pick's chunks, added up in the launch) is False unless given; its merge counters are
    int32, and a fused op's merged variant (and, `capped`, decode attention's) compiles with the register cap it is
    launched with (triton_decode_attention.merge_options)."""
    names = list(fn.arg_names)
    flags = {f: False for f in ("PDL", "MERGE") if f in names}
    constexprs = {**{n: 1 for n in UNIT if n in names}, **flags, **constexprs}
    types = {"cnt_ptr": "*i32", **types}
    aligned = tuple(a for a in aligned if a not in constexprs)
    sig = {}
    for n in names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in types:
            sig[n] = types[n]
        else:
            raise KeyError(f"{fn.__name__}: no type for argument {n!r}")
    opts = {k: options[k] for k in ("num_warps", "num_stages") if k in options}
    if capped or (constexprs.get("MERGE") and "SPLIT" in names):  # a merge, as launched (merge_options)
        from .triton_decode_attention import MERGE_MAXNREG

        opts["maxnreg"] = MERGE_MAXNREG
    return Spec(fn.__name__, variant, fn, sig, dict(constexprs), opts, tuple(aligned), matmul)


def int_args(*names):
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
        make_spec(
            norm._layer_norm_kernel,
            "whisper d384 +res",
            {
                **{p: "*fp16" for p in ("x_ptr", "r_ptr", "w_ptr", "b_ptr", "y_ptr", "s_ptr")},
                **int_args("N", *strides),
                "eps": "fp32",
            },
            {"HAS_RES": True, "HAS_BIAS": True, "BLOCK": c["BLOCK"]},
            c,
            ("x_ptr", "r_ptr", "w_ptr", "b_ptr", "y_ptr", "s_ptr", "N", *strides),
        )
    )
    c = norm.config(576)
    out.append(
        make_spec(
            norm._rms_norm_kernel,
            "smollm2 d576 +res",
            {
                **{p: "*fp16" for p in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr")},
                **int_args("N", *strides),
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
        make_spec(
            act._gelu_kernel,
            "whisper mlp 1536 +bias",
            {"x_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*fp16", **int_args("N", "stride_x", "stride_y")},
            {"HAS_BIAS": True, "BLOCK": c["BLOCK"]},
            c,
            ("x_ptr", "b_ptr", "y_ptr", "N", "stride_x", "stride_y"),
        )
    )
    gated = {"g_ptr": "*fp16", "u_ptr": "*fp16", "y_ptr": "*fp16", **int_args("N", "stride_g", "stride_u", "stride_y")}
    for kernel, variant in ((act._silu_mul_kernel, "smollm2 mlp 1536"), (act._gelu_tanh_mul_kernel, "gemma3 mlp 2048")):
        c = act.config(2048 if "gemma" in variant else 1536)
        out.append(
            make_spec(
                kernel,
                variant,
                gated,
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
        make_spec(
            rot._rotary_kernel,
            "smollm2 9/3 heads d64",
            {
                **{p: "*fp16" for p in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr")},
                "cos_ptr": "*fp32",
                "sin_ptr": "*fp32",
                **int_args("T", "H", "HKV", "HALF", *rs),
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
        **int_args("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym"),
    }
    lin_aligned = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "N", "K", "sxm", "swn", "sym")
    for variant, M, N, K in (("whisper enc 1500x384->1536", 1500, 1536, 384), ("decode 1x576->1536", 1, 1536, 576)):
        c = mm.config(M, N, K, f16)
        out.append(
            make_spec(
                mm._linear_kernel,
                variant,
                lin_types,
                {
                    "HAS_BIAS": True,
                    "PRECISION": mm.precision(f16),
                    "UPCAST": False,
                    **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                    **one_row(M),
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
        **int_args("M", "N", "K", "sxm", "sxk", "swn", "swk", "sym"),
    }
    for variant, M in (("smollm2 decode 1x576->1536", 1), ("smollm2 prefill 128x576->1536", 128)):
        c = i8.config(M, 1536, 576, f16)
        out.append(
            make_spec(
                i8._linear_int8_kernel,
                variant,
                i8_types,
                {
                    "HAS_BIAS": False,
                    "PRECISION": i8.precision(f16),
                    "UPCAST": False,
                    **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")},
                    **one_row(M),
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
        **int_args(*att_strides, "H", "GROUP", "Tq", "Tk", "D", "WINDOW"),
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
            make_spec(
                att._attention_kernel,
                variant,
                att_types,
                {
                    "CAUSAL": causal,
                    "SLIDING": False,
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

    # decode attention over the KV cache, in one launch (triton_decode_attention.merges_in_launch): the splits merged by
    # the last program (OUT_MODE MERGE) or one split written straight out (DIRECT) at the models' shapes: SmolLM2
    # (9 query / 3 key-value heads: the grouped kernel), Whisper tiny (6 heads, self over its 448 positions and cross
    # over 1500 encoder states: the per-head kernel), Llama-3.2-1B (32 / 8, d64), large-v3-turbo (20 heads, d64),
    # head dim 128; and the two-launch path (partials, then _decode_reduce_kernel) at SmolLM2's batch 8
    dec_common = {
        **{p: "*fp16" for p in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")},
        "len_ptr": "*i32",
        "po_ptr": "*fp32",
        "plse_ptr": "*fp32",
        "cnt_ptr": "*i32",
        **int_args("sqb", "sqh", "skb", "skh", "skt", "svb", "svh", "svt", "sob", "soh"),
        **int_args("GROUP", "Tk", "D", "SPLIT_LEN", "NUM_SPLITS", "WINDOW"),
        "qk_scale": "fp32",
    }
    dec_aligned = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "len_ptr", "po_ptr", "plse_ptr", "cnt_ptr", "D", "SPLIT_LEN")
    dec_aligned += ("sqb", "sqh", "skb", "skh", "skt", "svb", "svh", "svt", "sob", "soh")
    for variant, B, H, Hkv, Tk, D, lens, one in (
        ("smollm2 B=1 9/3 heads cache 2048 d64 +lengths", 1, 9, 3, 2048, 64, True, True),
        ("smollm2 B=8 9/3 heads cache 2048 d64 +lengths", 8, 9, 3, 2048, 64, True, True),
        ("smollm2 B=8 9/3 heads cache 2048 d64 +lengths two-launch", 8, 9, 3, 2048, 64, True, False),
        ("whisper tiny self B=1 6 heads cache 448 d64 +lengths", 1, 6, 6, 448, 64, True, True),
        ("whisper tiny cross B=5 6 heads 1500 d64", 5, 6, 6, 1500, 64, False, True),
        ("whisper tiny cross B=64 6 heads 1500 d64", 64, 6, 6, 1500, 64, False, True),
        ("llama-1b B=1 32/8 heads cache 4096 d64 +lengths", 1, 32, 8, 4096, 64, True, True),
        ("llama-1b B=64 32/8 heads cache 4096 d64 +lengths", 64, 32, 8, 4096, 64, True, True),
        ("large-v3-turbo cross B=1 20 heads 1500 d64", 1, 20, 20, 1500, 64, False, True),
        ("B=4 32/8 heads cache 4096 d128 +lengths", 4, 32, 8, 4096, 128, True, True),
        ("B=4 16 heads cache 4096 d128 +lengths", 4, 16, 16, 4096, 128, True, True),
    ):
        group = H // Hkv
        c = dec.config(B * Hkv, Tk, D, group, target=2 * (304 if hip else 132))  # an MI300X's CUs, an H100's SMs
        mode = dec.PARTIALS if not one else dec.DIRECT if c["NUM_SPLITS"] == 1 else dec.MERGE
        variant += {dec.PARTIALS: "", dec.DIRECT: " (one split)", dec.MERGE: f" ({c['NUM_SPLITS']} splits merged)"}[
            mode
        ]
        block_s = max(2, 1 << (c["NUM_SPLITS"] - 1).bit_length())
        flags = {
            "HAS_LENS": lens,
            "OUT_MODE": mode,
            "BLOCK_S": block_s,
            "BLOCK_N": c["BLOCK_N"],
            "BLOCK_D": c["BLOCK_D"],
        }
        if group > 1:
            flags.update(PRECISION=dec.precision(f16), UPCAST=False, BLOCK_G=c["BLOCK_G"])
            fn, types, mm_ = dec._decode_attention_grouped_kernel, {**dec_common, "HKV": "i32"}, True
        else:
            fn, types, mm_ = dec._decode_attention_kernel, {**dec_common, "H": "i32"}, False
        capped = mode == dec.MERGE and not hip  # merged in the launch: NVIDIA caps its registers, as launched
        out.append(make_spec(fn, variant, types, flags, c, dec_aligned, matmul=mm_, capped=capped))
        if mode == dec.PARTIALS:
            out.append(
                make_spec(
                    dec._decode_reduce_kernel,
                    variant,
                    {
                        "po_ptr": "*fp32",
                        "plse_ptr": "*fp32",
                        "o_ptr": "*fp16",
                        **int_args("H", "D", "sob", "soh", "NUM_SPLITS"),
                    },
                    {"BLOCK_S": block_s, "BLOCK_D": c["BLOCK_D"]},
                    {"num_warps": 2},
                    ("po_ptr", "plse_ptr", "o_ptr", "D", "sob", "soh"),
                )
            )
    return out
