"""VITS text encoder: phoneme embeddings through a transformer with relative-position attention (a window of
+-window_size phonemes) -> the phoneme-level prior (mean, log-std). Shapes as in models/vits.py."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .vits_layers import LayerNorm, conv1d

if TYPE_CHECKING:
    from .vits import VitsConfig


class MultiHeadAttention(nn.Module):
    def __init__(self, ops, channels: int, n_heads: int, window_size: int):
        super().__init__()
        self.ops, self.n_heads = ops, n_heads
        self.k_channels = channels // n_heads
        self.conv_q = conv1d(channels, channels, 1)
        self.conv_k = conv1d(channels, channels, 1)
        self.conv_v = conv1d(channels, channels, 1)
        self.conv_o = conv1d(channels, channels, 1)
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
        self.conv_1 = conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = conv1d(filter_channels, channels, kernel_size)

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
        self.proj = conv1d(c.hidden_channels, c.inter_channels * 2, 1)

    def forward(self, ids, x_mask):
        """ids [B, T] -> hidden x [B, H, T], prior mean m [B, C, T] and log-std logs [B, C, T]."""
        x = self.emb(ids) * math.sqrt(self.hidden_channels)
        x = self.encoder(x.transpose(1, 2) * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs
