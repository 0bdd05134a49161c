"""Piper voices: the `.onnx.json` voice config, and the VITS weights recovered from the ONNX initializers.

Piper exports `SynthesizerTrn.infer` with torch.onnx. Most weights keep their module names
(`enc_p.encoder.attn_layers.0.conv_q.weight`), but some do not:
- weights that were computed at export time (weight norm folded into the flow's WaveNet convs) are anonymous
  (`onnx::Conv_8168`); their module is in the name of the node that consumes them
  (`/flow/flows.6/enc/in_layers.0/Conv`, input 1 -> `flow.flows.6.enc.in_layers.0.weight`);
- the phoneme embedding of single-speaker voices is named after the unused `sid` input (`sid`, consumed by
  `/enc_p/emb/Gather`);
- constant folding turned the duration flow's `exp(-logs)` into `/dp/flows.0/Exp_output_0` (or, in other
  exports, `-logs` into an anonymous input of `/dp/flows.0/Exp`);
- identical tensors (untrained LayerNorm gammas) may share one anonymous initializer, consumed by the
  decomposed LayerNorm's Mul (gamma) and Add (beta) nodes.
Hyper-parameters come from tensor shapes and from the Conv nodes' attributes (dilations, strides), so any
Piper voice loads (x_low to high, single or multi speaker), not only the default.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from speechrt.models.registry import ModelError
from speechrt.models.vits import VITS, VitsConfig


@dataclass(frozen=True)
class VoiceConfig:
    """The parts of a Piper `.onnx.json` that synthesis needs."""

    sample_rate: int
    espeak_voice: str
    phoneme_type: str  # "espeak" | "text" (others need language-specific front ends)
    phoneme_id_map: dict  # phoneme (str) -> list of ids
    num_symbols: int
    num_speakers: int = 1
    speaker_id_map: dict = field(default_factory=dict)
    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8
    hop_length: int = 256
    vowel_clusters: frozenset = frozenset()  # tuples of phonemes merged into one (newer voices)
    language: str = ""
    name: str = ""

    @staticmethod
    def from_file(path: Path) -> VoiceConfig:
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"{path}: missing; a Piper voice is a .onnx file with its .onnx.json beside it") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(f"{path}: not a Piper voice config (invalid JSON: {e})") from None
        need = {
            "audio.sample_rate": d.get("audio", {}).get("sample_rate") if isinstance(d, dict) else None,
            "phoneme_id_map": d.get("phoneme_id_map") if isinstance(d, dict) else None,
            "num_symbols": d.get("num_symbols") if isinstance(d, dict) else None,
        }
        missing = [k for k, v in need.items() if v is None]
        if missing:
            raise ModelError(
                f"{path}: not a Piper voice config (missing {', '.join(missing)}; a Piper .onnx.json "
                "has audio.sample_rate, espeak.voice, phoneme_id_map, num_symbols, num_speakers)"
            )
        inf = d.get("inference", {})
        ptype = d.get("phoneme_type", "espeak")
        if ptype not in ("espeak", "text"):
            raise ModelError(f"{path}: phoneme_type {ptype!r} is not supported; supported: espeak, text")
        return VoiceConfig(
            sample_rate=int(d["audio"]["sample_rate"]),
            espeak_voice=d.get("espeak", {}).get("voice", "en-us"),
            phoneme_type=ptype,
            phoneme_id_map={k: list(v) for k, v in d["phoneme_id_map"].items()},
            num_symbols=int(d["num_symbols"]),
            num_speakers=int(d.get("num_speakers", 1)),
            speaker_id_map=dict(d.get("speaker_id_map", {})),
            noise_scale=float(inf.get("noise_scale", 0.667)),
            length_scale=float(inf.get("length_scale", 1.0)),
            noise_w=float(inf.get("noise_w", 0.8)),
            hop_length=int(d.get("hop_length", 256)),
            vowel_clusters=frozenset(tuple(v) for v in d.get("vowel_clusters", []) or []),
            language=d.get("language", {}).get("code", ""),
            name=path.name.removesuffix(".onnx.json"),
        )


def voice_paths(path: Path) -> tuple[Path, Path]:
    """A voice's .onnx and its .onnx.json."""
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix("")
    return path, Path(str(path) + ".json")


