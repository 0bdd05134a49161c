"""VITS prior flow, run in reverse: residual coupling layers (mean only) over WaveNet stacks, with flips
between them -> the generator's latent from the sampled prior."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .vits_layers import Flip, conv1d

if TYPE_CHECKING:
    from .vits import VitsConfig


class WN(nn.Module):
    """WaveNet-style stack of gated dilated convolutions (weight norm already folded into the weights)."""

    def __init__(self, ops, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.ops, self.hidden = ops, hidden
        self.dilations = [dilation_rate**i for i in range(n_layers)]
        self.in_layers = nn.ModuleList(conv1d(hidden, 2 * hidden, kernel_size) for _ in range(n_layers))
        self.res_skip_layers = nn.ModuleList(
            conv1d(hidden, 2 * hidden if i < n_layers - 1 else hidden, 1) for i in range(n_layers)
        )
        if gin_channels:
            self.cond_layer = conv1d(gin_channels, 2 * hidden * n_layers, 1)

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
        self.pre = conv1d(self.half, c.hidden_channels, 1)
        self.enc = WN(ops, c.hidden_channels, c.flow_kernel_size, c.flow_dilation_rate, c.flow_n_layers, c.gin_channels)
        self.post = conv1d(c.hidden_channels, self.half, 1)  # mean only

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
