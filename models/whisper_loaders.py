"""Whisper weight loaders: CTranslate2 `model.bin` (parsed here with numpy), Hugging Face directories
(`config.json` + `*.safetensors`) and openai-whisper `.pt` checkpoints, all mapped to the internal names
of models/whisper.py (fused self-attention qkv, fused cross-attention kv)."""

from __future__ import annotations

import bisect
import json
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .registry import ModelError, ResolvedModel, ct2_weight_files
from .whisper import WhisperConfig
from .whisper_tokenizer import tokenizer_from_vocabulary

# CTranslate2's DataType enum order (include/ctranslate2/types.h)
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


@dataclass
class WhisperWeights:
    config: WhisperConfig
    state: dict[str, torch.Tensor]  # internal names
    tokenizer_path: Path | None
    alignment_heads: list[tuple[int, int]] = field(default_factory=list)


class JoinedBytes:
    """Files read as one byte string without writing them joined: a memory map of each; a slice inside one
    file is a view of its map, a slice across a boundary (a variable split between two parts) is copied."""

    def __init__(self, paths):
        self.paths = [Path(p) for p in paths]
        self.maps, self.starts, total = [], [], 0
        for p in self.paths:
            with open(p, "rb") as f:
                size = f.seek(0, 2)
                self.maps.append(
                    memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else memoryview(b"")
                )
            self.starts.append(total)
            total += size
        self.size = total

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice):
        start, stop = max(s.start or 0, 0), min(self.size if s.stop is None else s.stop, self.size)
        if stop <= start:
            return b""
        i = bisect.bisect_right(self.starts, start) - 1
        lo = start - self.starts[i]
        if stop - self.starts[i] <= len(self.maps[i]):
            return self.maps[i][lo : lo + stop - start]
        pieces = []
        while start < stop:  # across one or more boundaries
            while start - self.starts[i] >= len(self.maps[i]):
                i += 1
            lo = start - self.starts[i]
            piece = self.maps[i][lo : lo + stop - start]
            pieces.append(piece)
            start += len(piece)
        return b"".join(pieces)


def read_ct2(path) -> tuple[str, int, dict[str, np.ndarray]]:
    """Parse a CTranslate2 model.bin -> (spec name, revision, {name: array}), aliases resolved and int8
    weights dequantized with their `weight_scale`. `path`: the file, or a list of the files it is split
    into (read in order as one stream, not joined on disk). Raises ModelError on a malformed or truncated
    file."""
    parts = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    path = parts[0] if len(parts) == 1 else f"{parts[0]} (+{len(parts) - 1} parts)"
    buf = JoinedBytes(parts)
    off = 0

    def take(fmt):
        nonlocal off
        size = struct.calcsize(fmt)
        if off + size > len(buf):
            raise ModelError(f"{path}: truncated CTranslate2 model file (ended at byte {off} of a field)")
        v = struct.unpack(fmt, buf[off : off + size])
        off += size
        return v[0]

    def string():
        nonlocal off
        n = take("<H")
        if off + n > len(buf) or n == 0:
            raise ModelError(f"{path}: truncated or malformed CTranslate2 model file (string at byte {off})")
        s = bytes(buf[off : off + n - 1]).decode("utf-8", errors="replace")
        off += n
        return s

    version = take("<I")
    if not 1 <= version <= 6:
        raise ModelError(f"{path}: not a CTranslate2 model file (binary version {version}; supported 1-6)")
    name = string() if version >= 2 else ""
    revision = take("<I") if version >= 3 else 1
    count = take("<I")
    arrays: dict[str, np.ndarray] = {}
    for _ in range(count):
        vname = string()
        rank = take("<B")
        dims = [take("<I") for _ in range(rank)]
        tid = take("<B")
        nbytes = take("<I")
        if tid not in _CT2_DTYPES:
            raise ModelError(f"{path}: variable {vname!r} has unsupported data type id {tid}")
        if off + nbytes > len(buf):
            raise ModelError(
                f"{path}: truncated CTranslate2 model file: variable {vname!r} needs {nbytes} bytes, "
                f"{len(buf) - off} remain"
            )
        raw = buf[off : off + nbytes]
        off += nbytes
        dt = _CT2_DTYPES[tid]
        if dt == "bfloat16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dt)
        arrays[vname] = a.reshape(dims) if dims else a.reshape(())
    if version >= 3 and off < len(buf):
        for _ in range(take("<I")):
            alias, target = string(), string()
            if target in arrays:
                arrays[alias] = arrays[target]
    for k in [k for k in arrays if k.endswith("weight_scale")]:
        w = k[: -len("_scale")]
        if w in arrays and arrays[w].dtype == np.int8:
            s = arrays[k].astype(np.float32)
            arrays[w] = arrays[w].astype(np.float32) / (s[:, None] if s.ndim == 1 else s)
    return name, revision, arrays