_PARAM_RE = re.compile(r"^[a-z_]\w*(\.\w+)*\.(weight|bias|gamma|beta|m|logs|emb_rel_k|emb_rel_v)$")
# node op -> parameter name by input index
_NODE_PARAM = {"Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}, "Gather": {0: "weight"}}


@dataclass
class OnnxWeights:
    state: dict  # parameter name -> float32 tensor
    conv_attrs: dict  # module path ("dec.ups.0") -> {"dilations": [..], "strides": [..], ...}
    inputs: tuple  # graph input names


def load_onnx(path: Path):
    """onnx.ModelProto of a file, or a ModelError saying it is not ONNX."""
    try:
        import onnx
    except ImportError:
        raise ModelError("reading Piper voices needs the onnx package: pip install onnx") from None
    try:
        return onnx.load(str(path))
    except Exception as e:  # onnx raises DecodeError and friends for non-ONNX bytes
        raise ModelError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from None


def read_onnx_weights(path_or_model) -> OnnxWeights:
    """Every float initializer of a Piper ONNX graph under its PyTorch parameter name."""
    import onnx
    from onnx import numpy_helper

    model = path_or_model if isinstance(path_or_model, onnx.ModelProto) else load_onnx(path_or_model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers = defaultdict(list)
    conv_attrs = {}
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in inits:
                consumers[name].append((n, i))
        if n.op_type in ("Conv", "ConvTranspose") and n.name.startswith("/"):
            mod = ".".join(n.name.strip("/").split("/")[:-1])
            conv_attrs[mod] = {
                a.name: list(onnx.helper.get_attribute_value(a))
                for a in n.attribute
                if a.type == onnx.AttributeProto.INTS
            }

    state = {}
    for name, t in inits.items():
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            continue
        arr = numpy_helper.to_array(t).astype(np.float32)
        if _PARAM_RE.match(name):
            state[name] = torch.from_numpy(arr.copy())
            continue
        m = re.match(r"^/(.+)/Exp(_\d+)?_output_0$", name)
        if m and re.search(r"flows\.\d+$", m.group(1)):
            # folded exp(-logs) of an ElementwiseAffine flow, consumed by its reverse-mode Mul
            state[m.group(1).replace("/", ".") + ".logs"] = torch.from_numpy(-np.log(arr))
            continue
        # the exporter shares one initializer among identical tensors (e.g. untrained LayerNorm gammas),
        # so every consumer gets its own copy
        for node, idx in consumers.get(name, []):
            if not node.name.startswith("/"):
                continue
            mod = ".".join(node.name.strip("/").split("/")[:-1])
            pname = _NODE_PARAM.get(node.op_type, {}).get(idx)
            if pname is None and node.op_type == "Exp" and re.search(r"flows\.\d+$", mod):
                # the exporter folded Neg(logs) but not the Exp: this is -logs
                state.setdefault(f"{mod}.logs", torch.from_numpy(-arr))
                continue
            if pname is None and node.op_type in ("Mul", "Add") and re.search(r"norm\w*\.\d+$", mod):
                pname = "gamma" if node.op_type == "Mul" else "beta"  # LayerNorm decomposed: * gamma + beta
            if pname:
                state.setdefault(f"{mod}.{pname}", torch.from_numpy(arr.copy()))
    return OnnxWeights(state, conv_attrs, tuple(i.name for i in g.input))


def _count(state, pattern: str) -> int:
    r = re.compile(pattern)
    return len({m.group(1) for k in state if (m := r.match(k))})


def config_from_weights(w: OnnxWeights, n_vocab_hint: int | None = None) -> VitsConfig:
    """VitsConfig from tensor shapes and Conv attributes; raises ModelError if this is not a Piper VITS graph."""
    s, attrs = w.state, w.conv_attrs
    need = [
        "enc_p.emb.weight",
        "enc_p.proj.weight",
        "enc_p.encoder.attn_layers.0.emb_rel_k",
        "enc_p.encoder.ffn_layers.0.conv_1.weight",
        "flow.flows.0.pre.weight",
        "dec.conv_pre.weight",
        "dec.ups.0.weight",
    ]
    missing = [k for k in need if k not in s]
    if missing:
        raise ModelError(
            f"not a Piper VITS voice: the ONNX graph has no {', '.join(missing)} "
            "(a Piper voice is the ONNX export of piper's SynthesizerTrn)"
        )
    emb = s["enc_p.emb.weight"]
    hidden = emb.shape[1]
    k_ch = s["enc_p.encoder.attn_layers.0.emb_rel_k"].shape[-1]
    ffn1 = s["enc_p.encoder.ffn_layers.0.conv_1.weight"]
    n_ups = _count(s, r"^dec\.ups\.(\d+)\.weight$")
    n_rb = _count(s, r"^dec\.resblocks\.(\d+)\.")
    nk = n_rb // n_ups
    kind = "1" if "dec.resblocks.0.convs1.0.weight" in s else "2"
    ks, dils = [], []
    for j in range(nk):
        conv_names = ["convs1"] if kind == "1" else ["convs"]
        n_d = _count(s, rf"^dec\.resblocks\.{j}\.{conv_names[0]}\.(\d+)\.weight$")
        ks.append(s[f"dec.resblocks.{j}.{conv_names[0]}.0.weight"].shape[2])
        dils.append(
            tuple(attrs.get(f"dec.resblocks.{j}.{conv_names[0]}.{i}", {}).get("dilations", [1])[0] for i in range(n_d))
        )
    ups_k = tuple(s[f"dec.ups.{i}.weight"].shape[2] for i in range(n_ups))
    ups_u = tuple(attrs.get(f"dec.ups.{i}", {}).get("strides", [k // 2])[0] for i, k in enumerate(ups_k))
    use_sdp = "dp.flows.0.m" in s
    if use_sdp:
        dp_fc = s["dp.pre.weight"].shape[0]
        dp_k = s["dp.convs.convs_sep.0.weight"].shape[2]
        dp_layers = _count(s, r"^dp\.convs\.convs_sep\.(\d+)\.weight$")
        flow_ids = {int(m.group(1)) for k in s if (m := re.match(r"^dp\.flows\.(\d+)\.proj\.weight$", k))}
        dp_flows = (max(flow_ids) + 1) // 2 if flow_ids else 0
        first = min(flow_ids) if flow_ids else 3
        bins = (s[f"dp.flows.{first}.proj.weight"].shape[0] + 1) // 3 if flow_ids else 10
    else:
        dp_fc = s["dp.conv_1.weight"].shape[0]
        dp_k = s["dp.conv_1.weight"].shape[2]
        dp_layers, dp_flows, bins = 3, 4, 10
    n_flows = _count(s, r"^flow\.flows\.(\d+)\.pre\.weight$")
    wn_layers = _count(s, r"^flow\.flows\.0\.enc\.in_layers\.(\d+)\.weight$")
    flow_dil = attrs.get("flow.flows.0.enc.in_layers.1", {}).get("dilations", [1])[0] if wn_layers > 1 else 1
    n_speakers = s["emb_g.weight"].shape[0] if "emb_g.weight" in s else 1
    gin = s["emb_g.weight"].shape[1] if "emb_g.weight" in s else 0
    return VitsConfig(
        n_vocab=emb.shape[0],
        inter_channels=s["enc_p.proj.weight"].shape[0] // 2,
        hidden_channels=hidden,
        filter_channels=ffn1.shape[0],
        n_heads=hidden // k_ch,
        n_layers=_count(s, r"^enc_p\.encoder\.attn_layers\.(\d+)\."),
        kernel_size=ffn1.shape[2],
        window_size=(s["enc_p.encoder.attn_layers.0.emb_rel_k"].shape[1] - 1) // 2,
        use_sdp=use_sdp,
        dp_filter_channels=dp_fc,
        dp_kernel_size=dp_k,
        dp_n_layers=dp_layers,
        dp_n_flows=dp_flows,
        dp_num_bins=bins,
        flow_n_flows=n_flows,
        flow_kernel_size=s["flow.flows.0.enc.in_layers.0.weight"].shape[2],
        flow_dilation_rate=flow_dil,
        flow_n_layers=wn_layers,
        resblock=kind,
        resblock_kernel_sizes=tuple(ks),
        resblock_dilation_sizes=tuple(dils),
        upsample_rates=ups_u,
        upsample_initial_channel=s["dec.conv_pre.weight"].shape[0],
        upsample_kernel_sizes=ups_k,
        n_speakers=n_speakers,
        gin_channels=gin,
    )


def check_voice(voice: VoiceConfig, cfg: VitsConfig, path) -> None:
    """The .onnx.json must fit the network: phoneme ids inside its vocabulary, the same speaker count."""
    top = max((i for ids in voice.phoneme_id_map.values() for i in ids), default=0)
    if top >= cfg.n_vocab:
        raise ModelError(
            f"{path}: phoneme_id_map uses id {top} but the network has {cfg.n_vocab} symbols; "
            "the .onnx.json does not belong to this .onnx"
        )
    if max(voice.num_speakers, 1) != cfg.n_speakers:
        raise ModelError(
            f"{path}: the .onnx.json says {voice.num_speakers} speakers, the network has "
            f"{cfg.n_speakers}; the .onnx.json does not belong to this .onnx"
        )


def load_vits(path: Path, ops, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """A Piper voice .onnx -> (VITS in eval mode on `device`, VoiceConfig)."""
    onnx_path, json_path = voice_paths(path)
    voice = VoiceConfig.from_file(json_path)
    if not onnx_path.exists():
        raise ModelError(f"{onnx_path}: no such voice file")
    w = read_onnx_weights(onnx_path)
    try:
        cfg = config_from_weights(w)
    except ModelError as e:
        raise ModelError(f"{onnx_path}: {e}") from None
    check_voice(voice, cfg, onnx_path)
    model = VITS(cfg, ops)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(w.state))
    if missing:
        raise ModelError(
            f"{onnx_path}: not a loadable Piper VITS voice; no weights found for "
            f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}"
        )
    bad = [k for k in expected if tuple(expected[k].shape) != tuple(w.state[k].shape)]
    if bad:
        raise ModelError(
            f"{onnx_path}: weight shapes do not fit the inferred VITS config: "
            + ", ".join(f"{k} {tuple(w.state[k].shape)} vs {tuple(expected[k].shape)}" for k in bad[:4])
        )
    model.load_state_dict({k: w.state[k] for k in expected}, strict=True)
    if voice.hop_length != cfg.hop_length:
        raise ModelError(
            f"{onnx_path}: voice config says hop_length {voice.hop_length} but the generator "
            f"upsamples by {cfg.hop_length}"
        )
    return model.to(device=device, dtype=dtype).eval(), voice
