"""TensorRT without TensorRT: optimization profiles derived from manifests, the engine cache key, and the
'standard' Llama graph (plain ONNX ops, what TensorRT parses) checked by polygraphy — `surgeon sanitize`
and `run --onnxrt` against golden outputs of the torch model — on the real SmolLM2 weights (first two
layers, to keep it small). The engine build and run need the tensorrt package and an NVIDIA GPU: that test
skips, saying so, where they are missing."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speechrt.errors import UserError
from speechrt.export.graph_builder import save
from speechrt.export.llama_onnx import LlamaGraph, io
from speechrt.export.manifest import Graph, Manifest, Tensor
from speechrt.export.tensorrt import Limits, engine_key, profiles
from speechrt.export.whisper_export import io as whisper_io
from speechrt.kernels import select
from speechrt.models import gguf_loader
from speechrt.models.llama import Llama
from speechrt.models.registry import resolve
from speechrt.models.whisper import WhisperConfig


def lm_manifest(cfg, variant="standard") -> Manifest:
    ins, outs = io(cfg, variant, "float32")
    return Manifest(
        "lm",
        "x",
        dataclasses.asdict(cfg),
        {"model": Graph("model.onnx", tuple(ins), tuple(outs), "ab")},
        "fp32",
        variant,
    )


@pytest.fixture(scope="module")
def small():
    """SmolLM2's first two layers (real weights) and their standard graph, in fp32."""
    f = gguf_loader.load(resolve(None, "lm").path, keep_layers=2)
    return f, LlamaGraph(f.config, f.weights, f.q4, "fp32", "standard").build(17)


def test_profiles_from_manifest(small):
    f, _ = small
    p = profiles(lm_manifest(f.config), "model", Limits(max_batch=8, max_seq=1024, max_prompt=256))
    assert set(p) == {"prefill", "decode"}
    dec, pre = p["decode"], p["prefill"]
    assert dec["input_ids"] == ((1, 1), (1, 1), (8, 1))
    assert dec["past_key.1"] == ((1, 3, 1, 64), (1, 3, 256, 64), (8, 3, 1023, 64))
    assert dec["attention_bias"][2] == (8, 1, 1, 1024)
    assert pre["input_ids"][2] == (1, 256) and pre["past_value.0"][0] == (1, 3, 0, 64)
    w = WhisperConfig()
    ins, outs = whisper_io(w)["decoder"]
    wm = Manifest(
        "asr", "w", dataclasses.asdict(w), {"decoder": Graph("d.onnx", tuple(ins), tuple(outs), "cd")}, "fp16"
    )
    wp = profiles(wm, "decoder", Limits(max_batch=5))["any"]
    assert wp["tokens"] == ((1, 1), (1, 1), (5, 448)) and wp["self_key.0"][2] == (5, 6, 448, 64)
    assert wp["cross_value.3"][0] == (1, 6, 1500, 64)
    odd = Manifest("asr", "w", {}, {"g": Graph("g.onnx", (Tensor("x", "float32", ("widgets",)),), ())}, "fp32")
    with pytest.raises(UserError, match="'widgets' without a profile range"):
        profiles(odd, "g")
    with pytest.raises(UserError, match="opt_batch"):
        Limits(opt_batch=9, max_batch=8)


def test_engine_key():
    base = ("a" * 64, (8, 9), "10.13.0", "fp16", {"decode": {"x": [[1], [1], [8]]}})
    k = engine_key(*base)
    assert k == engine_key(*base) and len(k) == 32
    for i, other in enumerate(("b" * 64, (9, 0), "10.14.1", "fp32", {"decode": {"x": [[1], [2], [8]]}})):
        changed = list(base)
        changed[i] = other
        assert engine_key(*changed) != k, f"the key ignores argument {i}"
    with pytest.raises(UserError, match="valid: fp32, fp16, int8"):
        engine_key("a" * 64, (8, 9), "10", "bf8", {})


def _golden(f, tokens):
    """Torch reference of a prefill: last-position logits and the layers' keys/values (after rotary)."""
    model = Llama(f.config, f.weights, select("torch", "cpu"), torch.device("cpu"), "float32")
    cache = model.new_cache(1, 16)
    with torch.inference_mode():
        logits = model.prefill(cache, 0, torch.tensor(tokens))
    T = len(tokens)
    out = {"logits": logits[None].numpy()}
    for i in range(f.config.n_layers):
        out[f"present_key.{i}"] = cache.k[i, :1, :, :T].numpy()
        out[f"present_value.{i}"] = cache.v[i, :1, :, :T].numpy()
    return out


def _polygraphy(*args, cwd):
    exe = Path(sys.executable).parent / "polygraphy"  # its console script, beside this interpreter
    return subprocess.run(
        [str(exe) if exe.exists() else "polygraphy", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_standard_graph_passes_polygraphy(small, tmp_path):
    pytest.importorskip("polygraphy", reason="polygraphy (pip install polygraphy onnx-graphsurgeon) checks the graphs")
    pytest.importorskip("onnx_graphsurgeon", reason="polygraphy surgeon needs onnx-graphsurgeon")
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.json import save_json

    f, model = small
    save(model, tmp_path / "model.onnx")
    r = _polygraphy("surgeon", "sanitize", "model.onnx", "--fold-constants", "-o", "sanitized.onnx", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "sanitized.onnx").exists(), r.stdout[-2000:] + r.stderr[-2000:]
    tokens = [1, 504, 3458, 314, 253, 5148, 30]
    T, cfg = len(tokens), f.config
    feed = {
        "input_ids": np.array([tokens]),
        "position_ids": np.arange(T)[None],
        "attention_bias": np.triu(np.full((T, T), -np.inf, np.float32), 1)[None, None],
    }
    for i in range(cfg.n_layers):
        for kv in ("key", "value"):
            feed[f"past_{kv}.{i}"] = np.zeros((1, cfg.n_kv_heads, 0, cfg.head_dim), np.float32)
    save_json([feed], tmp_path / "inputs.json")
    golden = _golden(f, tokens)
    RunResults([("torch", [IterationResult(golden, runner_name="torch")])]).save(str(tmp_path / "golden.json"))
    check = [
        "run",
        "sanitized.onnx",
        "--onnxrt",
        "--load-inputs",
        "inputs.json",
        "--load-outputs",
        "golden.json",
        "--atol",
        "1e-4",
        "--rtol",
        "1e-4",
    ]
    r = _polygraphy(*check, cwd=tmp_path)
    assert r.returncode == 0 and "PASSED" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-2000:]
    golden["logits"] = golden["logits"] * 1.01  # the comparison can fail
    RunResults([("torch", [IterationResult(golden, runner_name="torch")])]).save(str(tmp_path / "golden.json"))
    assert _polygraphy(*check, cwd=tmp_path).returncode != 0


def test_tensorrt_engine_build_and_run(small, tmp_path):
    pytest.importorskip(
        "tensorrt",
        reason="TensorRT is not installed (pip install tensorrt, NVIDIA GPU): engine build and run not tested here",
    )
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        pytest.skip("TensorRT needs an NVIDIA GPU; none here: engine build and run not tested")
    from speechrt.export.tensorrt import build_engine

    f, model = small
    save(model, tmp_path / "model.onnx")
    lim = Limits(max_batch=2, max_seq=64, max_prompt=16, opt_seq=16, opt_prompt=8)
    path = build_engine(
        tmp_path / "model.onnx", profiles(lm_manifest(f.config), "model", lim), "fp32", tmp_path / "model.engine"
    )
    assert path.stat().st_size > 0
