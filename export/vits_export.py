"""`speechrt export tts`: a VITS voice (models/vits.py, loaded from a Piper voice or trained in PyTorch) ->
the three pieces the streaming runner uses, traced from the torch modules:

text.onnx       phoneme ids [1, T], the duration predictor's noise [1, 2, T] (already scaled by noise_w)
                -> prior mean m [1, C, T], log-std logs [1, C, T], log durations logw [1, 1, T]
flow.onnx       z_p [1, C, F] -> z [1, C, F] (the prior flow in reverse)
generator.onnx  z [1, C, F] -> audio [1, 1, F * hop]

In all of them the 1-D convolutions are 2-D ones of height 1 (export/conv2d.py: ONNX Runtime's blocked
convolutions, 5-14 % faster at one thread on the CPU).

Multi-speaker voices add speaker.onnx (sid [1] -> g [1, gin, 1]) and a `g` input to the other three.
Durations (ceil(exp(logw) * length_scale)), expanding the prior to frames and sampling z_p stay torch ops in
the runner, so noise comes from a seeded torch generator and shapes stay simple for every runtime.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import onnx
import torch
from torch import nn

from speechrt.models.piper_loader import load_vits, voice_paths

from .conv2d import convs_as_2d
from .manifest import Graph, Manifest, Tensor, speechrt_version
from .trace import export_ops, trace


def io(c, speakers: bool) -> dict[str, tuple[list[Tensor], list[Tensor]]]:
    C = c.inter_channels
    g = [Tensor("g", "float32", (1, c.gin_channels, 1))] if speakers else []
    out = {
        "text": (
            [Tensor("ids", "int64", (1, "phonemes")), Tensor("dp_noise", "float32", (1, 2, "phonemes"))] + g,
            [
                Tensor("m", "float32", (1, C, "phonemes")),
                Tensor("logs", "float32", (1, C, "phonemes")),
                Tensor("logw", "float32", (1, 1, "phonemes")),
            ],
        ),
        "flow": ([Tensor("z_p", "float32", (1, C, "frames"))] + g, [Tensor("z", "float32", (1, C, "frames"))]),
        "generator": ([Tensor("z", "float32", (1, C, "frames"))] + g, [Tensor("audio", "float32", (1, 1, "samples"))]),
    }
    if speakers:
        out["speaker"] = ([Tensor("sid", "int64", (1,))], [Tensor("g", "float32", (1, c.gin_channels, 1))])
    return out


class TextGraph(nn.Module):
    def __init__(self, vits):
        super().__init__()
        self.vits = vits

    def forward(self, ids, dp_noise, g=None):
        x_mask = torch.ones_like(dp_noise[:, :1])
        x, m, logs = self.vits.enc_p(ids, x_mask)
        return m, logs, self.vits.dp(x, x_mask, dp_noise, g=g)


class FlowGraph(nn.Module):
    def __init__(self, vits):
        super().__init__()
        self.flow = vits.flow

    def forward(self, z_p, g=None):
        return self.flow.reverse(z_p, torch.ones_like(z_p[:, :1]), g=g)


class GeneratorGraph(nn.Module):
    def __init__(self, vits):
        super().__init__()
        self.dec = vits.dec

    def forward(self, z, g=None):
        return self.dec(z, g=g)


class SpeakerGraph(nn.Module):
    def __init__(self, vits):
        super().__init__()
        self.vits = vits

    def forward(self, sid):
        return self.vits.speaker(sid)


def export(model, out: Path, precision: str | None, opset: int, variant: str, bar) -> Manifest:
    if precision not in (None, "fp32"):
        raise ValueError(f"precision {precision!r} is not available for VITS voices; valid: fp32")
    bar.reset(total=5)
    bar.set_description("reading the voice")
    vits, voice = load_vits(model.path, export_ops())
    vits = vits.eval().requires_grad_(False)
    c = vits.config
    speakers = c.n_speakers > 1
    spec = io(c, speakers)
    bar.update(1)
    T, F = 12, 40  # tracing lengths; the axes are dynamic
    g = (torch.zeros(1, c.gin_channels, 1),) if speakers else ()
    pieces = {
        "text": (TextGraph(vits), (torch.ones(1, T, dtype=torch.long), torch.zeros(1, 2, T)) + g),
        "flow": (FlowGraph(vits), (torch.zeros(1, c.inter_channels, F),) + g),
        "generator": (GeneratorGraph(vits), (torch.zeros(1, c.inter_channels, F),) + g),
    }
    if speakers:
        pieces["speaker"] = (SpeakerGraph(vits), (torch.zeros(1, dtype=torch.long),))
    for name, (mod, args) in pieces.items():
        bar.set_description(f"tracing {name}")
        with torch.no_grad():
            trace(mod, args, out / f"{name}.onnx", *spec[name], opset)
        path = str(out / f"{name}.onnx")
        onnx.save(convs_as_2d(onnx.load(path)), path)
        bar.update(1)
    _, json_path = voice_paths(model.path)
    shutil.copy(json_path, out / "voice.json")
    graphs = {k: Graph(f"{k}.onnx", tuple(i), tuple(o)) for k, (i, o) in spec.items()}
    conf = dataclasses.asdict(c)
    return Manifest(
        "tts",
        model.name,
        json.loads(json.dumps(conf)),
        graphs,
        "fp32",
        "ort",
        {"flow_context": c.flow_context(), "vocoder_context": c.vocoder_context(), "hop_length": c.hop_length},
        "float32 as loaded",
        {"path": str(model.path), "format": model.format},
        opset,
        speechrt_version(),
        {"voice": "voice.json", "sample_rate": voice.sample_rate},
    )
