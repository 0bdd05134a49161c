"""onnxruntime-genai as a peer of `speechrt bench lm`, on the same weights: the GGUF is written out as a
Hugging Face folder (transformers dequantizes it), then onnxruntime-genai's own builder makes its int4 CPU
graph (accuracy level 4: int8 activations), offline. Both are cached beside speechrt's exports.

transformers loads a GGUF but refuses `save_pretrained` on that model, so the folder is written from a
model built with `from_config` that loads the GGUF model's state dict. The builder needs `onnx_ir` and
`onnxscript` installed beside `onnxruntime-genai` (pip install 'speechrt[bench]').
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

INSTALL = "pip install onnxruntime-genai onnx-ir onnxscript transformers accelerate"


def build(gguf: Path, out_root: Path, log=print) -> Path:
    """The genai int4 model directory for `gguf` (built now if it is not in `out_root`)."""
    st = gguf.stat()
    out = out_root / f"genai-{gguf.stem}-{st.st_size:x}-{int(st.st_mtime):x}-int4"
    if (out / "genai_config.json").exists():
        return out
    hf = out_root / f"hf-{gguf.stem}-{st.st_size:x}-{int(st.st_mtime):x}"
    if not (hf / "config.json").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        log(f"  (writing {gguf.name} as a Hugging Face folder for onnxruntime-genai's builder)")
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
        cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(str(hf), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(hf))
    log("  (building onnxruntime-genai's int4 graph: builder -p int4 -e cpu, int4_accuracy_level=4)")
    t = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-m",
            str(hf),
            "-i",
            str(hf),
            "-o",
            str(out),
            "-p",
            "int4",
            "-e",
            "cpu",
            "-c",
            str(out_root / "genai-build-cache"),
            "--extra_options",
            "int4_accuracy_level=4",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"onnxruntime-genai's builder failed: {(r.stderr or r.stdout)[-800:]}")
    log(f"  (built in {time.perf_counter() - t:.0f} s)")
    return out


class Genai:
    """Greedy decoding of token-id prompts with onnxruntime-genai (batch: prompts left-padded by its own
    rules through append_tokens on a [B, T] array)."""

    name = "onnxruntime-genai"

    def __init__(self, gguf: Path, out_root: Path, threads: int):
        import onnxruntime_genai as og

        self.og = og
        d = build(gguf, out_root, log=lambda m: print(m, file=sys.stderr))
        config = og.Config(str(d))
        config.clear_providers()
        # the same intra-op threads as every other engine (its default is every core of the machine, which
        # oversubscribes a process pinned to fewer: 17.6 tok/s on 2 cores of a 16-core Xeon)
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.model = og.Model(config)
        self.threads = threads
        self.note = f"onnxruntime-genai {og.__version__}, its builder's int4 graph (accuracy level 4) of the same GGUF"
        self.meta = {"backend": "onnxruntime-genai", "precision": "int4", "device": "cpu"}

    def run(self, prompts, n):
        import numpy as np

        og = self.og
        B, T = len(prompts), max(len(p) for p in prompts)
        pad = 0
        ids = np.array([[pad] * (T - len(p)) + list(p) for p in prompts], dtype=np.int32)
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=T + n, batch_size=B, do_sample=False)
        gen = og.Generator(self.model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        gen.get_next_tokens()
        t1 = time.perf_counter()
        for _ in range(n - 1):
            gen.generate_next_token()
        gen.get_next_tokens()
        t2 = time.perf_counter()
        return t1 - t0, B * (n - 1) / (t2 - t1)
