"""VITS building blocks its parts share: the 1-D convolution (its weights; the KernelSet's ops run it), the
LayerNorm over channels, and the channel flip between flow layers."""

from __future__ import annotations

import torch
from torch import nn


def conv1d(cin, cout, k, groups=1, bias=True):
    """An nn.Conv1d holding a convolution's weight and bias (the modules pass them to the KernelSet's ops)."""
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


class Flip(nn.Module):
    """Channels reversed between coupling layers, so that each half of them is transformed in turn."""

    def reverse(self, x, x_mask, g=None):
        return torch.flip(x, [1])
