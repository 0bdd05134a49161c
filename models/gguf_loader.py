"""GGUF (llama.cpp's file format) -> a Llama config, float32 weights, tokenizer spec and chat template.

Reading and dequantizing go through the `gguf` package (`GGUFReader`, `gguf.quants.dequantize`), so
every block type it implements is accepted: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants
(Q2_K..Q6_K), the IQ types, and the ternary / FP4 types of recent versions. Weights come out as float32
and the model casts / requantizes them for the device it runs on.

llama.cpp's converter stores the Q and K projection rows permuted so that its rotary embedding can work
on interleaved (even, odd) pairs; the model here uses the half-split ("NeoX") layout of Hugging Face, so
the permutation is undone on load — exactly what transformers does, which lets the two agree bit for bit.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
import torch

from .lm_file import LazyWeights, LMFile
from .registry import ModelError

# GGUF architectures (general.architecture) that models/llama.py runs -> how llama.cpp's converter wrote them:
# `permuted` Q/K rows (its LlamaModel.permute, for the interleaved rotary; the others use the NeoX rotary and
# keep transformers' rows), and the config switches of the architecture (models.llama.LlamaConfig).
# Granite (embedding / residual / logit multipliers) and SmolLM3 (layers without rotary) are not this graph.
GGUF_ARCHS: dict[str, dict] = {
    "llama": {"permuted": True},  # Llama 1-3.x, SmolLM2, Mistral 7B (llama.cpp writes Mistral as 'llama')
    "mistral": {"permuted": True},
    "qwen2": {"permuted": False, "qkv_bias": True},
    "qwen3": {"permuted": False, "qk_norm": True},
    "phi3": {"permuted": False},  # fused attn_qkv and ffn_up (gate then up), split here
    "gemma3": {"permuted": False, "qk_norm": True, "gemma": True},  # norms stored as 1 + w (its converter adds 1)
}
LLAMA_ARCHS = tuple(GGUF_ARCHS)


def _supported_types() -> dict[str, gguf.GGMLQuantizationType]:  # noqa: F821
    import gguf
    from gguf import quants

    T = gguf.GGMLQuantizationType
    ok = {"F32": T.F32, "F16": T.F16}
    for name in dir(quants):
        t = getattr(T, name, None)
        if t is not None and isinstance(getattr(quants, name), type):
            ok[name] = t
    return ok


class _PlainNumpy:
    """numpy, except that `memmap` returns a plain ndarray view of the map. GGUFReader slices its memmap
    once per metadata item (~100k for a 49k-token vocabulary), and the np.memmap subclass hooks on each
    slice make that about half of its time; the plain view maps the same bytes."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def memmap(*a, **kw):
        return np.memmap(*a, **kw).view(np.ndarray)


_reader_lock = threading.Lock()


def open_reader(path: Path):
    """-> the file's header (gguf_header.GGUFHeader: metadata as Python values, tensors as views of a memory
    map); files gguf_header does not read (byte-swapped, other versions) through gguf's GGUFReader."""
    import struct

    from . import gguf_header

    try:
        try:
            return gguf_header.read(path)
        except gguf_header.Unsupported:
            return read_with_gguf(path)
    except (ValueError, IndexError, KeyError, OSError, TypeError, AssertionError, struct.error) as e:
        raise ModelError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); "
            "expected a GGUF v2/v3 file as written by llama.cpp's converters"
        ) from None


def read_with_gguf(path: Path):
    """The same header through gguf's GGUFReader (the reference the fast reader is tested against)."""
    import gguf
    import gguf.gguf_reader as gr

    from .gguf_header import GGUFHeader

    with _reader_lock:
        gr.np = _PlainNumpy()
        try:
            reader = gguf.GGUFReader(str(path), "r")
        finally:
            gr.np = np
    out = {}
    for k, f in reader.fields.items():
        if k.startswith("GGUF."):
            continue
        try:
            out[k] = f.contents()
        except Exception as e:  # a field the reader cannot decode is a broken file
            raise ModelError(f"GGUF metadata field {k!r} cannot be decoded: {e}") from None
    return GGUFHeader(int(reader.fields["GGUF.version"].contents()), out, list(reader.tensors))


