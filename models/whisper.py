"""Whisper (openai/whisper) in PyTorch: log-mel in, encoder states and decoder logits out.

Weights use one internal naming, with the self-attention projections fused (qkv) and the
cross-attention key/value projections fused (kv); loaders for each file format map to it
(models/whisper_loaders.py). Ops come from a KernelSet chosen once at construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from speechrt.kernels import KernelSet


@dataclass(frozen=True)
class WhisperConfig:
    n_mels: int = 80
    n_audio_ctx: int = 1500
    n_audio_state: int = 384
    n_audio_head: int = 6
    n_audio_layer: int = 4
    n_vocab: int = 51864
    n_text_ctx: int = 448
    n_text_state: int = 384
    n_text_head: int = 6
    n_text_layer: int = 4
    n_audio_ffn: int = 0  # MLP width; 0 means 4 * state, as in every released checkpoint
    n_text_ffn: int = 0

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual)

    def check(self) -> WhisperConfig:
        for name in ("n_audio_state", "n_text_state"):
            heads = getattr(self, name.replace("state", "head"))
            if getattr(self, name) % heads:
                raise ValueError(f"{name}={getattr(self, name)} is not divisible by its head count {heads}")
        return self


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed encoder positional embedding [length, channels]."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class LayerNorm(nn.Module):
    def __init__(self, n: int, ops: KernelSet):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.ops = ops

    def forward(self, x):
        return self.ops.layer_norm(x, self.weight, self.bias, 1e-5)


class Linear(nn.Module):
    def __init__(self, n_in: int, n_out: int, ops: KernelSet, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
        self.ops = ops

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias)


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int, ops: KernelSet):
        super().__init__()
        self.fc1, self.fc2, self.ops = Linear(d, hidden or 4 * d, ops), Linear(hidden or 4 * d, d, ops), ops

    def forward(self, x):
        # gelu(x @ W1.T + b1) with the bias folded into the activation (fused in the Triton set)
        return self.fc2(self.ops.gelu(self.ops.linear(x, self.fc1.weight), self.fc1.bias))


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection (Whisper's key projection has no bias:
    its slice of the fused bias stays zero)."""

    def __init__(self, d: int, heads: int, ops: KernelSet):
        super().__init__()
        self.heads, self.ops = heads, ops
        self.qkv = Linear(d, 3 * d, ops)
        self.out = Linear(d, d, ops)

    def forward(
        self,
        x,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        offset: int = 0,
        position: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ):
        """x [B, T, d]. With cache (k, v each [B, H, max_len, Dh]) the new keys/values are written at
        positions offset..offset+T-1 and attention runs over positions < offset+T, causally. Without a
        cache (the encoder) `lengths` [B] limits each row's keys to its first lengths[b] positions.

        `position` (int64 [1] on the device, T == 1) replaces `offset` for a decode step with fixed
        shapes and no host sync (capturable as a CUDA/HIP graph): the key/value go to that slot and
        attention runs over the whole cache with the keys past the position masked by length."""
        B, T, d = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, T, Dh]
        if position is not None:
            kc, vc = cache
            kc.index_copy_(2, position, k)
            vc.index_copy_(2, position, v)
            o = self.ops.attention(q, kc, vc, causal=True, lengths=(position + 1).expand(B))
        elif cache is not None:
            kc, vc = cache
            kc[:, :, offset : offset + T] = k
            vc[:, :, offset : offset + T] = v
            k, v = kc[:, :, : offset + T], vc[:, :, : offset + T]
            o = self.ops.attention(q, k, v, causal=True)
        else:
            o = self.ops.attention(q, k, v, causal=False, lengths=lengths)
        return self.out(o.transpose(1, 2).reshape(B, T, d))


