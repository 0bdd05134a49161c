"""VITS inference (Kim et al. 2021) as trained and shipped by Piper: text encoder with relative-position
attention, stochastic duration predictor run in reverse, normalizing flow in reverse, HiFi-GAN generator.

Only the inference path exists here (no posterior encoder, no discriminators). Module and parameter names
follow Piper's training code, so a state dict recovered from a Piper ONNX file (models/piper_loader.py)
loads with `load_state_dict(strict=True)`. Every op with a fast-path candidate comes from the KernelSet the
model is built with (kernels.select); the rest is plain torch.

Shapes: B batch, T phonemes, F latent frames (one per `hop_length` audio samples), C channels.
Tensors are channels-first [B, C, T] like the original, except inside the text encoder's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LRELU_SLOPE = 0.1


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


def _conv(cin, cout, k, groups=1, bias=True):
    return nn.Conv1d(cin, cout, k, groups=groups, bias=bias)


class LayerNorm(nn.Module):
    """LayerNorm over channels of [B, C, T] (VITS names its parameters gamma/beta)."""

    def __init__(self, ops, channels: int, eps: float = 1e-5):
        super().__init__()
        self.ops, self.eps = ops, eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        return self.ops.layer_norm(x.transpose(1, 2), self.gamma, self.beta, self.eps).transpose(1, 2)


# ---------------------------------------------------------------------------------------------- text encoder


class MultiHeadAttention(nn.Module):
    def __init__(self, ops, channels: int, n_heads: int, window_size: int):
        super().__init__()
        self.ops, self.n_heads = ops, n_heads
        self.k_channels = channels // n_heads
        self.conv_q = _conv(channels, channels, 1)
        self.conv_k = _conv(channels, channels, 1)
        self.conv_v = _conv(channels, channels, 1)
        self.conv_o = _conv(channels, channels, 1)
        # one table shared by all heads: [1, 2W+1, D]
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))

    def forward(self, x, attn_mask):
        """x [B, T, C] (time-major here, so the 1x1 convs are linears) -> [B, T, C]."""
        B, T, C = x.shape
        lin = self.ops.linear

        def heads(conv):  # [B, T, C] -> [B, H, T, D]
            return lin(x, conv.weight[:, :, 0], conv.bias).view(B, T, self.n_heads, self.k_channels).transpose(1, 2)

        o = self.ops.relative_attention(
            heads(self.conv_q), heads(self.conv_k), heads(self.conv_v), self.emb_rel_k, self.emb_rel_v, attn_mask
        )
        o = o.transpose(1, 2).reshape(B, T, C)
        return lin(o, self.conv_o.weight[:, :, 0], self.conv_o.bias)


class FFN(nn.Module):
    def __init__(self, ops, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.ops = ops
        self.conv_1 = _conv(channels, filter_channels, kernel_size)
        self.conv_2 = _conv(filter_channels, channels, kernel_size)

    def _pad(self, x):  # "same" padding, left (k-1)//2, right k//2
        k = self.conv_1.kernel_size[0]
        return F.pad(x, ((k - 1) // 2, k // 2))

    def forward(self, x, x_mask):
        """x [B, C, T] -> [B, C, T]"""
        x = self.ops.conv1d(self._pad(x * x_mask), self.conv_1.weight, self.conv_1.bias)
        x = torch.relu(x)
        x = self.ops.conv1d(self._pad(x * x_mask), self.conv_2.weight, self.conv_2.bias)
        return x * x_mask


class Encoder(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        h = c.hidden_channels
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(ops, h, c.n_heads, c.window_size) for _ in range(c.n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(ops, h) for _ in range(c.n_layers))
        self.ffn_layers = nn.ModuleList(FFN(ops, h, c.filter_channels, c.kernel_size) for _ in range(c.n_layers))
        self.norm_layers_2 = nn.ModuleList(LayerNorm(ops, h) for _ in range(c.n_layers))

    def forward(self, x, x_mask):
        """x [B, C, T], x_mask [B, 1, T] -> [B, C, T]"""
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # [B, 1, T, T]
        x = x * x_mask
        for attn, n1, ffn, n2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            y = attn(x.transpose(1, 2), attn_mask).transpose(1, 2)
            x = n1(x + y)
            x = n2(x + ffn(x, x_mask))
        return x * x_mask


class TextEncoder(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        self.hidden_channels, self.out_channels = c.hidden_channels, c.inter_channels
        self.emb = nn.Embedding(c.n_vocab, c.hidden_channels)
        self.encoder = Encoder(ops, c)
        self.proj = _conv(c.hidden_channels, c.inter_channels * 2, 1)

    def forward(self, ids, x_mask):
        """ids [B, T] -> hidden x [B, H, T], prior mean m [B, C, T] and log-std logs [B, C, T]."""
        x = self.emb(ids) * math.sqrt(self.hidden_channels)
        x = self.encoder(x.transpose(1, 2) * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs


# ---------------------------------------------------------------------------------- stochastic duration predictor


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions: dilation kernel_size**i."""

    def __init__(self, ops, channels: int, kernel_size: int, n_layers: int):
        super().__init__()
        self.ops = ops
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        self.dilations = []
        for i in range(n_layers):
            self.dilations.append(kernel_size**i)
            self.convs_sep.append(_conv(channels, channels, kernel_size, groups=channels))
            self.convs_1x1.append(_conv(channels, channels, 1))
            self.norms_1.append(LayerNorm(ops, channels))
            self.norms_2.append(LayerNorm(ops, channels))

    def forward(self, x, x_mask, g=None):
        if g is not None:
            x = x + g
        ops = self.ops
        for sep, pw, n1, n2, d in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2, self.dilations):
            k = sep.kernel_size[0]
            y = ops.conv1d(x * x_mask, sep.weight, sep.bias, padding=(k * d - d) // 2, dilation=d, groups=sep.groups)
            y = ops.gelu(n1(y))
            y = ops.gelu(n2(ops.conv1d(y, pw.weight, pw.bias)))
            x = x + y
        return x * x_mask


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x, x_mask, g=None):
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class Flip(nn.Module):
    def reverse(self, x, x_mask, g=None):
        return torch.flip(x, [1])


