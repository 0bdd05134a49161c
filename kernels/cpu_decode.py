"""Launcher of cpu_decode.c: a Llama decode step on x86 CPUs with AVX2 (the torch backend's int4 decode on
the CPU), and its block-quantized matmul on its own (for tests and benchmarks).

The C file is compiled on first use with the system's C compiler (`$CC`, else cc / gcc: -O3 -mavx2 -mfma
-mf16c -fopenmp, and its int8 dot products as VNNI instructions where the CPU has AVX-VNNI or AVX512-VNNI with
AVX512-VL: `vnni_flags`; SPEECHRT_CPU_DECODE_VNNI=0 keeps the AVX2 form) into speechrt's cache directory, keyed
by the source's hash and the flags, and loaded with ctypes; a
machine without AVX2/FMA/F16C, an x86-64 CPU or a compiler does not get it (`unavailable()` says why) and
the callers keep their torch path. `kernels.reference.block_linear` is the definition the matmul is tested
against.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from speechrt.machine import cache_home, cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC"]
MAX_ROWS = 64  # activation rows per call (MAXM in the C file): a decode step's batch
GROUP = 8  # output rows per packed group
BLOCK = 32  # inputs per quantization block
PAIRS = [0, 4, 1, 5, 2, 6, 3, 7]  # 4-bit rows of a group as the kernel loads them
UNPAIRS = [PAIRS.index(i) for i in range(GROUP)]


class _Mat(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("bits", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", ctypes.c_void_p),
        ("ffn_norm", ctypes.c_void_p),
        ("qkv", _Mat),
        ("o", _Mat),
        ("gate_up", _Mat),
        ("down", _Mat),
        ("qkv_bias", ctypes.c_void_p),  # NULL where the model has none
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("post_attn_norm", ctypes.c_void_p),  # Gemma 3's; NULL where the model has none
        ("post_ffn_norm", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),  # the layer's rotary tables; NULL: the model's
        ("sin", ctypes.c_void_p),
        ("window", ctypes.c_int64),  # a sliding window's positions; 0: all
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_int64) for n in ("dim", "n_layers", "n_heads", "n_kv", "head_dim", "hidden", "vocab", "max_pos")
    ] + [
        ("eps", ctypes.c_float),
        ("emb", ctypes.c_void_p),
        ("norm", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("layers", ctypes.POINTER(_Layer)),
        ("head", _Mat),
        ("act", ctypes.c_int64),  # 0 SiLU, 1 GELU (tanh)
    ]


def cache_root() -> Path:
    """Where the compiled kernel lives: speechrt's cache (speechrt.machine.cache_home) / native."""
    return cache_home() / "native"


def _compiler() -> str | None:
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return c
    return None


def vnni_flags() -> list[str]:
    """The compiler flags that turn the kernel's int8 dot products into VNNI instructions (vpdpbusd: one
    instruction where AVX2 takes vpmaddubsw + vpmaddwd, the same integer sums) on this CPU, or [] where it has
    neither AVX-VNNI nor AVX512-VNNI with AVX512-VL, or SPEECHRT_CPU_DECODE_VNNI=0."""
    if os.environ.get("SPEECHRT_CPU_DECODE_VNNI", "1") == "0":
        return []
    flags = cpu_flags() or set()
    if "avx_vnni" in flags:
        return ["-mavxvnni", "-DSRT_VNNI"]
    if {"avx512_vnni", "avx512vl"} <= flags:
        return ["-mavx512vnni", "-mavx512vl", "-DSRT_VNNI"]
    return []


def _build(cc: str, flags: list[str], lib: Path) -> Path:
    """Compile the kernel into `lib` unless it is there (atomic: a concurrent build of the same key writes the
    same bytes)."""
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    # made once per machine and compiler: said on stderr, as the exports made on first use are
    sys.stderr.write(f"speechrt: compiling the CPU decode kernel with {cc} into {lib.parent} (once)\n")
    sys.stderr.flush()
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(r.stderr.strip())
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built %s with %s", lib, cc)
    return lib


@lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    return library()