class CrossAttention(nn.Module):
    def __init__(self, d: int, heads: int, ops: KernelSet):
        super().__init__()
        self.heads, self.ops = heads, ops
        self.q = Linear(d, d, ops)
        self.kv = Linear(d, 2 * d, ops, bias=True)  # key half of the bias is zero
        self.out = Linear(d, d, ops)

    def project_kv(self, xa):
        """Encoder states [B, S, d] -> keys, values [B, H, S, Dh], once per audio window."""
        B, S, d = xa.shape
        kv = self.kv(xa).view(B, S, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return kv[0].contiguous(), kv[1].contiguous()

    def scores(self, x, kv):
        """Attention logits q.k/sqrt(Dh) [B, H, T, S] before the softmax: what word timing reads."""
        B, T, d = x.shape
        q = self.q(x).view(B, T, self.heads, d // self.heads).transpose(1, 2)
        return (q.float() @ kv[0].float().transpose(-1, -2)) / math.sqrt(d // self.heads)

    def forward(self, x, kv, lengths=None):
        """`lengths` [B]: each row's encoder positions (keys past them are padding)."""
        B, T, d = x.shape
        q = self.q(x).view(B, T, self.heads, d // self.heads).transpose(1, 2)
        o = self.ops.attention(q, kv[0], kv[1], causal=False, lengths=lengths)
        return self.out(o.transpose(1, 2).reshape(B, T, d))


class EncoderBlock(nn.Module):
    def __init__(self, d, heads, ffn, ops):
        super().__init__()
        self.attn_ln, self.attn = LayerNorm(d, ops), SelfAttention(d, heads, ops)
        self.mlp_ln, self.mlp = LayerNorm(d, ops), MLP(d, ffn, ops)

    def forward(self, x, lengths=None):
        x = x + self.attn(self.attn_ln(x), lengths=lengths)
        return x + self.mlp(self.mlp_ln(x))


class DecoderBlock(nn.Module):
    def __init__(self, d, heads, ffn, ops):
        super().__init__()
        self.attn_ln, self.attn = LayerNorm(d, ops), SelfAttention(d, heads, ops)
        self.cross_attn_ln, self.cross_attn = LayerNorm(d, ops), CrossAttention(d, heads, ops)
        self.mlp_ln, self.mlp = LayerNorm(d, ops), MLP(d, ffn, ops)

    def forward(self, x, cache, offset, cross_kv, position=None, cross_lengths=None, scores=None):
        """`scores`: a list to append this block's cross-attention logits [B, H, T, S] to (word timing)."""
        x = x + self.attn(self.attn_ln(x), cache, offset, position)
        h = self.cross_attn_ln(x)
        if scores is not None:
            scores.append(self.cross_attn.scores(h, cross_kv))
        x = x + self.cross_attn(h, cross_kv, cross_lengths)
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, c: WhisperConfig, ops: KernelSet):
        super().__init__()
        d = c.n_audio_state
        self.conv1 = nn.Conv1d(c.n_mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(c.n_audio_ctx, d))
        self.blocks = nn.ModuleList(EncoderBlock(d, c.n_audio_head, c.n_audio_ffn, ops) for _ in range(c.n_audio_layer))
        self.ln_post = LayerNorm(d, ops)
        self.ops = ops

    def forward(self, mel, stop=None, lengths=None):
        """mel [B, n_mels, 2 * S] -> [B, S, d] for S <= n_audio_ctx (1500: a 30-second window). Whisper
        was trained on whole windows; a shorter S encodes only the start of one (whisper.cpp's audio_ctx),
        with `lengths` [B] (<= S) the positions of each row that hold its audio: its keys stop there, so a
        row's encoding does not depend on the others of its batch. `stop()`, if given, is asked between
        blocks; True abandons the pass (returns None)."""
        x = self.ops.gelu(self.conv1(mel))
        x = self.ops.gelu(self.conv2(x)).transpose(1, 2)
        S = x.shape[1]
        if mel.shape[-1] % 2 or S > self.positional_embedding.shape[0]:
            raise ValueError(
                f"encoder takes an even number of mel frames, at most {2 * self.positional_embedding.shape[0]}; "
                f"got {mel.shape[-1]}"
            )
        x = x + self.positional_embedding[:S].to(x.dtype)
        for b in self.blocks:
            if stop is not None and stop():
                return None
            x = b(x, lengths)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, c: WhisperConfig, ops: KernelSet):
        super().__init__()
        d = c.n_text_state
        self.token_embedding = nn.Embedding(c.n_vocab, d)
        self.positional_embedding = nn.Parameter(torch.empty(c.n_text_ctx, d))
        self.blocks = nn.ModuleList(DecoderBlock(d, c.n_text_head, c.n_text_ffn, ops) for _ in range(c.n_text_layer))
        self.ln = LayerNorm(d, ops)
        self.ops = ops

    def forward(self, tokens, caches, offset, cross_kvs, last_only=True, position=None, cross_lengths=None):
        """tokens [B, T] at positions offset.. -> logits [B, vocab] (last position) or [B, T, vocab].
        `position` (int64 [1] tensor, T == 1): a fixed-shape decode step at that position instead of
        `offset` (see SelfAttention.forward). `cross_lengths` [B]: each row's encoder positions."""
        return self.logits(self.hidden(tokens, caches, offset, cross_kvs, last_only, position, cross_lengths))

    def hidden(self, tokens, caches, offset, cross_kvs, last_only=True, position=None, cross_lengths=None, scores=None):
        """The blocks and the final norm -> [B, d] (last position) or [B, T, d]: many small ops. `scores`:
        a list that gets each block's cross-attention logits [B, H, T, S] (see DecoderBlock)."""
        T = tokens.shape[1]
        if position is not None:
            if T != 1:
                raise ValueError(f"a decode step at a tensor position takes one token per row, got {T}")
            pos = self.positional_embedding.index_select(0, position)
        else:
            pos = self.positional_embedding[offset : offset + T]
        x = self.token_embedding(tokens) + pos
        for b, cache, kv in zip(self.blocks, caches, cross_kvs):
            x = b(x, cache, offset, kv, position, cross_lengths, scores)
        if last_only:
            x = x[:, -1]
        return self.ln(x)

    def logits(self, x):
        """The tied projection to the vocabulary, in float32: one large, bandwidth-bound matmul."""
        return self.ops.linear(x, self.token_embedding.weight).float()


class Whisper(nn.Module):
    def __init__(self, config: WhisperConfig, ops: KernelSet):
        super().__init__()
        self.config = config.check()
        self.encoder = AudioEncoder(config, ops)
        self.decoder = TextDecoder(config, ops)

    def cross_kv(self, xa):
        return [b.cross_attn.project_kv(xa) for b in self.decoder.blocks]

    def new_cache(self, batch: int, max_len: int, dtype, device):
        c = self.config
        shape = (batch, c.n_text_head, max_len, c.n_text_state // c.n_text_head)
        return [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(c.n_text_layer)
        ]

    def forward(self, mel, tokens):
        """Full (uncached) logits [B, T, vocab] — the reference the cached path is tested against."""
        xa = self.encoder(mel)
        caches = self.new_cache(tokens.shape[0], tokens.shape[1], xa.dtype, xa.device)
        return self.decoder(tokens, caches, 0, self.cross_kv(xa), last_only=False)
