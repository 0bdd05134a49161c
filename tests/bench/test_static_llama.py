"""The peer torch-compile-static (speechrt/bench/static_llama.py, gpt-fast's static-cache recipe): its step, uncompiled,
gives our torch model's greedy ids on a tiny random Llama; compiled (minutes of inductor on a CPU) only with
SPEECHRT_TEST_COMPILE=1."""

from __future__ import annotations

import os

import pytest
import torch

from speechrt import kernels
from speechrt.bench.gpu_fused import random_weights
from speechrt.bench.static_llama import StaticGenerator, StaticLlama, unsupported
from speechrt.models.llama import Llama, LlamaConfig

CFG = LlamaConfig(vocab_size=96, dim=48, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=80, max_seq_len=64)
PROMPTS = [[5, 17, 3, 60, 2, 9, 41], [8, 1, 77]]  # rows at different positions in each step


def ours_greedy(cfg, w, prompts, n) -> list[list[int]]:
    """Our torch model (the torch backend's: kernels.reference) on the same weights: prefill, then n - 1 steps."""
    m = Llama(cfg, w, kernels.select("torch", "cpu"), torch.device("cpu"), "float32")
    cache = m.new_cache(len(prompts), max(map(len, prompts)) + n)
    with torch.inference_mode():
        tok = torch.stack([m.prefill(cache, i, torch.tensor(p)) for i, p in enumerate(prompts)]).argmax(-1)
        ids = [tok]
        for _ in range(n - 1):
            tok = m.decode_step(cache, list(range(len(prompts))), tok).argmax(-1)
            ids.append(tok)
    return torch.stack(ids).T.tolist()


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(qkv_bias=True, qk_norm=True, tie_embeddings=False)])
def test_static_cache_step_gives_our_greedy_ids(cfg):
    w = random_weights(cfg, "cpu", torch.float32, seed=3)
    if not cfg.tie_embeddings:
        w["output"] = torch.randn(cfg.vocab_size, cfg.dim) * cfg.dim**-0.5
    want = ours_greedy(cfg, w, PROMPTS, 12)
    gen = StaticGenerator(StaticLlama(cfg, w, "cpu", torch.float32), compile=False)
    got, ttft, steps = gen.generate(PROMPTS, 12)
    assert got == want and ttft > 0 and steps > 0
    assert gen.generate(PROMPTS[:1], 12)[0] == [want[0]]  # a new batch size: new caches, the same ids
    # the first step's logits (teacher-forced) within float32 rounding of ours
    m = Llama(cfg, w, kernels.select("torch", "cpu"), torch.device("cpu"), "float32")
    cache = m.new_cache(2, 32)
    gen.model.setup_caches(2, 32)
    with torch.inference_mode():
        for i, p in enumerate(PROMPTS):
            m.prefill(cache, i, torch.tensor(p))
            gen.model.prefill(i, torch.tensor(p))
        tok = torch.tensor([4, 50])
        exp = m.decode_step(cache, [0, 1], tok)
        got_logits = gen.model.decode_logits(tok, torch.tensor([len(p) for p in PROMPTS]))
    assert (got_logits - exp).abs().max() < 1e-4


def test_static_peer_refuses_what_it_does_not_compute():
    assert "sliding_window" in unsupported(CFG.replace(sliding_window=8, sliding_layers=(0,)))
    with pytest.raises(ValueError, match="post_norms"):
        StaticLlama(CFG.replace(post_norms=True), {}, "cpu", torch.float32)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SPEECHRT_TEST_COMPILE"), reason="compiles for minutes: SPEECHRT_TEST_COMPILE=1")
def test_compiled_static_step_gives_the_same_ids():
    w = random_weights(CFG, "cpu", torch.float32, seed=3)
    gen = StaticGenerator(StaticLlama(CFG, w, "cpu", torch.float32), compile=True)
    want = ours_greedy(CFG, w, PROMPTS, 8)
    assert gen.generate(PROMPTS, 8)[0] == want
    assert gen.generate(PROMPTS[:1], 8)[0] == want[:1]  # another batch size: compiled again, for its shapes


def test_bench_lm_starts_the_static_peer_from_the_models_file():
    """`bench lm --peers torch-static` (torch-compile-static: the same, compiled): its engine starts from the embedded
    SmolLM2's own file and decodes a batch; our rows name it as their peer, or on a GPU its compiled form."""
    from speechrt.bench.lm import _records
    from speechrt.bench.lm_engines import start_engine

    engine, skip = start_engine({"model": None, "engine": "torch-static", "threads": 1, "device": "cpu", "dtype": None})
    assert skip is None and engine.note.startswith("gpt-fast recipe: static cache, decode step eager, prefill eager")
    ttft, tps = engine.run([[1, 2, 3, 4, 5], [6, 7]], 3)
    assert ttft > 0 and tps > 0
    row = {"batch": 2, "ttft": ttft, "tps": tps, "runs": [{"ttft": ttft, "tps": tps}]}
    res = {n: {"rows": [row]} for n in ("speechrt torch", "transformers", "torch-static", "torch-compile-static")}
    meta = {n: {"backend": "x", "precision": "bfloat16", "device": "cuda"} for n in res}
    assert {r.peer for r in _records(res, meta, "m", 3, 1, "cuda") if r.engine == "speechrt"} == {
        "torch-compile-static bfloat16"
    }
    assert {r.peer for r in _records(res, meta, "m", 3, 1, "cpu") if r.engine == "speechrt"} == {
        "transformers bfloat16"
    }
