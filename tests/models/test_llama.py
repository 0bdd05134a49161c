"""models/llama.py against transformers on the same GGUF (SmolLM2-135M-Instruct, Q4_1 + Q8_0 + F32 tensors).

transformers dequantizes the GGUF to float32 with its own dequantizers and un-permutes Q/K itself, so
equal logits check our loader (gguf's dequantizers, our un-permute), rotary, attention, MLP and head.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the comparison peer: pip install 'speechrt[peers]'")
pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF: pip install 'speechrt[peers]'")

from speechrt.backends.torch import lm as torch_lm  # noqa: E402
from speechrt.models import registry  # noqa: E402
from speechrt.pipelines.generation import GenerationOptions
from speechrt.pipelines.lm import LMPipeline  # noqa: E402
from speechrt.pipelines.lm_batching import generate_text, stream  # noqa: E402

CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "Give me one tip for sleeping better.",
    "What is 15 + 27?",
]
GREEDY_TOKENS = 12


@pytest.fixture(scope="module")
def model_file():
    rm = registry.resolve("smollm2-135m-instruct", "lm")
    return rm, torch_lm.load_file(rm)


@pytest.fixture(scope="module")
def ours(model_file):
    return LMPipeline(torch_lm.TorchLMRunner(model_file[1], torch.device("cpu"), "float32"), "smollm2")


@pytest.fixture(scope="module")
def hf(model_file):
    import functools

    import gguf
    from transformers import AutoModelForCausalLM

    path = model_file[0].path
    # transformers asks gguf for the same tensor-name table once per module of the model (~400 times,
    # each building it anew: most of the load's 35 s here); the table depends only on its arguments
    plain = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(plain)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    finally:
        gguf.get_tensor_name_map = plain


def test_logits_equal_transformers(ours, hf):
    prompts = [ours.encode_chat(c) for c in CHATS[:2]] + [ours.tokenizer.encode("The quick brown fox jumps over")]
    r = ours.runner
    for ids in prompts:
        cache = r.new_cache(1, len(ids) + 1)
        with torch.inference_mode():
            mine = r.model.prefill(cache, 0, torch.tensor(ids), all_logits=True)  # [T, V]
            ref = hf(torch.tensor([ids])).logits[0].float()
        diff = (mine - ref).abs().max().item()
        assert diff <= 1e-3, f"max |logit diff| {diff} on a {len(ids)}-token prompt"
    # the decode step (one token over the cache) gives the same logits as a full forward
    ids = prompts[0]
    cache = r.new_cache(1, len(ids) + 1)
    r.prefill(cache, 0, torch.tensor(ids[:-1]))
    step = r.decode_step(cache, [0], torch.tensor([ids[-1]]))[0]
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0, -1].float()
    assert (step - ref).abs().max().item() <= 1e-3


def test_greedy_chat_equals_transformers(ours, hf):
    for chat in CHATS[:5]:
        ids = ours.encode_chat(chat)
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                eos_token_id=ours.tokenizer.stop_ids(),
                pad_token_id=ours.tokenizer.eos_id,
            )
        ref_ids = out[0, len(ids) :].tolist()
        mine = [
            ev.token
            for ev in stream(ours.runner, ours.tokenizer, [ids], GenerationOptions(max_tokens=GREEDY_TOKENS))
            if ev.token is not None
        ]
        assert mine == ref_ids, (
            f"{chat!r}: ours {ours.tokenizer.decode(mine)!r} vs transformers {ours.tokenizer.decode(ref_ids)!r}"
        )


def test_capital_of_france(ours):
    assert "Paris" in "".join(ours.chat("What is the capital of France?", max_tokens=24))


def test_batch_of_8_equals_one_by_one(model_file):
    """In the default CPU format (int4 weights), in the runner a server builds for it: the AVX2 kernel of
    backends/torch/cpu_lm.py on x86, ATen's int4 kernels (bf16 activations) where that one cannot run. (ATen's,
    held to its AVX2 code, gives a batch's row other roundings than the row alone: greedy ids part at a near tie.)"""
    runner = torch_lm.build(model_file[0], torch.device("cpu"), "int4")
    lm = LMPipeline(runner)
    prompts = [lm.encode_chat(c) for c in CHATS] + [
        lm.tokenizer.encode("Once upon a time"),
        lm.encode_chat("Name three primary colors.", system="Be brief."),
    ]
    assert len(prompts) == 8 and len({len(p) for p in prompts}) > 4  # different lengths share the batch
    o = GenerationOptions(max_tokens=8)
    batched = generate_text(runner, lm.tokenizer, prompts, o)
    single = [generate_text(runner, lm.tokenizer, [p], o)[0] for p in prompts]
    assert batched == single
    assert len(set(batched)) == 8


def test_decode_on_scattered_slots(ours):
    """Slots need not be 0..N-1 or in order: a scheduler hands out whichever are free."""
    r = ours.runner
    a, b = ours.encode_chat(CHATS[0]), ours.encode_chat(CHATS[2])
    cache = r.new_cache(5, 64)
    la, lb = r.prefill(cache, 4, torch.tensor(a)), r.prefill(cache, 1, torch.tensor(b))
    ta, tb = int(la.argmax()), int(lb.argmax())
    both = r.decode_step(cache, [4, 1], torch.tensor([ta, tb]))
    ref = r.new_cache(1, 64)
    r.prefill(ref, 0, torch.tensor(a))
    only_a = r.decode_step(ref, [0], torch.tensor([ta]))[0]
    assert (both[0] - only_a).abs().max().item() < 1e-4
    assert cache.lengths[4] == len(a) + 1 and cache.lengths[1] == len(b) + 1


def test_fixed_shape_decode_matches_per_slot_steps(ours):
    """Llama.decode_range, the step the triton backend's CUDA graphs capture (tokens and positions as
    device tensors, attention over the whole cache masked by length), gives each slot the logits of a
    step of that slot alone, for slots of different lengths in the middle of the cache."""
    r, model = ours.runner, ours.runner.model
    prompts = [ours.encode_chat(CHATS[i]) for i in (0, 2, 5)]
    cache, ref = r.new_cache(5, 96), r.new_cache(1, 96)
    firsts = [int(r.prefill(cache, 1 + i, torch.tensor(p)).argmax()) for i, p in enumerate(prompts)]
    pos = torch.tensor([len(p) for p in prompts])
    assert len(set(pos.tolist())) == 3
    with torch.inference_mode():
        got = model.decode_range(cache, 1, torch.tensor(firsts), pos, cache.max_seq)
    for i, p in enumerate(prompts):
        ref.lengths[0] = 0
        r.prefill(ref, 0, torch.tensor(p))
        want = r.decode_step(ref, [0], torch.tensor([firsts[i]]))[0]
        assert torch.isfinite(got[i]).all()
        assert (got[i] - want).abs().max().item() < 1e-4 * want.abs().max().item()
        # the new keys went to the slot's next position (to rounding: the batched matmuls sum in another order)
        torch.testing.assert_close(cache.k[:, 1 + i, :, len(p)], ref.k[:, 0, :, len(p)], rtol=1e-4, atol=1e-4)
        assert cache.k[:, 1 + i, :, len(p) + 1].abs().max() == 0
    assert cache.lengths[1:4] == [len(p) for p in prompts]  # decode_range leaves the lengths to its caller


def test_batched_prefill_matches_one_prompt_at_a_time(ours):
    """Prompts of different lengths prefilled as one right-padded batch (what `stream` hands the torch
    runner) give each slot the logits, cache and next step of prefilling it alone."""
    r = ours.runner
    prompts = [torch.tensor(ours.encode_chat(CHATS[i])) for i in (0, 3, 5)]
    assert len({len(p) for p in prompts}) == 3
    cache, ref = r.new_cache(4, 96), r.new_cache(4, 96)
    got = r.prefill_many(cache, [(1 + i, p, 0) for i, p in enumerate(prompts)])
    assert cache.lengths == [0] + [len(p) for p in prompts]
    want = [r.prefill(ref, 1 + i, p) for i, p in enumerate(prompts)]
    for i, p in enumerate(prompts):
        assert torch.isfinite(got[i]).all()
        torch.testing.assert_close(got[i], want[i], rtol=1e-4, atol=1e-4 * want[i].abs().max().item())
        torch.testing.assert_close(cache.k[:, 1 + i, :, : len(p)], ref.k[:, 1 + i, :, : len(p)], rtol=1e-4, atol=1e-4)
    tokens = torch.tensor([int(w.argmax()) for w in want])
    torch.testing.assert_close(
        r.decode_step(cache, [1, 2, 3], tokens), r.decode_step(ref, [1, 2, 3], tokens), rtol=1e-4, atol=1e-3
    )


def test_prefill_many_isolates_a_bad_prompt(ours):
    """A prompt that does not fit fails alone: the batch falls back to one prompt at a time, the others
    get their logits, the bad one its own error."""
    r = ours.runner
    cache = r.new_cache(3, 40)
    good = torch.tensor(ours.encode_chat(CHATS[0]))
    assert len(good) <= 40
    out = r.prefill_many(cache, [(0, good, 0), (1, torch.arange(41) + 100, 0), (2, good, 0)])
    assert isinstance(out[1], ValueError) and "does not fit" in str(out[1])
    torch.testing.assert_close(out[0], out[2])
    assert cache.lengths[0] == cache.lengths[2] == len(good)


