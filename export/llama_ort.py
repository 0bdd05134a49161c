"""The Llama graph's decoder layers in variant 'ort' (ONNX Runtime's fast path): SkipSimplifiedLayerNormalization
(residual add + RMSNorm) and GroupQueryAttention with the rotary embedding inside it over the slot-addressed KV
cache, whose past_* inputs are bound to the same buffers as the present_* outputs (see llama_onnx)."""

from __future__ import annotations

from .graph_builder import MS
from .llama_standard import post_norm


def head_norms(graph, qkv: str, i: int) -> list[str]:
    """Qwen3: packed Q/K/V -> [q, k, v] with RMSNorm over each head of Q and of K (GroupQueryAttention's inputs
    [B, T, H * D], [B, T, Hkv * D], [B, T, Hkv * D]; the rotary comes after, inside it)."""
    cfg, g, t = graph.cfg, graph.g, f"layers.{i}"
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = graph.split_qkv(qkv, i)
    flat = g.const_i64("shape_flat_heads", [0, 0, -1])
    out = []
    for x, n, name in ((q, H, "q_norm"), (k, Hkv, "k_norm")):
        heads = g.op("Reshape", [x, g.const_i64(f"shape_heads_{n}", [0, 0, n, D])], name=f"{t}/{name}/heads")
        y = g.op(
            "SimplifiedLayerNormalization",
            [heads, graph.norm_weight(f"{t}.{name}")],
            name=f"{t}/{name}",
            epsilon=cfg.norm_eps,
            axis=-1,
        )
        out.append(g.op("Reshape", [y, flat], name=f"{t}/{name}/flat"))
    return out + [v]


def ort_layers(graph, h: str) -> tuple[str, str]:
    """Every decoder layer of LlamaGraph `graph` on the embeddings `h` -> (the last MLP's output, the residual
    stream before it): the final norm adds them."""
    cfg, g = graph.cfg, graph.g
    res = None
    for i in range(cfg.n_layers):
        an = graph.norm_weight(f"layers.{i}.attn_norm")
        if res is None:
            x, res = (
                g.op(
                    "SimplifiedLayerNormalization",
                    [h, an],
                    name=f"layers.{i}/attn_norm",
                    epsilon=cfg.norm_eps,
                    axis=-1,
                ),
                h,
            )
        else:
            x, _, _, res = g.op(
                "SkipSimplifiedLayerNormalization",
                [h, res, an],
                n_out=4,
                name=f"layers.{i}/attn_norm",
                domain=MS,
                epsilon=cfg.norm_eps,
            )
        qkv = [graph.qkv(x, i), "", ""]  # packed; Q/K norms (Qwen3) need them apart
        if cfg.qk_norm:
            qkv = head_norms(graph, qkv[0], i)
        a = g.op(
            "GroupQueryAttention",
            [
                *qkv,
                f"past_key.{i}",
                f"past_value.{i}",
                "seqlens_k",
                "total_sequence_length",
                *graph.rope(i),
            ],
            outputs=[f"layers.{i}/attn", f"present_key.{i}", f"present_value.{i}"],
            name=f"layers.{i}/gqa",
            domain=MS,
            num_heads=cfg.n_heads,
            kv_num_heads=cfg.n_kv_heads,
            do_rotary=1,
            rotary_interleaved=0,
            # a sliding window of W positions: the query's own and W - 1 before it
            **({"local_window_size": cfg.window(i)} if cfg.window(i) else {}),
        )
        o = post_norm(graph, graph.linear(a, [f"layers.{i}.wo"], f"layers.{i}.wo"), i, "post_attn_norm")
        x, _, _, res = g.op(
            "SkipSimplifiedLayerNormalization",
            [o, res, graph.norm_weight(f"layers.{i}.ffn_norm")],
            n_out=4,
            name=f"layers.{i}/ffn_norm",
            domain=MS,
            epsilon=cfg.norm_eps,
        )
        h = post_norm(graph, graph.mlp(x, i), i, "post_ffn_norm")
        if graph.progress:
            graph.progress(1)
    return h, res