def _unpermute(w, n_head: int):
    """Undo llama.cpp's Q/K row permutation: rows [n_head, D/2, 2] (interleaved pairs) -> [n_head, 2, D/2]. `w`: a
    torch tensor or a numpy array."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t, ok: dict) -> torch.Tensor:
    """One GGUF tensor -> float32 torch tensor in PyTorch (row-major, [out, in]) order."""
    from gguf import quants

    name = t.tensor_type.name
    if name not in ok:
        raise ModelError(
            f"tensor {t.name!r} has GGUF type {name}, which this loader cannot dequantize; "
            f"supported types: {', '.join(sorted(ok))}"
        )
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists ne0 (the contiguous dim) first
    try:
        arr = _dequantize_whole(t) if name in _BLOCK_TYPES else quants.dequantize(t.data, t.tensor_type)
    except (ValueError, NotImplementedError, AssertionError) as e:
        raise ModelError(f"tensor {t.name!r} ({name}, shape {shape}) could not be dequantized: {e}") from None
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not arr.flags.writeable:  # F32 tensors come back as views of the read-only memory map
        arr = arr.copy()
    if arr.size != int(np.prod(shape)):
        raise ModelError(f"tensor {t.name!r}: {arr.size} values for shape {shape}; the file is truncated or corrupt")
    return torch.from_numpy(arr.reshape(shape))


_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def _dequantize_whole(t) -> np.ndarray:
    """gguf's own block formulas (quants.<type>.dequantize_rows) over the whole tensor at once: the same float32
    values as quants.dequantize, which splits a tensor into groups of rows in a Python loop (3x slower)."""
    from gguf import quants

    raw = np.asarray(t.data)
    if t.tensor_type.name == "Q8_0":  # (a tied output head's usual type) the same product, 4x faster in one pass
        blocks = raw.reshape(-1, 34)
        d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32)
        return np.multiply(np.ascontiguousarray(blocks[:, 2:]).view(np.int8), d, dtype=np.float32).reshape(-1)
    return quants._type_traits[t.tensor_type].dequantize_rows(raw)


def _q4_blocks(t, shape, heads: int | None = None):
    """Q4_0 / Q4_1 tensor -> (q, scale, zero) per 32-weight block, without rounding anything:
    Q4_0 block = f16 d, 16 bytes of nibbles, w = d * (q - 8)      -> scale d, zero 0
    Q4_1 block = f16 d, f16 m, 16 bytes of nibbles, w = d * q + m -> scale d, zero m + 8 d
    Nibble j of a block's bytes holds weight j (low half) and weight j + 16 (high half). `heads`: Q/K rows
    un-permuted (_unpermute; the blocks' rows move with them), in numpy: torch's two-thread copies wait out any
    other process holding a core."""
    N, K = shape
    name = t.tensor_type.name
    head = 2 if name == "Q4_0" else 4
    raw = np.asarray(t.data, dtype=np.uint8).reshape(N, K // 32, head + 16)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = raw[..., head:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(N, K)
    if name == "Q4_0":
        zero = np.zeros_like(d)
    else:
        zero = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d
    if heads:
        q, d, zero = (_unpermute(x, heads) for x in (q, d, zero))
    return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, d, zero))


def _q4k_blocks(t, shape, heads: int | None = None):
    """Q4_K tensor -> (q, scale, zero) per 32-weight sub-block, as _q4_blocks gives them. A Q4_K super-block of 256
    weights (144 bytes): f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of nibbles (each 32
    bytes hold sub-block 2j in their low halves, 2j + 1 in their high halves); w = d * sc * q - dmin * m
    -> scale d * sc, zero 8 d sc - dmin m (gguf's quants.Q4_K formula, in float32)."""
    N, K = shape
    raw = np.asarray(t.data, dtype=np.uint8).reshape(N, K // 256, 144)
    d = raw[..., 0:2].copy().view(np.float16).astype(np.float32)  # [N, nb, 1]
    dmin = raw[..., 2:4].copy().view(np.float16).astype(np.float32)
    sc8 = raw[..., 4:16].astype(np.uint8)
    lo, hi = sc8[..., :8], sc8[..., 8:]  # (get_scale_min_k4): j < 4 from bytes j, j + 4; j >= 4 from all three
    sc = np.concatenate([lo[..., :4] & 63, (hi & 15) | ((lo[..., :4] >> 6) << 4)], axis=-1).astype(np.float32)
    m = np.concatenate([lo[..., 4:] & 63, (hi >> 4) | ((lo[..., 4:] >> 6) << 4)], axis=-1).astype(np.float32)
    qs = raw[..., 16:].reshape(N, K // 256, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(N, K)  # [N, nb, 4 pairs, 2, 32]
    scale = (d * sc).reshape(N, K // 32)
    zero = (8 * d * sc - dmin * m).reshape(N, K // 32)
    if heads:
        q, scale, zero = (_unpermute(x, heads) for x in (q, scale, zero))
    return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, scale, zero))


Q4_BLOCKS = {"Q4_0": _q4_blocks, "Q4_1": _q4_blocks, "Q4_K": _q4k_blocks}  # 4-bit types the int4 runners keep


def _float_weight(t, ok: dict, heads: int | None) -> torch.Tensor:
    w = _dequantize(t, ok)
    return _unpermute(w, heads) if heads else w


def _num(md: dict, key: str, default=None, cast=int):
    if key in md:
        return cast(md[key])
    if default is None:
        raise ModelError(f"GGUF metadata is missing {key!r}, needed to build the model")
    return default


def _config(md: dict, tensors: dict, path: Path):
    """The model config of a GGUF's metadata (its architecture checked against GGUF_ARCHS)."""
    from .llama import LlamaConfig, RopeScaling

    a = md.get("general.architecture")
    if a not in GGUF_ARCHS:
        raise ModelError(
            f"{path}: GGUF architecture {a!r} is not supported by the Llama model; "
            f"supported architectures: {', '.join(GGUF_ARCHS)}"
        )
    n_heads = _num(md, f"{a}.attention.head_count")
    dim = _num(md, f"{a}.embedding_length")
    vocab = _num(md, f"{a}.vocab_size", len(md.get("tokenizer.ggml.tokens", [])) or None)
    head_dim = _num(md, f"{a}.attention.key_length", dim // n_heads)
    rope_dim = _num(md, f"{a}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ModelError(
            f"{path}: partial rotary (rope.dimension_count={rope_dim}, head dim {head_dim}) is not supported"
        )
    stype = md.get(f"{a}.rope.scaling.type", "none")
    scaling = None
    if stype == "linear":
        scaling = RopeScaling("linear", float(md[f"{a}.rope.scaling.factor"]))
    elif stype not in ("none", "", None):
        raise ModelError(
            f"{path}: rope scaling type {stype!r} is not supported; supported: none, linear, "
            "and per-frequency factors (rope_freqs.weight, as Llama 3.1 files carry)"
        )
    if "rope_factors_long.weight" in tensors or f"{a}.rope.scaling.attn_factor" in md:
        raise ModelError(
            f"{path}: long-context rope scaling (Phi-3 128k / Phi-3.5 'longrope': rope_factors_long / _short) "
            "is not supported; supported: none, linear, per-frequency factors (rope_freqs.weight)"
        )
    max_seq = _num(md, f"{a}.context_length", 2048)
    window = _num(md, f"{a}.attention.sliding_window", 0)
    gemma = _gemma_switches(md, a, window, dim) if GGUF_ARCHS[a].get("gemma") else {}
    if window > 0 and not gemma:  # attention over the last `window` positions is full attention while sequences fit
        max_seq = min(max_seq, window)
    return LlamaConfig(
        **gemma,
        vocab_size=vocab,
        dim=dim,
        n_layers=_num(md, f"{a}.block_count"),
        n_heads=n_heads,
        n_kv_heads=_num(md, f"{a}.attention.head_count_kv", n_heads),
        hidden_dim=_num(md, f"{a}.feed_forward_length"),
        head_dim=head_dim,
        norm_eps=_num(md, f"{a}.attention.layer_norm_rms_epsilon", cast=float),
        rope_theta=_num(md, f"{a}.rope.freq_base", 10000.0, cast=float),
        rope_scaling=scaling,
        max_seq_len=max_seq,
        tie_embeddings="output.weight" not in tensors,
        qkv_bias=GGUF_ARCHS[a].get("qkv_bias", False),
        qk_norm=GGUF_ARCHS[a].get("qk_norm", False),
        arch=a,
    )


def _gemma_switches(md: dict, a: str, window: int, dim: int) -> dict:
    """Gemma 3's config switches as llama.cpp sets them (its files do not say): every sixth layer global, the
    others over a window with rotary base 10000; GeGLU, the embedding scale, the post norms."""
    n = _num(md, f"{a}.block_count")
    return dict(
        act="gelu_tanh",
        embed_scale=float(dim) ** 0.5,
        post_norms=True,
        sliding_window=window,
        sliding_layers=tuple(i for i in range(n) if (i + 1) % 6) if window else (),
        rope_local_theta=10000.0,
        final_softcap=_num(md, f"{a}.final_logit_softcapping", 0.0, cast=float),
    )


_NAMES = {
    "token_embd.weight": "tok_embeddings",
    "output_norm.weight": "norm",
    "output.weight": "output",
    "rope_freqs.weight": "rope_freqs",
}
_PER_LAYER = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_qkv.weight": "wqkv",  # Phi-3: split by lm_file.split_fused
    "attn_output.weight": "wo",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",  # Phi-3's holds gate and up: renamed w_gate_up below
    "ffn_down.weight": "w_down",
    "post_attention_norm.weight": "post_attn_norm",  # Gemma 3 (its ffn_norm is the MLP's input norm)
    "post_ffw_norm.weight": "post_ffn_norm",
}


def _key(tname: str, path: Path, cfg) -> str:
    """A GGUF tensor's name in models/llama.py, or a ModelError for one the architecture does not have."""
    from .llama import layer_tensors

    if tname in _NAMES:
        return _NAMES[tname]
    if tname.startswith("blk."):
        _, i, rest = tname.split(".", 2)
        ours = set(layer_tensors(cfg)) | {"wqkv"}
        known = sorted(k for k, v in _PER_LAYER.items() if v in ours)
        if _PER_LAYER.get(rest) in ours:
            return f"layers.{i}.{_PER_LAYER[rest]}"
        raise ModelError(
            f"{path}: tensor {tname!r} is not part of the Llama architecture as GGUF arch {cfg.arch!r} "
            f"has it (layer tensors: {', '.join(known)})"
        )
    raise ModelError(f"{path}: unexpected tensor {tname!r} for a Llama-family model")


def load(path: str | Path, keep_layers: int | None = None) -> LMFile:
    """Read a Llama-family GGUF file. `keep_layers` loads only the first N blocks (for tests of the loader)."""
    from . import chat_templates
    from .llama import RopeScaling
    from .lm_file import check_layer_tensors, fold_gemma, split_fused
    from .lm_text import LMTokenizer

    path = Path(path)
    reader = open_reader(path)
    md = reader.metadata
    tensors = {t.name: t for t in reader.tensors}
    cfg = _config(md, tensors, path)
    permuted = GGUF_ARCHS[cfg.arch]["permuted"]
    n_layers = cfg.n_layers if keep_layers is None else min(keep_layers, cfg.n_layers)
    if keep_layers is not None:
        cfg = cfg.replace(n_layers=n_layers)

    ok = _supported_types()
    weights = LazyWeights()
    q4s: dict[str, tuple] = {}
    types: dict[str, int] = {}
    for tname, t in tensors.items():
        key = _key(tname, path, cfg)
        if key.startswith("layers.") and int(key.split(".")[1]) >= n_layers:
            continue
        if key.endswith(".w_up") and f"blk.{key.split('.')[1]}.ffn_gate.weight" not in tensors:
            key = key[: -len("w_up")] + "w_gate_up"  # Phi-3: one [2 * hidden, dim] tensor, gate rows first
        heads = None  # rows llama.cpp permuted
        if permuted and key.endswith((".wq", ".wk", ".bq", ".bk")):
            heads = cfg.n_heads if key.endswith(("wq", "bq")) else cfg.n_kv_heads
        shape = tuple(int(d) for d in reversed(t.shape))
        if t.tensor_type.name in Q4_BLOCKS and key.startswith("layers.") and len(shape) == 2:
            # (the embedding is gathered from, and the head stays int8): the blocks as they are, the float
            # weights made on first read
            q4s[key] = Q4_BLOCKS[t.tensor_type.name](t, shape, heads)
            weights.later(key, functools.partial(_float_weight, t, ok, heads))
        else:
            weights[key] = _float_weight(t, ok, heads)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    split_fused(weights, cfg, q4s)
    check_layer_tensors(weights, cfg, path)
    if GGUF_ARCHS[cfg.arch].get("gemma"):  # llama.cpp scales Gemma 3 27B's scores by dim / heads, the others' by D
        fold_gemma(
            weights, cfg, plus_one=False, query_scalar=cfg.dim / cfg.n_heads if cfg.n_layers == 62 else cfg.head_dim
        )
    if "rope_freqs" in weights:
        cfg = cfg.replace(
            rope_scaling=RopeScaling("freq_factors", 1.0, freq_factors=tuple(weights.pop("rope_freqs").tolist()))
        )
    tok = LMTokenizer.from_gguf_metadata(md, path)
    template = md.get("tokenizer.chat_template") or chat_templates.BY_GGUF_ARCH.get(cfg.arch)
    return LMFile(cfg, weights, tok, template, str(path), types, q4s)
