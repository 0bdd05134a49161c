"""The `tensorrt` backend: engines built from the exported graphs (export/tensorrt.py), cached by graph hash,
GPU compute capability, TensorRT version, precision and profiles, run on torch CUDA tensors.

Language models run the 'standard' Llama graph (plain ONNX ops): the runner keeps the slot-addressed cache
[layers] x [slots, Hkv, max_seq, D] itself, passes each step the rows' past keys up to the longest one
with an additive attention bias that hides what a row does not hold, and writes the new keys back at each
row's position. Needs the `tensorrt` package and an NVIDIA GPU; neither can be had on the machines this was
written on, so this runner has not run: only what does not need the library (profiles, cache key) and the
graphs themselves (polygraphy against the torch runner) are tested there.
"""

from __future__ import annotations

from pathlib import Path

import torch

try:
    import tensorrt as trt
except ImportError as e:  # backends.get('tensorrt') reports this with the backends that do work
    from speechrt.export.tensorrt import INSTALL

    raise ImportError(f"TensorRT is not installed ({INSTALL})") from e

from speechrt.errors import UserError
from speechrt.export import Manifest, cache_dir, cached_export
from speechrt.export.tensorrt import Limits, build_engine, engine_key, engine_path, profiles

from ..base import Backend, LMRunner, RunnerInfo
from ..dtypes import TORCH

DTYPES = {"float16": torch.float16, "float32": torch.float32}


class Engine:
    """A deserialized engine with one execution context; `run` takes and fills torch CUDA tensors by name."""

    def __init__(self, path: Path, profile_names: list[str]):
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        self.ctx = self.engine.create_execution_context()
        self.profiles = {n: i for i, n in enumerate(profile_names)}
        self.current = None

    def run(self, profile: str, inputs: dict, outputs: dict) -> None:
        stream = torch.cuda.current_stream()
        if self.current != profile:
            self.ctx.set_optimization_profile_async(self.profiles[profile], stream.cuda_stream)
            self.current = profile
        for name, t in inputs.items():
            self.ctx.set_input_shape(name, tuple(t.shape))
            self.ctx.set_tensor_address(name, t.data_ptr())
        for name, t in outputs.items():
            self.ctx.set_tensor_address(name, t.data_ptr())
        if not self.ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")


def engine_for(directory: Path, manifest: Manifest, graph: str, precision: str, limits: Limits) -> Engine:
    """The cached engine of one graph (built now if there is none for this GPU, TensorRT and precision)."""
    prof = profiles(manifest, graph, limits)
    key = engine_key(
        manifest.graph(graph).sha256,
        torch.cuda.get_device_capability(),
        trt.__version__,
        precision,
        {k: {n: list(map(list, s)) for n, s in v.items()} for k, v in prof.items()},
    )
    path = engine_path(cache_dir().parent / "tensorrt", graph, key)
    if not path.exists():
        build_engine(directory / manifest.graph(graph).file, prof, precision, path)
    return Engine(path, list(prof))


