"""VITS HiFi-GAN generator: the latent upsampled to audio by transposed convolutions, each followed by
multi-receptive-field residual blocks (Piper's resblock "1" or "2")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .vits_layers import conv1d

if TYPE_CHECKING:
    from .vits import VitsConfig

LRELU_SLOPE = 0.1


class ResBlock(nn.Module):
    """HiFi-GAN residual block: type "1" (convs1 dilated + convs2 undilated) or "2" (convs, dilated)."""

    def __init__(self, ops, kind: str, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.ops, self.kind, self.dilations = ops, kind, tuple(dilations)
        self.k = kernel_size
        mk = lambda: nn.ModuleList(conv1d(channels, channels, kernel_size) for _ in dilations)  # noqa: E731
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
        self.conv_pre = conv1d(c.inter_channels, ch0, 7)
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
        self.conv_post = conv1d(ch0 // 2 ** len(self.ups), 1, 7, bias=False)
        if c.gin_channels:
            self.cond = conv1d(c.gin_channels, ch0, 1)

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