def _t(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32)) if isinstance(a, np.ndarray) else a.float()


def _count(keys, pattern) -> int:
    idx = {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}
    return max(idx) + 1 if idx else 0


def load_ct2(path: Path) -> WhisperWeights:
    path = Path(path)
    files = ct2_weight_files(path)
    if not files:
        raise ModelError(f"{path}: no model.bin (expected a CTranslate2 Whisper directory)")
    mb = files[0] if len(files) == 1 else path / "model.bin.part*"
    spec, _, a = read_ct2(files)
    if spec and spec != "WhisperSpec":
        raise ModelError(f"{mb}: a CTranslate2 {spec} model, not Whisper (WhisperSpec)")
    try:
        n_audio_layer = _count(a, r"encoder/layer_(\d+)/")
        n_text_layer = _count(a, r"decoder/layer_(\d+)/")
        d = a["encoder/conv1/weight"].shape[0]
        cfg = WhisperConfig(
            n_mels=a["encoder/conv1/weight"].shape[1],
            n_audio_ctx=a["encoder/position_encodings/encodings"].shape[0],
            n_audio_state=d,
            n_audio_head=int(a["encoder/num_heads"]),
            n_audio_layer=n_audio_layer,
            n_vocab=a["decoder/embeddings/weight"].shape[0],
            n_text_ctx=a["decoder/position_encodings/encodings"].shape[0],
            n_text_state=a["decoder/embeddings/weight"].shape[1],
            n_text_head=int(a["decoder/num_heads"]),
            n_text_layer=n_text_layer,
            n_audio_ffn=a["encoder/layer_0/ffn/linear_0/weight"].shape[0],
            n_text_ffn=a["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        )
        st = {
            "encoder.conv1.weight": a["encoder/conv1/weight"],
            "encoder.conv1.bias": a["encoder/conv1/bias"],
            "encoder.conv2.weight": a["encoder/conv2/weight"],
            "encoder.conv2.bias": a["encoder/conv2/bias"],
            "encoder.positional_embedding": a["encoder/position_encodings/encodings"],
            "encoder.ln_post.weight": a["encoder/layer_norm/gamma"],
            "encoder.ln_post.bias": a["encoder/layer_norm/beta"],
            "decoder.token_embedding.weight": a["decoder/embeddings/weight"],
            "decoder.positional_embedding": a["decoder/position_encodings/encodings"],
            "decoder.ln.weight": a["decoder/layer_norm/gamma"],
            "decoder.ln.bias": a["decoder/layer_norm/beta"],
        }

        def lin(dst, src):
            st[f"{dst}.weight"], st[f"{dst}.bias"] = a[f"{src}/weight"], a[f"{src}/bias"]

        def ln(dst, src):
            st[f"{dst}.weight"], st[f"{dst}.bias"] = a[f"{src}/gamma"], a[f"{src}/beta"]

        for side, n in (("encoder", n_audio_layer), ("decoder", n_text_layer)):
            for i in range(n):
                s, t = f"{side}/layer_{i}", f"{side}.blocks.{i}"
                ln(f"{t}.attn_ln", f"{s}/self_attention/layer_norm")
                lin(f"{t}.attn.qkv", f"{s}/self_attention/linear_0")
                lin(f"{t}.attn.out", f"{s}/self_attention/linear_1")
                ln(f"{t}.mlp_ln", f"{s}/ffn/layer_norm")
                lin(f"{t}.mlp.fc1", f"{s}/ffn/linear_0")
                lin(f"{t}.mlp.fc2", f"{s}/ffn/linear_1")
                if side == "decoder":
                    ln(f"{t}.cross_attn_ln", f"{s}/attention/layer_norm")
                    lin(f"{t}.cross_attn.q", f"{s}/attention/linear_0")
                    lin(f"{t}.cross_attn.kv", f"{s}/attention/linear_1")
                    lin(f"{t}.cross_attn.out", f"{s}/attention/linear_2")
    except KeyError as e:
        raise ModelError(f"{mb}: not a complete CTranslate2 Whisper model (missing variable {e})") from None
    extra = {}
    cj = path / "config.json"
    if cj.exists():
        extra = json.loads(cj.read_text())
    tok = path / "tokenizer.json"
    if not tok.exists():
        vocab = next((v for v in (path / "vocabulary.json", path / "vocabulary.txt") if v.exists()), None)
        tok = tokenizer_from_vocabulary(vocab) if vocab else None
    return WhisperWeights(
        cfg,
        {k: _t(v) for k, v in st.items()},
        tok,
        [tuple(h) for h in extra.get("alignment_heads", [])],
    )


def _fuse_qkv(st, prefix, q, k, v):
    """Concatenate separate q/k/v projections into `prefix.qkv` (k has no bias in Whisper)."""
    st[f"{prefix}.qkv.weight"] = torch.cat([q[0], k[0], v[0]])
    st[f"{prefix}.qkv.bias"] = torch.cat([q[1], torch.zeros_like(q[1]) if k[1] is None else k[1], v[1]])


def _map_separate(src: dict, cfg: WhisperConfig, names: dict) -> dict:
    """Map an unfused (openai or HF) state dict to internal names. `names` gives the source spellings."""
    g = lambda k: src[k].float()  # noqa: E731
    b = lambda k: src[k].float() if k in src else None  # noqa: E731
    st = {}
    for dst, s in names["top"].items():
        st[dst] = g(s)
    for side, n in (("encoder", cfg.n_audio_layer), ("decoder", cfg.n_text_layer)):
        for i in range(n):
            s, t = names["block"].format(side=side, i=i), f"{side}.blocks.{i}"
            att = names["attn"]
            for role, sa in (("attn", att["self"]), ("cross_attn", att["cross"])):
                if role == "cross_attn" and side == "encoder":
                    continue
                P = f"{s}.{sa}"
                q = (g(f"{P}.{att['q']}.weight"), g(f"{P}.{att['q']}.bias"))
                k = (g(f"{P}.{att['k']}.weight"), b(f"{P}.{att['k']}.bias"))
                v = (g(f"{P}.{att['v']}.weight"), g(f"{P}.{att['v']}.bias"))
                if role == "attn":
                    _fuse_qkv(st, f"{t}.attn", q, k, v)
                else:
                    st[f"{t}.cross_attn.q.weight"], st[f"{t}.cross_attn.q.bias"] = q
                    st[f"{t}.cross_attn.kv.weight"] = torch.cat([k[0], v[0]])
                    st[f"{t}.cross_attn.kv.bias"] = torch.cat([torch.zeros_like(v[1]) if k[1] is None else k[1], v[1]])
                st[f"{t}.{role}.out.weight"] = g(f"{P}.{att['o']}.weight")
                st[f"{t}.{role}.out.bias"] = g(f"{P}.{att['o']}.bias")
            for dst, sn in names["norms"].items():
                if dst == "cross_attn_ln" and side == "encoder":
                    continue
                st[f"{t}.{dst}.weight"], st[f"{t}.{dst}.bias"] = g(f"{s}.{sn}.weight"), g(f"{s}.{sn}.bias")
            for dst, sn in (("mlp.fc1", names["fc1"]), ("mlp.fc2", names["fc2"])):
                st[f"{t}.{dst}.weight"], st[f"{t}.{dst}.bias"] = g(f"{s}.{sn}.weight"), g(f"{s}.{sn}.bias")
    return st


_OPENAI_NAMES = {
    "top": {
        "encoder.conv1.weight": "encoder.conv1.weight",
        "encoder.conv1.bias": "encoder.conv1.bias",
        "encoder.conv2.weight": "encoder.conv2.weight",
        "encoder.conv2.bias": "encoder.conv2.bias",
        "encoder.ln_post.weight": "encoder.ln_post.weight",
        "encoder.ln_post.bias": "encoder.ln_post.bias",
        "decoder.token_embedding.weight": "decoder.token_embedding.weight",
        "decoder.positional_embedding": "decoder.positional_embedding",
        "decoder.ln.weight": "decoder.ln.weight",
        "decoder.ln.bias": "decoder.ln.bias",
    },
    "block": "{side}.blocks.{i}",
    "attn": {"self": "attn", "cross": "cross_attn", "q": "query", "k": "key", "v": "value", "o": "out"},
    "norms": {"attn_ln": "attn_ln", "cross_attn_ln": "cross_attn_ln", "mlp_ln": "mlp_ln"},
    "fc1": "mlp.0",
    "fc2": "mlp.2",
}

_HF_NAMES = {
    "top": {
        "encoder.conv1.weight": "encoder.conv1.weight",
        "encoder.conv1.bias": "encoder.conv1.bias",
        "encoder.conv2.weight": "encoder.conv2.weight",
        "encoder.conv2.bias": "encoder.conv2.bias",
        "encoder.positional_embedding": "encoder.embed_positions.weight",
        "encoder.ln_post.weight": "encoder.layer_norm.weight",
        "encoder.ln_post.bias": "encoder.layer_norm.bias",
        "decoder.token_embedding.weight": "decoder.embed_tokens.weight",
        "decoder.positional_embedding": "decoder.embed_positions.weight",
        "decoder.ln.weight": "decoder.layer_norm.weight",
        "decoder.ln.bias": "decoder.layer_norm.bias",
    },
    "block": "{side}.layers.{i}",
    "attn": {
        "self": "self_attn",
        "cross": "encoder_attn",
        "q": "q_proj",
        "k": "k_proj",
        "v": "v_proj",
        "o": "out_proj",
    },
    "norms": {
        "attn_ln": "self_attn_layer_norm",
        "cross_attn_ln": "encoder_attn_layer_norm",
        "mlp_ln": "final_layer_norm",
    },
    "fc1": "fc1",
    "fc2": "fc2",
}


def _bundled_english_tokenizer() -> Path | None:
    """English-only Whisper checkpoints share one GPT-2 vocabulary: reuse the embedded model's file."""
    try:
        from .registry import resolve

        return resolve("whisper-tiny.en", "asr").path / "tokenizer.json"
    except ModelError:
        return None


def load_openai_pt(path: Path) -> WhisperWeights:
    try:
        ck = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(f"{path}: not a readable openai-whisper checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ck, dict) or "dims" not in ck or "model_state_dict" not in ck:
        raise ModelError(
            f"{path}: not an openai-whisper checkpoint (expected a dict with 'dims' and 'model_state_dict')"
        )
    dims = ck["dims"]
    try:
        cfg = WhisperConfig(
            **{
                k: int(dims[k])
                for k in (
                    "n_mels",
                    "n_audio_ctx",
                    "n_audio_state",
                    "n_audio_head",
                    "n_audio_layer",
                    "n_vocab",
                    "n_text_ctx",
                    "n_text_state",
                    "n_text_head",
                    "n_text_layer",
                )
            }
        )
        st = _map_separate(ck["model_state_dict"], cfg, _OPENAI_NAMES)
    except KeyError as e:
        raise ModelError(f"{path}: incomplete openai-whisper checkpoint (missing {e})") from None
    tok = path.with_name("tokenizer.json")
    if not tok.exists():
        tok = None if cfg.is_multilingual else _bundled_english_tokenizer()
    if tok is None:
        raise ModelError(
            f"{path}: a multilingual checkpoint needs its tokenizer.json beside it "
            f"(from the Hugging Face repository of the same model)"
        )
    return WhisperWeights(cfg, st, tok)


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face folder that hold its model: those its model.safetensors.index.json
    names, else model.safetensors, else every *.safetensors (a repository may carry other copies beside them:
    openai/whisper-large-v3's float32 shards beside its float16 model.safetensors)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as e:
            raise ModelError(f"{index}: unreadable ({e})") from None
        return [path / n for n in names]
    if (path / "model.safetensors").exists():
        return [path / "model.safetensors"]
    return sorted(path.glob("*.safetensors"))


def load_hf(path: Path) -> WhisperWeights:
    from safetensors.torch import load_file

    try:
        c = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}/config.json: unreadable ({e})") from None
    src = {}
    for f in weight_files(path):
        try:
            part = load_file(str(f))
        except Exception as e:
            raise ModelError(f"{f}: not a readable safetensors file ({e})") from None
        src.update({k.removeprefix("model."): v for k, v in part.items()})
    try:
        cfg = WhisperConfig(
            n_mels=c["num_mel_bins"],
            n_audio_ctx=c["max_source_positions"],
            n_audio_state=c["d_model"],
            n_audio_head=c["encoder_attention_heads"],
            n_audio_layer=c["encoder_layers"],
            n_vocab=c["vocab_size"],
            n_text_ctx=c["max_target_positions"],
            n_text_state=c["d_model"],
            n_text_head=c["decoder_attention_heads"],
            n_text_layer=c["decoder_layers"],
            n_audio_ffn=c.get("encoder_ffn_dim", 0),
            n_text_ffn=c.get("decoder_ffn_dim", 0),
        )
        st = _map_separate(src, cfg, _HF_NAMES)
    except KeyError as e:
        raise ModelError(f"{path}: incomplete Hugging Face Whisper model (missing {e})") from None
    tok = path / "tokenizer.json"
    if not tok.exists():
        tok = None if cfg.is_multilingual else _bundled_english_tokenizer()
    if tok is None:
        raise ModelError(f"{path}: no tokenizer.json in the directory (save the tokenizer with the model)")
    heads = []
    gen = path / "generation_config.json"
    if gen.exists():
        heads = [tuple(h) for h in json.loads(gen.read_text()).get("alignment_heads") or []]
    return WhisperWeights(cfg, st, tok, heads)


LOADERS = {"ct2-whisper": load_ct2, "hf-whisper": load_hf, "openai-whisper-pt": load_openai_pt}


def load_weights(model: ResolvedModel) -> WhisperWeights:
    if model.format not in LOADERS:
        raise ModelError(f"{model.path}: format {model.format!r} is not a Whisper format; valid: {', '.join(LOADERS)}")
    return LOADERS[model.format](Path(model.path))