class TrtLMRunner(LMRunner):
    def __init__(self, directory: Path, manifest: Manifest, device: torch.device, precision: str, model_name: str):
        from speechrt.export.lm_export import config_from_dict
        from speechrt.models.lm_text import LMTokenizer

        if manifest.variant != "standard":
            raise UserError(
                f"{directory}: the tensorrt runner needs the 'standard' graph (speechrt export lm "
                "--variant standard), not the onnxruntime variant"
            )
        self.config = config_from_dict(manifest.config)
        self.tokenizer = LMTokenizer.load(directory, manifest.extra["tokenizer"])
        self.chat_template = manifest.extra.get("chat_template")
        self.device = device
        self.dtype = TORCH[manifest.cache["dtype"]]
        self.engine = engine_for(directory, manifest, "model", precision, Limits(max_seq=self.config.max_seq_len))
        self.info = RunnerInfo("tensorrt", model_name, "speechrt-onnx", precision, str(device))

    def new_cache(self, max_batch, max_seq):
        from speechrt.models.llama import KVCache

        c = self.config
        shape = (c.n_layers, max_batch, c.n_kv_heads, max_seq, c.head_dim)
        return KVCache(
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            [0] * max_batch,
        )

    def _step(self, profile, cache, slots, tokens, pos, past_len):
        """tokens [N, T] of `slots` at positions pos[n].. with keys up to past_len read -> logits [N, V]."""
        c, dev = self.config, self.device
        N, T = tokens.shape
        S = past_len + T
        j = torch.arange(S, device=dev)
        length = torch.tensor(pos, device=dev)
        q = length[:, None] + torch.arange(T, device=dev)[None]  # [N, T] positions of the new tokens
        # a row sees what it holds (< its length) and its own new keys (at past_len..), causally
        seen = (j[None, None] < length[:, None, None]) | (
            (j[None, None] >= past_len) & (j[None, None] - past_len <= torch.arange(T, device=dev)[None, :, None])
        )
        bias = torch.where(seen, 0.0, float("-inf")).to(self.dtype)[:, None]  # [N, 1, T, S]
        idx = torch.tensor(slots, device=dev)
        ins = {
            "input_ids": tokens.to(dev).contiguous(),
            "position_ids": q.contiguous(),
            "attention_bias": bias.contiguous(),
        }
        if c.sliding_layers:  # Gemma 3: the keys at positions before each query's window masked too
            kpos = torch.where(j[None] < past_len, j[None], length[:, None] + j[None] - past_len)  # [N, S]
            inside = kpos[:, None, :] > q[:, :, None] - c.sliding_window  # [N, T, S]
            ins["attention_bias_local"] = torch.where(seen & inside, 0.0, float("-inf")).to(self.dtype)[:, None]
        outs = {"logits": torch.empty(N, c.vocab_size, device=dev)}
        presents = []
        for i in range(c.n_layers):
            for kind, buf in (("key", cache.k[i]), ("value", cache.v[i])):
                ins[f"past_{kind}.{i}"] = buf.index_select(0, idx)[:, :, :past_len].contiguous()
                out = torch.empty(N, c.n_kv_heads, S, c.head_dim, dtype=self.dtype, device=dev)
                outs[f"present_{kind}.{i}"] = out
                presents.append((buf, out))
        self.engine.run(profile, ins, outs)
        for buf, out in presents:  # the new keys go to each row's own positions
            for n, s in enumerate(slots):
                buf[s, :, pos[n] : pos[n] + T] = out[n, :, past_len:]
        return outs["logits"]

    @torch.inference_mode()
    def prefill(self, cache, slot, tokens, start=0):
        if not 0 <= start <= cache.lengths[slot]:
            raise ValueError(f"slot {slot} holds {cache.lengths[slot]} positions; prefill must start within them")
        logits = self._step("prefill", cache, [slot], tokens.view(1, -1), [start], start)
        cache.lengths[slot] = start + tokens.shape[0]
        return logits[0]

    @torch.inference_mode()
    def decode_step(self, cache, slots, tokens):
        slots = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        pos = [cache.lengths[s] for s in slots]
        logits = self._step("decode", cache, slots, tokens.view(-1, 1), pos, max(pos))
        for s in slots:
            cache.lengths[s] += 1
        return logits


class TensorRTBackend(Backend):
    name = "tensorrt"
    families = ("lm",)

    def lm(self, model, device="cuda", dtype=None, step_threads=None):
        dev = torch.device(device if device not in (None, "auto") else "cuda")
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise UserError(
                f"backend 'tensorrt' runs engines on an NVIDIA GPU, not on {device}; no CUDA device is "
                "visible to PyTorch here: use --backend onnxruntime or torch"
            )
        precision = {
            None: "fp16",
            "auto": "fp16",
            "float16": "fp16",
            "fp16": "fp16",
            "float32": "fp32",
            "fp32": "fp32",
            "int8": "int8",
        }.get(dtype)
        if precision is None:
            raise UserError(f"unsupported dtype {dtype!r} for tensorrt; valid: float16, float32, int8 (weight-only)")
        if model.format == "speechrt-onnx":
            d = Path(model.path)
        else:  # the engine's own precision comes from the builder flags; the graph is fp32 (or int8 weights)
            d = cached_export("lm", model, "int8" if precision == "int8" else "fp32", variant="standard")
        return TrtLMRunner(d, Manifest.read(d), dev, precision, model.name)
