"""VITS duration predictors, run in reverse: the stochastic one (a flow of rational-quadratic spline couplings
over noise, conditioned on the text encoder's output) and the plain deterministic one -> log durations."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .vits_layers import Flip, LayerNorm, conv1d

if TYPE_CHECKING:
    from .vits import VitsConfig


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
            self.convs_sep.append(conv1d(channels, channels, kernel_size, groups=channels))
            self.convs_1x1.append(conv1d(channels, channels, 1))
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


class ConvFlow(nn.Module):
    """Neural spline flow coupling layer: x1 goes through a rational-quadratic spline whose knots are
    predicted from x0 (and the conditioning g)."""

    def __init__(self, ops, c: VitsConfig, in_channels: int = 2):
        super().__init__()
        self.half, self.num_bins, self.tail_bound = in_channels // 2, c.dp_num_bins, c.dp_tail_bound
        self.filter_channels = c.dp_filter_channels
        self.pre = conv1d(self.half, c.dp_filter_channels, 1)
        self.convs = DDSConv(ops, c.dp_filter_channels, c.dp_kernel_size, c.dp_n_layers)
        self.proj = conv1d(c.dp_filter_channels, self.half * (c.dp_num_bins * 3 - 1), 1)

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
        self.pre = conv1d(c.hidden_channels, fc, 1)
        self.proj = conv1d(fc, fc, 1)
        self.convs = DDSConv(ops, fc, c.dp_kernel_size, c.dp_n_layers)
        # index 0 affine, then (ConvFlow, Flip) pairs; index 1 is unused in reverse and absent from the ONNX
        # graph, so it is kept as an empty placeholder to preserve the training-time indices.
        flows = [ElementwiseAffine(2)]
        for i in range(c.dp_n_flows):
            flows += [ConvFlow(ops, c) if i > 0 else nn.Identity(), Flip()]
        self.flows = nn.ModuleList(flows)
        if c.gin_channels:
            self.cond = conv1d(c.gin_channels, fc, 1)

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
        self.conv_1 = conv1d(c.hidden_channels, fc, k)
        self.norm_1 = LayerNorm(ops, fc)
        self.conv_2 = conv1d(fc, fc, k)
        self.norm_2 = LayerNorm(ops, fc)
        self.proj = conv1d(fc, 1, 1)
        if c.gin_channels:
            self.cond = conv1d(c.gin_channels, c.hidden_channels, 1)

    def forward(self, x, x_mask, noise=None, g=None):
        if g is not None:
            x = x + self.cond(g)
        k = self.conv_1.kernel_size[0]
        x = self.norm_1(torch.relu(self.ops.conv1d(x * x_mask, self.conv_1.weight, self.conv_1.bias, padding=k // 2)))
        x = self.norm_2(torch.relu(self.ops.conv1d(x * x_mask, self.conv_2.weight, self.conv_2.bias, padding=k // 2)))
        return self.proj(x * x_mask) * x_mask
