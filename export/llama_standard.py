"""The Llama graph's decoder layers in variant 'standard' (plain ONNX ops, for TensorRT and any runtime): RMSNorm,
rotary embedding and grouped-query attention written out; the caller passes the past keys, position ids and an
additive attention bias, and the graph returns the keys with the new ones appended (see llama_onnx)."""

from __future__ import annotations

import numpy as np


def rms(graph, x: str, weight: str, tag: str) -> str:
    """RMSNorm of x over its last axis, times `weight`."""
    g = graph.g
    eps = g.init(f"{tag}.eps", np.array(graph.cfg.norm_eps, graph.fdt))
    ms = g.op("ReduceMean", [g.op("Mul", [x, x], name=f"{tag}/sq")], name=f"{tag}/mean", axes=[-1], keepdims=1)
    inv = g.op(
        "Reciprocal",
        [g.op("Sqrt", [g.op("Add", [ms, eps], name=f"{tag}/eps")], name=f"{tag}/sqrt")],
        name=f"{tag}/inv",
    )
    return g.op("Mul", [g.op("Mul", [x, inv], name=f"{tag}/scale"), weight], name=tag)


def post_norm(graph, x: str, i: int, name: str) -> str:
    """Gemma 3's norm of layer i's attention or MLP output (post_attn_norm / post_ffn_norm), or x where there is none;
    ONNX Runtime's fused op in the 'ort' variant."""
    if not graph.cfg.post_norms:
        return x
    w = graph.norm_weight(f"layers.{i}.{name}")
    if graph.variant == "standard":
        return rms(graph, x, w, f"layers.{i}/{name}")
    return graph.g.op(
        "SimplifiedLayerNormalization", [x, w], name=f"layers.{i}/{name}", epsilon=graph.cfg.norm_eps, axis=-1
    )