class ConvFlow(nn.Module):
    """Neural spline flow coupling layer: x1 goes through a rational-quadratic spline whose knots are
    predicted from x0 (and the conditioning g)."""

    def __init__(self, ops, c: VitsConfig, in_channels: int = 2):
        super().__init__()
        self.half, self.num_bins, self.tail_bound = in_channels // 2, c.dp_num_bins, c.dp_tail_bound
        self.filter_channels = c.dp_filter_channels
        self.pre = _conv(self.half, c.dp_filter_channels, 1)
        self.convs = DDSConv(ops, c.dp_filter_channels, c.dp_kernel_size, c.dp_n_layers)
        self.proj = _conv(c.dp_filter_channels, self.half * (c.dp_num_bins * 3 - 1), 1)

    def reverse(self, x, x_mask, g=None):
        x0, x1 = torch.split(x, [self.half, self.half], 1)
        h = self.convs(self.pre(x0), x_mask, g=g)
        h = self.proj(h) * x_mask
        b, c, t = x0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2)  # [B, c, T, 3*bins-1]
        nb, s = self.num_bins, math.sqrt(self.filter_channels)
        x1 = rq_spline_inverse(x1, h[..., :nb] / s, h[..., nb : 2 * nb] / s, h[..., 2 * nb :], self.tail_bound)
        return torch.cat([x0, x1], 1) * x_mask


def rq_spline_inverse(y, uw, uh, ud, tail_bound: float, min_w: float = 1e-3, min_h: float = 1e-3, min_d: float = 1e-3):
    """Inverse of the unconstrained rational-quadratic spline with linear tails (Durkan et al. 2019), as in
    VITS transforms.py, computed for every element and selected with `where` (no boolean indexing).

    y [...]; uw, uh [..., bins]; ud [..., bins-1] -> x [...]. Identity outside [-tail_bound, tail_bound].
    """
    inside = (y >= -tail_bound) & (y <= tail_bound)
    nb = uw.shape[-1]
    const = math.log(math.exp(1 - min_d) - 1)  # boundary derivatives = 1, matching the linear tails
    ud = F.pad(ud, (1, 1), value=const)
    left, right = -tail_bound, tail_bound

    def knots(u, mn):
        w = mn + (1 - mn * nb) * torch.softmax(u, dim=-1)
        cw = F.pad(torch.cumsum(w, dim=-1), (1, 0))
        cw = (right - left) * cw + left
        cw = torch.cat([torch.full_like(cw[..., :1], left), cw[..., 1:-1], torch.full_like(cw[..., :1], right)], -1)
        return cw, cw[..., 1:] - cw[..., :-1]

    cumw, widths = knots(uw, min_w)
    cumh, heights = knots(uh, min_h)
    derivs = min_d + F.softplus(ud)
    # bin index: how many knots (the last nudged up by 1e-6) lie at or below y, minus one
    loc = torch.cat([cumh[..., :-1], cumh[..., -1:] + 1e-6], -1)
    idx = (torch.sum(y[..., None] >= loc, dim=-1) - 1).clamp(0, nb - 1)[..., None]

    def pick(t):
        return t.gather(-1, idx)[..., 0]

    in_cw, in_w, in_ch, in_h = pick(cumw), pick(widths), pick(cumh), pick(heights)
    delta = pick(heights / widths)
    d0, d1 = pick(derivs), derivs[..., 1:].gather(-1, idx)[..., 0]
    dy = y - in_ch
    s = d0 + d1 - 2 * delta
    a = dy * s + in_h * (delta - d0)
    b = in_h * d0 - dy * s
    c = -delta * dy
    disc = (b.pow(2) - 4 * a * c).clamp_min(0)
    root = (2 * c) / (-b - torch.sqrt(disc))
    x = root * in_w + in_cw
    return torch.where(inside, x, y)


