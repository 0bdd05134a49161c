"""Llama's linear layers as ONNX nodes in an export's precision: float MatMuls, MatMulNBits over a GGUF's 4-bit
blocks (kept exactly, with Q4_1's minimum as a block-sum correction) or 8-bit blocks, the same blocks dequantized
to a float matrix as ONNX Runtime loads the graph (the prompts' graph), or weight-only int8 dequantized in the
graph (the standard variant)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from speechrt.models.llama_layers import quantize_int4

from .graph_builder import MS, GraphBuilder

BLOCK = 32


def _pack4(q: np.ndarray) -> np.ndarray:
    """q [N, K] in 0..15 -> MatMulNBits' B [N, K/32, 16]: weight 2j in the low nibble of byte j."""
    N, K = q.shape
    q = q.reshape(N, K // BLOCK, BLOCK // 2, 2).astype(np.uint8)
    return q[..., 0] | (q[..., 1] << 4)


def int8_blocks(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """float [N, K] -> (uint8 q [N, K/32, 32] with zero point 128, scale [N, K/32]), symmetric per block."""
    N, K = w.shape
    g = w.float().reshape(N, K // BLOCK, BLOCK)
    scale = (g.abs().amax(-1) / 127).clamp_min(1e-12)
    q = torch.round(g / scale[..., None]).clamp_(-127, 127) + 128
    return q.to(torch.uint8).numpy(), scale.numpy()


class LinearWeights:
    """Adds the linear layers of one graph (`g`): `weights` the model's float tensors by name, `q4` a GGUF's 4-bit
    blocks (q, scale, zero) by name, `fdt` the activations' numpy dtype; rows: the prompts' graph of a
    block-quantized export (plain matmuls on the blocks dequantized to float32 at load time, see LlamaGraph). Both
    graphs of an export name the same blocks alike, so that their shared weight file holds them once."""

    def __init__(self, g: GraphBuilder, weights: dict, q4: dict, precision: str, variant: str, fdt, rows: bool = False):
        self.g, self.w, self.q4, self.fdt, self.rows = g, weights, q4, fdt, rows
        self.precision, self.variant = precision, variant
        self.requantized: list[str] = []  # linear weights without 4-bit blocks in the file (int4 only)
        self.eight_bit: list[str] = []  # int4 of a file with 4-bit blocks: its other linear weights, in 8-bit blocks

    def _blocks(self, names: list[str]):
        """(q, scale, zero) of fused weights `names`: the file's blocks, or min/max 4-bit quantization."""
        if all(n in self.q4 for n in names):
            return tuple(torch.cat([self.q4[n][i] for n in names]) for i in range(3))
        self.requantized += names
        return quantize_int4(torch.cat([self.w[n] for n in names]))

    def linear(self, x: str, names: list[str], tag: str) -> str:
        """x [..., K] @ W.T for the fused weights `names` ([N, K] each) in this graph's precision."""
        g, p = self.g, self.precision
        if p in ("fp32", "fp16") or (p == "int8" and self.variant == "standard"):
            w = torch.cat([self.w[n] for n in names])
            if p == "int8":  # weight-only int8 with per-row scales, dequantized in the graph
                return self._dq_linear(x, w, tag)
            return g.op("MatMul", [x, g.init(f"{tag}.weight", w.T.numpy().astype(self.fdt))], name=tag)
        # int4 from a file with 4-bit blocks (a GGUF): its other weights (Q5_0, Q6_K, Q8_0, ...) in 8-bit blocks, not
        # re-quantized to 4 bits (as the torch backend's int4 keeps them); a float checkpoint's all in 4 bits
        mixed = p == "int4" and self.q4 and not all(n in self.q4 for n in names)
        if mixed:
            self.eight_bit += names
        if p == "int8" or mixed:
            q, s = int8_blocks(torch.cat([self.w[n] for n in names]))
            zp = np.full(s.shape, 128, np.uint8)
            if self.rows:
                return self._dense(x, q, s, 8, zp, tag)
            return self.nbits(x, q, s, 8, tag, zero_points=zp)
        q, s, z = self._blocks(names)
        q, s = _pack4(q.numpy()), s.numpy()
        if self.rows:
            y = self._dense(x, q, s, 4, np.full(s.shape, 8, np.uint8), tag)
        else:
            y = self.nbits(x, q, s, 4, tag)
        if not torch.any(z != 0):  # Q4_0: nothing to add
            return y
        # the sums of x over each 32-block, [..., K/32]: a reshape and a reduction, no weights to read
        blocks = g.op("Reshape", [x, g.const_i64("block_shape", [0, 0, -1, BLOCK])], name=f"{tag}/blocks")
        sums = g.op("ReduceSum", [blocks, g.const_i64("axes_last", [-1])], name=f"{tag}/block_sums", keepdims=0)
        corr = g.op("MatMul", [sums, g.init(f"{tag}.zero", z.T.numpy().astype(self.fdt))], name=f"{tag}/zero")
        return g.op("Add", [y, corr], name=f"{tag}/add_zero")

    def _dense(self, x: str, q: np.ndarray, scale: np.ndarray, bits: int, zero_points: np.ndarray, tag: str) -> str:
        """x @ W.T with W the blocks dequantized when the graph loads (`dequantize`): prompts run a plain float
        matmul (FusedMatMul, transB) while the file holds the blocks alone. Q4_1's minimum stays a block-sum
        correction at run time (folding its Add too cost 2-4 s more at load): a 43-token prompt took 77-81 ms
        instead of 69-70 (SmolLM2-135M, 2-core Intel Xeon VM), and the cache differs from float weights' by ~1e-6."""
        w = self.dequantize(q, scale, bits, zero_points, tag)
        if self.fdt == np.float16:  # FusedMatMul has no float16 CPU kernel: the transposed matrix is folded too
            return self.g.op("MatMul", [x, self.g.op("Transpose", [w], name=f"{tag}/wT", perm=[1, 0])], name=tag)
        return self.g.op("FusedMatMul", [x, w], name=tag, domain=MS, transB=1)

    def dequantize(self, q: np.ndarray, scale: np.ndarray, bits: int, zero_points: np.ndarray, tag: str) -> str:
        """W = (q - zero point) * scale [N, K] by a blocked DequantizeLinear (opset 21) of the blocks that
        MatMulNBits reads in the decode graph (the same names and bytes: q [N, K/32, bytes] as uint4 / uint8
        [N, K], scale and zero points [N, K/32]). All its inputs are constants: ONNX Runtime folds it into a float
        matrix when it loads the graph with session.disable_quant_qdq=1 (backends/onnxruntime/lm.py)."""
        g = self.g
        N, nb = scale.shape
        ut = TensorProto.UINT4 if bits == 4 else TensorProto.UINT8
        zp = zero_points.reshape(-1).astype(np.uint8)
        if bits == 4:  # two per byte, the first in the low nibble
            zp = np.concatenate([zp, np.zeros(zp.size % 2, np.uint8)])
            zp = zp[0::2] | (zp[1::2] << 4)
        return g.op(
            "DequantizeLinear",
            [
                g.init_raw(f"{tag}.qweight", ut, [N, nb * BLOCK], q.tobytes()),
                g.init(f"{tag}.scales", scale.astype(self.fdt)),
                g.init_raw(f"{tag}.zero_points", ut, [N, nb], zp.tobytes()),
            ],
            name=f"{tag}/dequantize",
            axis=1,
            block_size=BLOCK,
        )

    def _block_inits(self, q, scale, tag, zero_points=None) -> list[str]:
        """MatMulNBits' initializers of blocks q [N, K/32, bytes], scale [N, K/32] -> their names."""
        g = self.g
        N, nb = scale.shape
        ins = [
            g.init(f"{tag}.qweight", q.reshape(N, nb, -1)),
            g.init(f"{tag}.scales", scale.reshape(-1).astype(self.fdt)),
        ]
        if zero_points is not None:
            ins.append(g.init(f"{tag}.zero_points", zero_points.reshape(-1)))
        return ins

    def nbits(self, x, q, scale, bits, tag, zero_points=None):
        return self.g.op(
            "MatMulNBits",
            [x] + self._block_inits(q, scale, tag, zero_points),
            name=tag,
            domain=MS,
            K=scale.shape[1] * BLOCK,
            N=scale.shape[0],
            bits=bits,
            block_size=BLOCK,
            accuracy_level=4,
        )

    def _dq_linear(self, x, w, tag):
        g = self.g
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12)  # per output channel
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        wt = g.op(
            "DequantizeLinear",
            [
                g.init(f"{tag}.qweight", q.T.contiguous().numpy()),
                g.init(f"{tag}.scale", scale.numpy().astype(self.fdt)),
            ],
            name=f"{tag}/dq",
            axis=1,
        )
        return g.op("MatMul", [x, wt], name=tag)