def gelu_tanh(graph, x: str, tag: str) -> str:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GELU with the tanh approximation (Gemma's MLP)."""
    g = graph.g

    def c(name, v):
        return g.init(f"gelu.{name}", np.array(v, graph.fdt))

    x3 = g.op("Mul", [g.op("Mul", [x, x], name=f"{tag}/x2"), x], name=f"{tag}/x3")
    inner = g.op("Add", [x, g.op("Mul", [x3, c("k", 0.044715)], name=f"{tag}/kx3")], name=f"{tag}/inner")
    t = g.op("Tanh", [g.op("Mul", [inner, c("s", (2 / np.pi) ** 0.5)], name=f"{tag}/u")], name=f"{tag}/tanh")
    half = g.op("Mul", [x, c("half", 0.5)], name=f"{tag}/half")
    return g.op("Mul", [half, g.op("Add", [t, c("one", 1.0)], name=f"{tag}/1p")], name=tag)


def rotary(graph, x: str, cos: str, sin: str, tag: str) -> str:
    """x [B, n, T, D] rotated by cos/sin [B, 1, T, D/2] (half-split pairs, as models/llama.py)."""
    g, D = graph.g, graph.cfg.head_dim
    x1, x2 = g.op("Split", [x, g.const_i64(f"{tag}.split", [D // 2, D // 2])], n_out=2, name=f"{tag}/split", axis=-1)
    a = g.op(
        "Sub", [g.op("Mul", [x1, cos], name=f"{tag}/m1"), g.op("Mul", [x2, sin], name=f"{tag}/m2")], name=f"{tag}/a"
    )
    b = g.op(
        "Add", [g.op("Mul", [x2, cos], name=f"{tag}/m3"), g.op("Mul", [x1, sin], name=f"{tag}/m4")], name=f"{tag}/b"
    )
    return g.op("Concat", [a, b], name=tag, axis=-1)


def standard_layers(graph, h: str) -> tuple[str, str]:
    """Every decoder layer of LlamaGraph `graph` on the embeddings `h` -> (the last MLP's output, the residual
    stream before it): the final norm adds them."""
    cfg, g = graph.cfg, graph.g
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    shape_q = g.const_i64("shape_q", [0, 0, H, D])
    shape_kv = g.const_i64("shape_kv", [0, 0, Hkv, D])
    shape_grp = g.const_i64("shape_grp", [0, Hkv, H // Hkv, -1, D])  # [B, Hkv, G, T, D]
    shape_out = g.const_i64("shape_out", [0, 0, H * D])
    unsq = g.const_i64("axes_1", [1])
    unsq2 = g.const_i64("axes_2", [2])
    ropes = {}  # table name -> its rows at position_ids [B, 1, T, D/2]
    for name in {n for i in range(cfg.n_layers) for n in graph.rope(i)}:
        rows = g.op("Gather", [name, "position_ids"], name=f"rope/{name}")
        ropes[name] = g.op("Unsqueeze", [rows, unsq], name=f"rope/{name}4")
    bias = g.op("Unsqueeze", ["attention_bias", unsq2], name="attn/bias5")  # [B, 1, 1, T, S]
    if cfg.sliding_layers:  # (the caller's: keys before each query's window masked too)
        bias_local = g.op("Unsqueeze", ["attention_bias_local", unsq2], name="attn/bias5_local")
    scale = g.init("attn.scale", np.array(1.0 / np.sqrt(D), graph.fdt))
    res = None
    for i in range(cfg.n_layers):
        t = f"layers.{i}"
        res = h if res is None else g.op("Add", [h, res], name=f"{t}/res_attn")
        x = rms(graph, res, graph.norm_weight(f"{t}.attn_norm"), f"{t}/attn_norm")
        qkv = graph.qkv(x, i)
        q, k, v = graph.split_qkv(qkv, i)
        q, k = g.op("Reshape", [q, shape_q], name=f"{t}/q4"), g.op("Reshape", [k, shape_kv], name=f"{t}/k4")
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head of Q and K, before the rotary
            q = rms(graph, q, graph.norm_weight(f"{t}.q_norm"), f"{t}/q_norm")
            k = rms(graph, k, graph.norm_weight(f"{t}.k_norm"), f"{t}/k_norm")
        q = g.op("Transpose", [q], name=f"{t}/qT", perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], name=f"{t}/kT", perm=[0, 2, 1, 3])
        v = g.op("Transpose", [g.op("Reshape", [v, shape_kv], name=f"{t}/v4")], name=f"{t}/vT", perm=[0, 2, 1, 3])
        cos, sin = (ropes[n] for n in graph.rope(i))
        q, k = rotary(graph, q, cos, sin, f"{t}/rope_q"), rotary(graph, k, cos, sin, f"{t}/rope_k")
        kall = g.op("Concat", [f"past_key.{i}", k], outputs=[f"present_key.{i}"], name=f"{t}/kcat", axis=2)
        vall = g.op("Concat", [f"past_value.{i}", v], outputs=[f"present_value.{i}"], name=f"{t}/vcat", axis=2)
        qg = g.op("Reshape", [q, shape_grp], name=f"{t}/qgrp")  # [B, Hkv, G, T, D]
        kt = g.op("Unsqueeze", [g.op("Transpose", [kall], name=f"{t}/kTT", perm=[0, 1, 3, 2]), unsq2], name=f"{t}/k5")
        s = g.op(
            "Add",
            [
                g.op("Mul", [g.op("MatMul", [qg, kt], name=f"{t}/qk"), scale], name=f"{t}/scaled"),
                bias_local if i in cfg.sliding_layers else bias,
            ],
            name=f"{t}/masked",
        )
        p = g.op("Softmax", [s], name=f"{t}/softmax", axis=-1)
        o = g.op("MatMul", [p, g.op("Unsqueeze", [vall, unsq2], name=f"{t}/v5")], name=f"{t}/pv")  # [B,Hkv,G,T,D]
        o = g.op(
            "Reshape",
            [
                g.op(
                    "Transpose",
                    [g.op("Reshape", [o, g.const_i64(f"{t}.shape_h", [0, H, -1, D])], name=f"{t}/o4")],
                    name=f"{t}/oT",
                    perm=[0, 2, 1, 3],
                ),
                shape_out,
            ],
            name=f"{t}/o3",
        )
        o = post_norm(graph, graph.linear(o, [f"{t}.wo"], f"{t}.wo"), i, "post_attn_norm")
        res = g.op("Add", [o, res], name=f"{t}/res_mlp")
        x = rms(graph, res, graph.norm_weight(f"{t}.ffn_norm"), f"{t}/ffn_norm")
        h = post_norm(graph, graph.mlp(x, i), i, "post_ffn_norm")
        if graph.progress:
            graph.progress(1)
    return h, res