def library(root: Path | None = None, vnni: bool | None = None) -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled kernel, None), built into `root` (default: cache_root()) if it is not there yet; or (None,
    why it cannot be) on this machine. `vnni`: None, VNNI where the CPU has it (`vnni_flags`) and it builds,
    else the AVX2 form; False, the AVX2 form; True, VNNI or (None, why not)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"needs an x86-64 CPU (this is {platform.machine()})"
    missing = {"avx2", "fma", "f16c"} - (cpu_flags() or set())
    if missing:
        return None, f"needs the CPU features avx2, fma, f16c (missing: {', '.join(sorted(missing))})"
    cc = _compiler()
    if cc is None:
        return None, "needs a C compiler (set $CC, or install gcc)"
    extra = vnni_flags() if vnni is not False else []
    if vnni and not extra:
        return None, "VNNI needs AVX-VNNI or AVX512-VNNI with AVX512-VL (and SPEECHRT_CPU_DECODE_VNNI not 0)"
    src = SOURCE.read_bytes()
    # a VNNI build that fails (e.g. a compiler without the VNNI intrinsics) gives way to the AVX2 form
    attempts = [FLAGS + extra] + ([FLAGS] if extra and vnni is None else [])
    for i, flags in enumerate(attempts):
        key = hashlib.sha256(src + " ".join([cc] + flags).encode()).hexdigest()[:16]
        try:
            lib = _build(cc, flags, (root or cache_root()) / f"cpu_decode-{key}.so")
            dll = ctypes.CDLL(str(lib))
            break
        except (OSError, subprocess.SubprocessError, RuntimeError) as e:  # no writable cache, a failing compiler
            why = f"could not build {SOURCE.name} with {cc}: {str(e)[-400:]}"
            if i + 1 < len(attempts):
                log.warning("%s; building it without VNNI", why)
    else:
        return None, why
    dll.srt_matmul.argtypes = [
        ctypes.POINTER(_Mat),
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    dll.srt_forward.argtypes = (
        [ctypes.POINTER(_Model), ctypes.c_int64]
        + [ctypes.c_void_p] * 6
        + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    )
    return dll, None


def unavailable() -> str | None:
    """None where the step can run here; otherwise why not (what the machine lacks)."""
    if os.environ.get("SPEECHRT_CPU_DECODE", "1") == "0":
        return "turned off by SPEECHRT_CPU_DECODE=0"
    return _load()[1]


def _lib() -> ctypes.CDLL:
    dll, why = _load()
    if dll is None:
        raise RuntimeError(f"the CPU decode step cannot run here: {why}")
    return dll


def _f16_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16).contiguous().view(torch.uint8)