def test_hf_directory_loads_same_model(tmp_path, ours, hf, model_file):
    """A Hugging Face directory (config.json + safetensors + tokenizer.json) written by transformers from
    the same GGUF gives the same logits through models/hf_llama.py."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    path = model_file[0].path
    # (transformers refuses save_pretrained on a GGUF-loaded model, so write the directory the same way by hand)
    conf = hf.config.to_dict()
    conf.pop("quantization_config", None)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(tmp_path / "model.safetensors"))
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(tmp_path)
    rm = registry.resolve(str(tmp_path), "lm")
    assert rm.format == "hf-llama"
    other = LMPipeline(torch_lm.build(rm, torch.device("cpu"), "float32"))
    ids = ours.encode_chat(CHATS[1])
    assert other.encode_chat(CHATS[1]) == ids
    c1, c2 = ours.runner.new_cache(1, 64), other.runner.new_cache(1, 64)
    l1 = ours.runner.prefill(c1, 0, torch.tensor(ids))
    l2 = other.runner.prefill(c2, 0, torch.tensor(ids))
    assert (l1 - l2).abs().max().item() <= 1e-4


def test_compact_formats_agree_with_float32(model_file, ours):
    """bf16 / int8 / int4 weights change logits a little, not the answer."""
    ids = ours.encode_chat(CHATS[0])
    c = ours.runner.new_cache(1, 64)
    ref = ours.runner.prefill(c, 0, torch.tensor(ids))
    for fmt in ("bfloat16", "int8"):
        r = torch_lm.TorchLMRunner(model_file[1], torch.device("cpu"), fmt)
        lg = r.prefill(r.new_cache(1, 64), 0, torch.tensor(ids))
        assert int(lg.argmax()) == int(ref.argmax()), fmt
        assert torch.corrcoef(torch.stack([lg, ref]))[0, 1] > 0.99, fmt


def test_prefill_graph_routing_matches_eager(model_file, ours):
    """The triton runner's prefill graphs (Llama.prefill_rows on static buffers: prompts padded to a bucket,
    slots as a device tensor) give scattered slots the logits, cache and next step of eager prefill. The
    capture itself needs a GPU (`speechrt bench gpu --checks lm-graphs`); here the captured function runs
    uncaptured, on the CPU, through the same buffers and padding."""
    from speechrt.backends.triton import lm as triton_lm

    r = triton_lm.TritonLMRunner(model_file[1], torch.device("cpu"), "float32", kernels="torch", capture=False)
    assert r.graphs_enabled  # uncaptured on the CPU: the routing is what is tested here
    prompts = [torch.tensor(ours.encode_chat(CHATS[i])) for i in (2, 0, 5)]
    lens = [len(p) for p in prompts]
    assert len(set(lens)) == 3 and triton_lm.prefill_bucket(max(lens), 96) == 64 > max(lens)
    cache, ref = r.new_cache(5, 96), ours.runner.new_cache(5, 96)
    got = r.prefill_many(cache, [(4, prompts[0], 0), (1, prompts[1], 0), (2, prompts[2], 0)])
    one = r.prefill(cache, 3, prompts[1][:5])  # a single prompt: the (1, 16) graph
    assert sorted(k[2:] for k in r.prefill_graphs.items) == [(1, 16), (3, 64)]
    assert cache.lengths == [0, lens[1], lens[2], 5, lens[0]]
    want = [ours.runner.prefill(ref, s, p) for s, p in zip((4, 1, 2), prompts)]
    want_one = ours.runner.prefill(ref, 3, prompts[1][:5])
    for g, w in zip(got + [one], want + [want_one]):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())
    for s, n in ((4, lens[0]), (1, lens[1]), (2, lens[2]), (3, 5)):
        torch.testing.assert_close(cache.k[:, s, :, :n], ref.k[:, s, :, :n], rtol=1e-4, atol=1e-4)
    assert cache.k[:, 0].abs().max() == 0  # a slot no prompt went to is untouched
    tokens = torch.tensor([int(w.argmax()) for w in want])
    torch.testing.assert_close(
        r.decode_step(cache, [4, 1, 2], tokens), ours.runner.decode_step(ref, [4, 1, 2], tokens), rtol=1e-4, atol=1e-3
    )
    # a prompt continuing a cached prefix, or longer than the largest bucket that fits, runs eagerly
    r.prefill(cache, 1, prompts[2], start=lens[1])
    assert cache.lengths[1] == lens[1] + lens[2] and len(r.prefill_graphs) == 2
    assert triton_lm.prefill_bucket(97, 96) is None and triton_lm.prefill_bucket(600, 4096) is None
    assert triton_lm.prefill_bucket(70, 96) == 96  # a bucket cut to the cache's length
    # warm-up captures every one-prompt bucket the cache holds, and frees the slot it used
    r.prefill_graphs = triton_lm.GraphCache(triton_lm.MAX_PREFILL_GRAPHS)
    held, kept = list(cache.lengths), cache.k[:, 1, :, : cache.lengths[1]].clone()
    r.prepare(cache, 0)
    assert sorted(k[2:] for k in r.prefill_graphs.items) == [(1, 16), (1, 32), (1, 64), (1, 96)]
    assert cache.lengths == [0] + held[1:] and torch.equal(cache.k[:, 1, :, : held[1]], kept)


def test_fused_decode_range_equals_decode_range(ours):
    """models/llama_fused.py's step (one residual stream, each norm folded into the projection that reads it)
    on the fused ops' references equals Llama.decode_range on the embedded SmolLM2: logits and the cache it
    writes (kernels/triton_fused.py is held to these references in tests/kernels/test_triton_fused.py)."""
    from speechrt.kernels.reference import FUSED_OPS
    from speechrt.models.llama_fused import decode_range_fused

    r, model = ours.runner, ours.runner.model
    cache = r.new_cache(3, 24)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g)), cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    firsts, pos = [5, 900, 17], torch.tensor([20, 3, 11])  # held keys: random (the step only reads them)
    k0, v0 = cache.k.clone(), cache.v.clone()
    with torch.inference_mode():
        want = model.decode_range(cache, 0, torch.tensor(firsts), pos, cache.max_seq)
        want_k, want_v = cache.k.clone(), cache.v.clone()
        cache.k.copy_(k0), cache.v.copy_(v0)
        got = decode_range_fused(model, FUSED_OPS, cache, 0, torch.tensor(firsts), pos, cache.max_seq)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    torch.testing.assert_close(cache.k, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v, want_v, rtol=1e-5, atol=1e-5)
    assert not torch.equal(cache.k, k0)


def test_fused_unsupported_names_what_it_refuses(model_file):
    """The fused decode step refuses what it does not compute, naming it: a config field another architecture
    adds (Gemma 3's, and a later one) unless it holds its default, and weights stored in a format its kernels do not
    read (they read the float ones, int4 groups, int8 and fp8)."""
    import dataclasses

    from speechrt.models.llama import LlamaConfig
    from speechrt.models.llama_fused import fused_unsupported

    cfg = model_file[1].config
    for fmt in ("bfloat16", "float32", "float16", "int4", "int8", "fp8"):  # quantized: kernels/triton_fused_quant.py
        assert fused_unsupported(cfg, fmt) is None, fmt
    assert "not nf4" in fused_unsupported(cfg, "nf4")
    # Gemma 3's switches, held at their defaults by a Llama, refused when set
    for field, value in (("sliding_window", 512), ("act", "gelu_tanh"), ("post_norms", True), ("final_softcap", 30.0)):
        why = fused_unsupported(dataclasses.replace(cfg, **{field: value}), "bfloat16")
        assert f"LlamaConfig.{field}={value!r}" in why, why
    # a field another architecture adds later: refused unless it holds its default
    wider = dataclasses.make_dataclass("Wider", [("future_switch", int, 0)], bases=(LlamaConfig,), frozen=True)
    assert fused_unsupported(wider(**dataclasses.asdict(cfg)), "bfloat16") is None
    why = fused_unsupported(wider(**dataclasses.asdict(cfg), future_switch=3), "bfloat16")
    assert "Wider.future_switch=3" in why


def test_gguf_4bit_blocks_pack_exactly_for_the_triton_int4_kernel(model_file):
    """Every Q4_1 tensor of the embedded SmolLM2 file, as the Triton W4A16 kernel holds it (two 4-bit values per
    byte, an (s, z) pair per group of 32: float16 where exact, else float32), dequantizes to gguf's own float32
    values bit for bit; most pairs fit float16 (5 bits per weight read)."""
    pytest.importorskip("triton")
    from speechrt.kernels import reference as ref
    from speechrt.kernels import triton_int4_matmul as i4

    f = model_file[1]
    assert len(f.q4) == 210
    halves = 0
    for name, (q, s, z) in f.q4.items():
        packed, sz = i4.pack_int4(q, s, z)
        assert torch.equal(ref.dequantize_int4(i4.unpack_int4(packed), sz), f.weights[name]), name
        halves += sz.dtype == torch.float16
    assert halves >= 200