class StochasticDurationPredictor(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        fc = c.dp_filter_channels
        self.pre = _conv(c.hidden_channels, fc, 1)
        self.proj = _conv(fc, fc, 1)
        self.convs = DDSConv(ops, fc, c.dp_kernel_size, c.dp_n_layers)
        # index 0 affine, then (ConvFlow, Flip) pairs; index 1 is unused in reverse and absent from the ONNX
        # graph, so it is kept as an empty placeholder to preserve the training-time indices.
        flows = [ElementwiseAffine(2)]
        for i in range(c.dp_n_flows):
            flows += [ConvFlow(ops, c) if i > 0 else nn.Identity(), Flip()]
        self.flows = nn.ModuleList(flows)
        if c.gin_channels:
            self.cond = _conv(c.gin_channels, fc, 1)

    def forward(self, x, x_mask, noise: torch.Tensor, g=None):
        """x [B, H, T] -> log durations [B, 1, T]; noise [B, 2, T] is the (already scaled) flow input."""
        x = self.pre(x)
        if g is not None:
            x = x + self.cond(g)
        x = self.proj(self.convs(x, x_mask)) * x_mask
        # reverse order, skipping flows[1] (VITS: "remove a useless vflow")
        order = [f for i, f in enumerate(self.flows) if i != 1][::-1]
        z = noise
        for f in order:
            z = f.reverse(z, x_mask, g=x)
        return z[:, :1]


class DurationPredictor(nn.Module):
    """The deterministic duration predictor (VITS use_sdp=False)."""

    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        self.ops = ops
        k, fc = c.dp_kernel_size, c.dp_filter_channels
        self.conv_1 = _conv(c.hidden_channels, fc, k)
        self.norm_1 = LayerNorm(ops, fc)
        self.conv_2 = _conv(fc, fc, k)
        self.norm_2 = LayerNorm(ops, fc)
        self.proj = _conv(fc, 1, 1)
        if c.gin_channels:
            self.cond = _conv(c.gin_channels, c.hidden_channels, 1)

    def forward(self, x, x_mask, noise=None, g=None):
        if g is not None:
            x = x + self.cond(g)
        k = self.conv_1.kernel_size[0]
        x = self.norm_1(torch.relu(self.ops.conv1d(x * x_mask, self.conv_1.weight, self.conv_1.bias, padding=k // 2)))
        x = self.norm_2(torch.relu(self.ops.conv1d(x * x_mask, self.conv_2.weight, self.conv_2.bias, padding=k // 2)))
        return self.proj(x * x_mask) * x_mask


# ------------------------------------------------------------------------------------------------ prior flow


class WN(nn.Module):
    """WaveNet-style stack of gated dilated convolutions (weight norm already folded into the weights)."""

    def __init__(self, ops, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.ops, self.hidden = ops, hidden
        self.dilations = [dilation_rate**i for i in range(n_layers)]
        self.in_layers = nn.ModuleList(_conv(hidden, 2 * hidden, kernel_size) for _ in range(n_layers))
        self.res_skip_layers = nn.ModuleList(
            _conv(hidden, 2 * hidden if i < n_layers - 1 else hidden, 1) for i in range(n_layers)
        )
        if gin_channels:
            self.cond_layer = _conv(gin_channels, 2 * hidden * n_layers, 1)

    def forward(self, x, x_mask, g=None):
        out = torch.zeros_like(x)
        h = self.hidden
        if g is not None:
            g = self.cond_layer(g)
        n = len(self.in_layers)
        for i, (inl, rs, d) in enumerate(zip(self.in_layers, self.res_skip_layers, self.dilations)):
            k = inl.kernel_size[0]
            x_in = self.ops.conv1d(x, inl.weight, inl.bias, padding=(k * d - d) // 2, dilation=d)
            if g is not None:
                x_in = x_in + g[:, i * 2 * h : (i + 1) * 2 * h]
            acts = torch.tanh(x_in[:, :h]) * torch.sigmoid(x_in[:, h:])
            res_skip = self.ops.conv1d(acts, rs.weight, rs.bias)
            if i < n - 1:
                x = (x + res_skip[:, :h]) * x_mask
                out = out + res_skip[:, h:]
            else:
                out = out + res_skip
        return out * x_mask


class ResidualCouplingLayer(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        self.half = c.inter_channels // 2
        self.pre = _conv(self.half, c.hidden_channels, 1)
        self.enc = WN(ops, c.hidden_channels, c.flow_kernel_size, c.flow_dilation_rate, c.flow_n_layers, c.gin_channels)
        self.post = _conv(c.hidden_channels, self.half, 1)  # mean only

    def reverse(self, x, x_mask, g=None):
        x0, x1 = torch.split(x, [self.half, self.half], 1)
        h = self.enc(self.pre(x0) * x_mask, x_mask, g=g)
        m = self.post(h) * x_mask
        return torch.cat([x0, (x1 - m) * x_mask], 1)


class ResidualCouplingBlock(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        flows = []
        for _ in range(c.flow_n_flows):
            flows += [ResidualCouplingLayer(ops, c), Flip()]
        self.flows = nn.ModuleList(flows)

    def reverse(self, z, mask, g=None):
        for f in reversed(self.flows):
            z = f.reverse(z, mask, g=g)
        return z


# ------------------------------------------------------------------------------------------ HiFi-GAN generator


class ResBlock(nn.Module):
    """HiFi-GAN residual block: type "1" (convs1 dilated + convs2 undilated) or "2" (convs, dilated)."""

    def __init__(self, ops, kind: str, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.ops, self.kind, self.dilations = ops, kind, tuple(dilations)
        self.k = kernel_size
        mk = lambda: nn.ModuleList(_conv(channels, channels, kernel_size) for _ in dilations)  # noqa: E731
        if kind == "1":
            self.convs1, self.convs2 = mk(), mk()
        else:
            self.convs = mk()

    def forward(self, x):
        """x [B, C, T] -> [B, C, T], a new tensor (x is shared by the stage's parallel blocks: never written)."""
        conv, k = self.ops.conv1d, self.k
        out = None
        if self.kind == "1":
            for c1, c2, d in zip(self.convs1, self.convs2, self.dilations):
                src = x if out is None else out
                xt = conv(src, c1.weight, c1.bias, padding=d * (k - 1) // 2, dilation=d, pre_slope=LRELU_SLOPE)
                y = conv(xt, c2.weight, c2.bias, padding=(k - 1) // 2, pre_slope=LRELU_SLOPE)
                out = x + y if out is None else out.add_(y)  # residual in place once it is our own tensor
        else:
            for c, d in zip(self.convs, self.dilations):
                src = x if out is None else out
                y = conv(src, c.weight, c.bias, padding=d * (k - 1) // 2, dilation=d, pre_slope=LRELU_SLOPE)
                out = x + y if out is None else out.add_(y)
        return out


class Generator(nn.Module):
    def __init__(self, ops, c: VitsConfig):
        super().__init__()
        self.ops = ops
        ch0 = c.upsample_initial_channel
        self.conv_pre = _conv(c.inter_channels, ch0, 7)
        self.strides = tuple(c.upsample_rates)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(ch0 // 2**i, ch0 // 2 ** (i + 1), k, u)
            for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes))
        )
        self.num_kernels = len(c.resblock_kernel_sizes)
        self.resblocks = nn.ModuleList(
            ResBlock(ops, c.resblock, ch0 // 2 ** (i + 1), k, d)
            for i in range(len(self.ups))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes)
        )
        self.conv_post = _conv(ch0 // 2 ** len(self.ups), 1, 7, bias=False)
        if c.gin_channels:
            self.cond = _conv(c.gin_channels, ch0, 1)

    def forward(self, z, g=None):
        """z [B, C, F] -> audio [B, 1, F * hop_length] in [-1, 1]."""
        ops = self.ops
        x = ops.conv1d(z, self.conv_pre.weight, self.conv_pre.bias, padding=3)
        if g is not None:
            x = x + self.cond(g)
        nk = self.num_kernels
        for i, (up, u) in enumerate(zip(self.ups, self.strides)):
            k = up.kernel_size[0]
            x = ops.conv_transpose1d(x, up.weight, up.bias, u, (k - u) // 2, pre_slope=LRELU_SLOPE)
            blocks = self.resblocks[i * nk : (i + 1) * nk]
            xs = blocks[0](x)  # a new tensor: the sum accumulates in place
            for rb in blocks[1:]:
                xs.add_(rb(x))
            x = xs.div_(nk)
        x = ops.conv1d(x, self.conv_post.weight, None, padding=3, pre_slope=0.01)  # F.leaky_relu default slope
        return torch.tanh(x)


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