class Packed:
    """A weight matrix [N, K] in the kernel's layout (see cpu_decode.c): 4-bit values q in 0..15 with
    w = d * (q - 8) + z, or 8-bit q in -127..127 with w = d * q, per block of 32 inputs; d, z in fp16."""

    def __init__(self, data: torch.Tensor, n: int, k: int, bits: int):
        self.data, self.n, self.k, self.bits = data, n, k, bits
        self.mat = _Mat(data.data_ptr(), n, k, bits)

    @classmethod
    def q4(cls, q: torch.Tensor, d: torch.Tensor, z: torch.Tensor) -> Packed:
        """q [N, K] integers 0..15, d / z [N, K // 32] (rounded to fp16): models.gguf_loader's (q, scale,
        zero) blocks as they are."""
        N, K = q.shape
        _check(K, d.shape, N)
        nb, Np = K // BLOCK, -(-N // GROUP) * GROUP
        qb = q.to(torch.uint8).view(N, nb, BLOCK)
        qs = qb[..., :16] | (qb[..., 16:] << 4)  # byte j: value j (low nibble) and value j + 16 (high)
        out = torch.zeros(Np // GROUP, nb, 160, dtype=torch.uint8)
        # rows of a group in the order 0 4 1 5 2 6 3 7: each 32-byte load of the kernel holds rows r and r + 4
        qs = _rows(qs, Np).reshape(Np // GROUP, GROUP, nb, 16)[:, PAIRS]
        out[:, :, :128] = qs.transpose(1, 2).reshape(-1, nb, 128)
        out[:, :, 128:144] = _groups_f16(d, Np)
        out[:, :, 144:160] = _groups_f16(z, Np)
        return cls(out, N, K, 4)

    @classmethod
    def q8(cls, w: torch.Tensor) -> Packed:
        """float w [N, K] -> 8 bits per weight, a scale per block of 32 (max |w| / 127: a Q8_0 tensor's
        dequantized values come back as its own blocks)."""
        N, K = w.shape
        _check(K, (N, K // BLOCK), N)
        nb, Np = K // BLOCK, -(-N // GROUP) * GROUP
        wb = w.float().view(N, nb, BLOCK)
        lo, hi = torch.aminmax(wb, dim=-1)
        d = torch.maximum(hi, -lo) / 127
        # times the inverse: twice as fast as dividing; a block of zeros has d 0 and stays 0
        q = (wb * torch.where(d > 0, 1 / d, 0.0)[..., None]).round_().to(torch.int8)
        out = torch.zeros(Np // GROUP, nb, 272, dtype=torch.uint8)
        qs = _rows(q.view(torch.uint8), Np).reshape(Np // GROUP, GROUP, nb, BLOCK)
        out[:, :, :256] = qs.transpose(1, 2).reshape(-1, nb, 256)
        out[:, :, 256:272] = _groups_f16(d, Np)
        return cls(out, N, K, 8)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The values back from the layout: (q [N, K], d [N, K/32] float32, z or None) — what the
        reference computes with."""
        G, nb, _ = self.data.shape
        if self.bits == 4:
            qs = self.data[:, :, :128].reshape(G, nb, GROUP, 16).transpose(1, 2)[:, UNPAIRS].reshape(G * GROUP, nb, 16)
            q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(G * GROUP, -1)
            dm = self.data[:, :, 128:160].reshape(G, nb, 2, GROUP, 2).permute(2, 0, 3, 1, 4).contiguous()
            d, z = (dm[i].view(torch.float16).reshape(G * GROUP, nb).float() for i in range(2))
            return q[: self.n], d[: self.n], z[: self.n]
        qs = self.data[:, :, :256].reshape(G, nb, GROUP, BLOCK).transpose(1, 2).reshape(G * GROUP, -1)
        d = self.data[:, :, 256:272].reshape(G, nb, GROUP, 2).transpose(1, 2).contiguous()
        return (
            qs.contiguous().view(torch.int8)[: self.n],
            d.view(torch.float16).reshape(G * GROUP, nb).float()[: self.n],
            None,
        )

    def __call__(
        self, x: torch.Tensor, threads: int = 1, fine: bool = False, lib: ctypes.CDLL | None = None
    ) -> torch.Tensor:
        """x [M, K] float32 (M <= MAX_ROWS, or MAX_ROWS / 2 `fine`) -> [M, N] float32 (reference.block_linear);
        `lib`: a build of the kernel from `library` (default: the one this machine uses)."""
        M, K = x.shape
        limit = MAX_ROWS // 2 if fine else MAX_ROWS
        if K != self.k or not 1 <= M <= limit:
            raise ValueError(f"x must be [1..{limit}, {self.k}], got {tuple(x.shape)}")
        x = x.float().contiguous()
        y = torch.empty(M, self.n)
        if (lib or _lib()).srt_matmul(ctypes.byref(self.mat), x.data_ptr(), M, y.data_ptr(), int(fine), threads):
            raise RuntimeError("srt_matmul refused its arguments")
        return y


def _check(K: int, groups_shape, N: int) -> None:
    if K % BLOCK:
        raise ValueError(f"block-quantized weights need K a multiple of {BLOCK}, got {K}")
    if tuple(groups_shape) != (N, K // BLOCK):
        raise ValueError(f"scales must be [{N}, {K // BLOCK}], got {tuple(groups_shape)}")


def _rows(t: torch.Tensor, Np: int) -> torch.Tensor:
    """Zero rows appended up to Np (a whole last group)."""
    return torch.cat([t, t.new_zeros(Np - t.shape[0], *t.shape[1:])]) if Np > t.shape[0] else t


def _groups_f16(s: torch.Tensor, Np: int) -> torch.Tensor:
    """[N, nb] scales -> [Np / 8, nb, 16] bytes: each group's 8 fp16 values per block."""
    nb = s.shape[1]
    b = _f16_bytes(_rows(s.float(), Np)).view(Np // GROUP, GROUP, nb, 2)
    return b.transpose(1, 2).reshape(Np // GROUP, nb, 2 * GROUP)


def _pack(names: list[str], weights: dict, q4: dict, reuse: Packed | None) -> Packed:
    """The linears `names` (rows stacked) in the kernel's layout: 4-bit blocks where q4 has them all, else 8-bit
    blocks of their float weights; `reuse`: the layout a previous build made of them, checked against their shape."""
    bits = 4 if all(n in q4 for n in names) else 8
    if reuse is None:
        if bits == 4:
            return Packed.q4(*(torch.cat([q4[n][j] for n in names]) for j in range(3)))
        return Packed.q8(torch.cat([weights[n].float() for n in names]))
    shapes = [(q4[n][0] if bits == 4 else weights[n]).shape for n in names]
    n, k = sum(int(s[0]) for s in shapes), int(shapes[0][1])
    layout = (-(-n // GROUP), k // BLOCK, 160 if bits == 4 else 272)
    if (reuse.n, reuse.k, reuse.bits) != (n, k, bits) or tuple(reuse.data.shape) != layout:
        raise ValueError(
            f"a packed weight of {names[0]} is [{reuse.n}, {reuse.k}] {reuse.bits}-bit, not [{n}, {k}] {bits}-bit"
        )
    return reuse


class CpuLlama:
    """A Llama's decode steps and prompts in cpu_decode.c: `cfg` a models.llama.LlamaConfig; `weights` float
    tensors named as models.gguf_loader names them (the embedding, norms, and the float weights of linears
    without 4-bit blocks); `q4[name] = (q, scale, zero)`, a linear's 4-bit blocks as models.gguf_loader keeps
    them (w = (q - 8) * scale + zero); cos / sin [positions, head_dim / 2] the rotary tables, `local_rope` those of
    the sliding-window layers where they differ (Gemma 3). A fused projection without blocks for all its parts, and
    the output head, become 8-bit blocks of their float weights (a GGUF's Q8_0 tensors exactly). The caches
    (`new_cache`) hold fp16 keys and values. Gemma 3's switches (cfg.act, post_norms, sliding window, embed_scale,
    final_softcap) are the kernel's too; the embedding is kept scaled, the head reads it unscaled. `packed`: the
    `packs` of an earlier build of the same weights (backends/torch/cpu_lm_cache), reused once their shapes fit."""

    max_rows = MAX_ROWS

    def __init__(
        self,
        cfg,
        weights: dict,
        q4: dict,
        cos: torch.Tensor,
        sin: torch.Tensor,
        threads: int,
        local_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        packed: list[Packed] | None = None,
    ):
        why = self.unsupported(cfg)
        if why:
            raise ValueError(why)
        self.cfg, self.threads = cfg, threads
        self.packs: list[Packed] = []
        f32 = [t.float().contiguous() for t in (weights["tok_embeddings"], weights["norm"], cos, sin)]
        self.emb, self.norm, self.cos, self.sin = f32
        if cfg.embed_scale != 1.0:
            self.emb = self.emb * cfg.embed_scale
        self.local = tuple(t.float().contiguous() for t in local_rope) if local_rope else (self.cos, self.sin)
        self.norms = [
            (
                weights[f"layers.{i}.attn_norm"].float().contiguous(),
                weights[f"layers.{i}.ffn_norm"].float().contiguous(),
            )
            for i in range(cfg.n_layers)
        ]

        def pack(names):
            self.packs.append(_pack(names, weights, q4, None if packed is None else packed[len(self.packs)]))
            return self.packs[-1].mat

        self.extras = []  # Qwen2's Q/K/V biases, head norms, post norms: float32, alive as long as the model

        def extra(t) -> int | None:
            self.extras.append(t.float().contiguous())
            return self.extras[-1].data_ptr()

        layers = []
        for i, (an, fn) in enumerate(self.norms):
            n = f"layers.{i}."
            bias = extra(torch.cat([weights[n + b] for b in ("bq", "bk", "bv")])) if cfg.qkv_bias else None
            qn, kn = (extra(weights[n + "q_norm"]), extra(weights[n + "k_norm"])) if cfg.qk_norm else (None, None)
            pa, pf = (
                (extra(weights[n + "post_attn_norm"]), extra(weights[n + "post_ffn_norm"]))
                if cfg.post_norms
                else (
                    None,
                    None,
                )
            )
            rope = self.local if i in cfg.sliding_layers else (self.cos, self.sin)
            layers.append(
                _Layer(
                    an.data_ptr(),
                    fn.data_ptr(),
                    pack([n + "wq", n + "wk", n + "wv"]),
                    pack([n + "wo"]),
                    pack([n + "w_gate", n + "w_up"]),
                    pack([n + "w_down"]),
                    bias,
                    qn,
                    kn,
                    pa,
                    pf,
                    rope[0].data_ptr(),
                    rope[1].data_ptr(),
                    cfg.window(i),
                )
            )
        self.layers = (_Layer * len(layers))(*layers)
        head = pack(["tok_embeddings" if cfg.tie_embeddings else "output"])
        self.struct = _Model(
            cfg.dim,
            cfg.n_layers,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            cfg.hidden_dim,
            cfg.vocab_size,
            self.cos.shape[0],
            cfg.norm_eps,
            self.emb.data_ptr(),
            self.norm.data_ptr(),
            self.cos.data_ptr(),
            self.sin.data_ptr(),
            self.layers,
            head,
            {"silu": 0, "gelu_tanh": 1}[cfg.act],
        )

    @staticmethod
    def unsupported(cfg) -> str | None:
        """None where a model of `cfg` fits the kernel, else why not."""
        if cfg.head_dim % 8 or cfg.head_dim > 256:
            return f"the CPU kernel needs head_dim a multiple of 8 up to 256, got {cfg.head_dim}"
        if cfg.n_heads // cfg.n_kv_heads > 16:
            return f"the CPU kernel takes up to 16 query heads per kv head, got {cfg.n_heads // cfg.n_kv_heads}"
        if cfg.dim % BLOCK or cfg.hidden_dim % BLOCK or (cfg.n_heads * cfg.head_dim) % BLOCK:
            return f"the CPU kernel needs dim, hidden_dim and n_heads * head_dim multiples of {BLOCK}"
        return None

    @staticmethod
    def needs(cfg) -> list[str]:
        """The linear weights of a model of `cfg` (each one 4-bit where q4 has it)."""
        return [
            f"layers.{i}.{n}" for i in range(cfg.n_layers) for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
        ]

    def new_cache(self, max_batch: int, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp16 keys and values [layers, max_batch, Hkv, max_seq, D]."""
        cfg = self.cfg
        if max_seq > self.cos.shape[0]:
            raise ValueError(f"max_seq {max_seq} exceeds the model's context length {self.cos.shape[0]}")
        shape = (cfg.n_layers, max_batch, cfg.n_kv_heads, max_seq, cfg.head_dim)
        return torch.zeros(shape, dtype=torch.float16), torch.zeros(shape, dtype=torch.float16)

    def __call__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        slots: list[int],
        pos: list[int],
        tokens,
        out_rows: list[int] | None = None,
        fine: bool = False,
    ) -> torch.Tensor:
        """Rows of (slot, position, token) into the caches k / v (from new_cache): each token goes into its
        slot at its position and attends over the slot's positions up to it -> logits [len(out_rows), vocab]
        float32 for those rows (None: all). One token per slot is a decode step; a slot's prompt is its tokens
        at consecutive positions. Up to MAX_ROWS rows a call; with `fine` (each matmul's input quantized in two
        int8 terms, ~14 bits: for prompts) up to MAX_ROWS / 2."""
        M, limit = len(slots), MAX_ROWS // 2 if fine else MAX_ROWS
        if not 1 <= M <= limit:
            raise ValueError(f"the CPU kernel takes 1..{limit} rows a call{' (fine)' if fine else ''}, got {M}")
        if (
            k.dtype != torch.float16
            or k.stride() != v.stride()
            or k.stride(-1) != 1
            or k.shape[-1] != self.cfg.head_dim
        ):
            raise ValueError("the CPU kernel needs fp16 caches of one layout (new_cache)")
        if len(pos) != M or min(pos) < 0 or max(pos) >= k.shape[3] or min(slots) < 0 or max(slots) >= k.shape[1]:
            raise ValueError(
                f"slots must be within the cache's {k.shape[1]} and positions within its {k.shape[3]}, "
                f"got slots {slots}, positions {pos}"
            )
        rows = list(range(M)) if out_rows is None else list(out_rows)
        tok = torch.as_tensor(tokens, dtype=torch.int64).contiguous()
        sl, ps, out = (torch.tensor(a, dtype=torch.int64) for a in (slots, pos, rows))
        strides = torch.tensor(k.stride()[:4], dtype=torch.int64)
        logits = torch.empty(len(rows), self.cfg.vocab_size)
        rc = _lib().srt_forward(
            ctypes.byref(self.struct),
            M,
            tok.data_ptr(),
            sl.data_ptr(),
            ps.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            strides.data_ptr(),
            len(rows),
            out.data_ptr(),
            logits.data_ptr(),
            int(fine),
            self.threads,
        )
        if rc:
            raise RuntimeError(
                f"srt_forward refused its arguments ({rc}): tokens within the vocabulary, positions "
                "within the rotary table, output rows among the rows"
            )
        cap = self.cfg.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
