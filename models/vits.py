"""VITS inference (Kim et al. 2021) as trained and shipped by Piper: text encoder with relative-position
attention, stochastic duration predictor run in reverse, normalizing flow in reverse, HiFi-GAN generator.

Only the inference path exists here (no posterior encoder, no discriminators). Module and parameter names
follow Piper's training code, so a state dict recovered from a Piper ONNX file (models/piper_loader.py)
loads with `load_state_dict(strict=True)`. Every op with a fast-path candidate comes from the KernelSet the
model is built with (kernels.select); the rest is plain torch.

Shapes: B batch, T phonemes, F latent frames (one per `hop_length` audio samples), C channels.
Tensors are channels-first [B, C, T] like the original, except inside the text encoder's attention.

This file holds the config with its presets and the model's top; its parts are siblings: the text encoder
(vits_text.py), the duration predictors (vits_duration.py), the prior flow (vits_flow.py), the HiFi-GAN
generator (vits_generator.py) and the layers they share (vits_layers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .vits_duration import DurationPredictor, StochasticDurationPredictor
from .vits_flow import ResidualCouplingBlock
from .vits_generator import Generator
from .vits_text import TextEncoder


@dataclass(frozen=True)
class VitsConfig:
    n_vocab: int = 256
    inter_channels: int = 192  # latent z channels (decoder input)
    hidden_channels: int = 192
    filter_channels: int = 768  # text encoder FFN width
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3  # text encoder FFN conv kernel
    window_size: int = 4  # relative attention reaches +-window_size phonemes
    # duration predictor: stochastic (flows) or the plain deterministic one
    use_sdp: bool = True
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_layers: int = 3  # DDSConv layers
    dp_n_flows: int = 4
    dp_num_bins: int = 10
    dp_tail_bound: float = 5.0
    # prior flow (residual coupling, mean only)
    flow_n_flows: int = 4
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    flow_n_layers: int = 4
    # HiFi-GAN generator
    resblock: str = "2"  # "1": two convs per dilation (convs1/convs2); "2": one conv per dilation
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_initial_channel: int = 256
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    # speakers: gin_channels > 0 conditions dp, flow and generator on a speaker embedding
    n_speakers: int = 1
    gin_channels: int = 0

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)

    def flow_context(self) -> int:
        """Latent frames each side that the reverse flow's output at a frame depends on: its WaveNet stacks'
        receptive field, exactly (the coupling 1x1 convs and flips are pointwise in time)."""
        return self.flow_n_flows * sum(
            self.flow_dilation_rate**i * (self.flow_kernel_size - 1) // 2 for i in range(self.flow_n_layers)
        )

    def vocoder_context(self) -> int:
        """Latent frames each side of a window that the generator's output inside it depends on (the wider side
        of vocoder_reach()): with this much context a window reproduces the whole-sequence output up to float
        rounding, which makes chunked vocoding seamless; one frame less does not."""
        return max(self.vocoder_reach())

    def vocoder_reach(self) -> tuple[int, int]:
        """The generator's exact receptive field, left and right: walked from the output back to the input in
        samples at each stage's rate (a transposed convolution's padding makes the two sides differ)."""
        left = right = 3  # conv_post, kernel 7
        for u, k in zip(reversed(self.upsample_rates), reversed(self.upsample_kernel_sizes)):
            rb = max(
                sum(self._resblock_taps(kr, d))
                for kr, d in zip(self.resblock_kernel_sizes, self.resblock_dilation_sizes)
            )
            p = (k - u) // 2  # ConvTranspose1d(stride u, padding p): out[j] = sum_i x[i] w[j + p - u i], 0 <= . < k
            left, right = (left + rb + k - 1 - p) // u, (right + rb + p - 1) // u + 1
        return left + 3, right + 3  # conv_pre, kernel 7

    def _resblock_taps(self, k: int, dilations) -> list[int]:
        """Samples each side that each convolution of one residual block reaches."""
        taps = [d * (k - 1) // 2 for d in dilations]
        return taps + [(k - 1) // 2] * len(dilations) if self.resblock == "1" else taps  # "1": + undilated convs

    def flow_macs(self) -> int:
        """Multiply-adds of the reverse flow per latent frame (the speaker conditioning left out)."""
        half, h, n = self.inter_channels // 2, self.hidden_channels, self.flow_n_layers
        wn = n * h * 2 * h * self.flow_kernel_size + (n - 1) * h * 2 * h + h * h  # in_layers, res/skip layers
        return self.flow_n_flows * (half * h + wn + h * half)

    def generator_macs(self) -> int:
        """Multiply-adds of the HiFi-GAN generator per latent frame."""
        ch, samples, macs = self.upsample_initial_channel, 1, self.inter_channels * self.upsample_initial_channel * 7
        for u, k in zip(self.upsample_rates, self.upsample_kernel_sizes):
            out, samples = ch // 2, samples * u
            convs = zip(self.resblock_kernel_sizes, self.resblock_dilation_sizes)
            macs += samples * ch * out * k // u  # a transposed conv's output sample sees k / u inputs
            macs += samples * out * out * sum(kr * len(self._resblock_taps(kr, d)) for kr, d in convs)
            ch = out
        return macs + samples * ch * 7  # conv_post


PRESETS: dict[str, VitsConfig] = {
    # Piper's quality levels (piper/train/vits/config.py and lightning.py); "low" differs from "medium" only
    # in its 16 kHz sample rate, which lives in the voice's .onnx.json, not in the network.
    "x_low": VitsConfig(inter_channels=96, hidden_channels=96, filter_channels=384),
    "low": VitsConfig(),
    "medium": VitsConfig(),
    "high": VitsConfig(
        resblock="1",
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
        upsample_rates=(8, 8, 2, 2),
        upsample_initial_channel=512,
        upsample_kernel_sizes=(16, 16, 4, 4),
    ),
}


# --------------------------------------------------------------------------------------------------- VITS


def with_vits_ops(ops):
    """`ops` (a kernels.KernelSet) plus the VITS-only ops it lacks (kernels.reference.VITS_OPS: convolutions
    and relative-position attention), taken from the reference."""
    from speechrt.kernels import KernelSet
    from speechrt.kernels.reference import VITS_OPS

    missing = {k: f for k, f in VITS_OPS.items() if k not in ops}
    if not missing:
        return ops
    names = ops.names()
    return KernelSet(
        ops.impl,
        ops.device,
        {**{n: getattr(ops, n) for n in names}, **missing},
        {**ops.sources, **{k: "torch" for k in missing}},
    )


def expand_prior(m, logs, logw, length_scale: float):
    """Phoneme-level prior m, logs [1, C, T] and log durations logw [1, 1, T] -> frame-level m, logs [1, C, F]:
    w = ceil(exp(logw) * length_scale) frames per phoneme (at least 1 frame in total), each phoneme's
    (m, logs) repeated over its frames (the monotonic path of VITS.infer)."""
    w_ceil = torch.ceil(torch.exp(logw) * length_scale)[0, 0].long()  # [T]
    if int(w_ceil.sum()) < 1:
        w_ceil[-1] = 1
    idx = torch.repeat_interleave(torch.arange(m.shape[-1], device=m.device), w_ceil)  # [F]
    return m[:, :, idx], logs[:, :, idx]


class VITS(nn.Module):
    """Inference-only VITS. `ops` is a kernels.KernelSet (the VITS-only ops are added if it lacks them)."""

    def __init__(self, config: VitsConfig, ops):
        super().__init__()
        ops = with_vits_ops(ops)
        c = self.config = config
        self.enc_p = TextEncoder(ops, c)
        self.dp = StochasticDurationPredictor(ops, c) if c.use_sdp else DurationPredictor(ops, c)
        self.flow = ResidualCouplingBlock(ops, c)
        self.dec = Generator(ops, c)
        if c.n_speakers > 1:
            self.emb_g = nn.Embedding(c.n_speakers, c.gin_channels)

    def speaker(self, sid: torch.Tensor | None):
        """sid [B] -> g [B, gin, 1], or None for single-speaker voices."""
        if self.config.n_speakers <= 1:
            return None
        return self.emb_g(sid).unsqueeze(-1)

    def prior(
        self,
        ids: torch.Tensor,
        length_scale: float,
        noise_scale_w: float,
        g=None,
        generator: torch.Generator | None = None,
    ):
        """ids [1, T] -> frame-level prior mean m [1, C, F] and log-std logs [1, C, F].

        Durations: w = ceil(exp(logw) * length_scale) frames per phoneme (at least 1 frame in total); the
        prior is each phoneme's (m, logs) repeated over its frames (the monotonic path of VITS.infer).
        """
        if ids.shape[0] != 1:
            raise ValueError(f"VITS.prior runs one sequence at a time, got a batch of {ids.shape[0]}")
        x_mask = torch.ones(1, 1, ids.shape[1], device=ids.device, dtype=self.enc_p.proj.weight.dtype)
        x, m, logs = self.enc_p(ids, x_mask)
        noise = None
        if self.config.use_sdp:
            noise = (
                torch.randn(1, 2, ids.shape[1], device=ids.device, dtype=x.dtype, generator=generator) * noise_scale_w
            )
        return expand_prior(m, logs, self.dp(x, x_mask, noise, g=g), length_scale)

    def latent(self, m, logs, noise_scale: float, g=None, generator: torch.Generator | None = None):
        """Prior (m, logs) [1, C, F] -> generator input z [1, C, F]: sample, then the flow in reverse."""
        z_p = m
        if noise_scale:
            z_p = (
                m
                + torch.randn(m.shape, device=m.device, dtype=m.dtype, generator=generator)
                * torch.exp(logs)
                * noise_scale
            )
        mask = torch.ones_like(m[:, :1])
        return self.flow.reverse(z_p, mask, g=g)

    def decode(self, z, g=None):
        """z [1, C, F] -> audio [1, 1, F * hop_length]."""
        return self.dec(z, g=g)
