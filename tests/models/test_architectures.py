"""The language-model architectures beyond the Llama graph, against transformers on small random-weight models.

For each of Qwen2 (Q/K/V biases, tied head), Qwen3 (per-head Q/K norms, head_dim != dim / heads), Llama 3.x
(the 'llama3' rotary scaling), Mistral (a sliding window, which bounds the context) and Phi-3 (fused qkv_proj
and gate_up_proj), transformers' own class builds a tiny model with random weights (biases and norms too), and
the test writes it as transformers does (save_pretrained: safetensors, tokenizer.json, the chat template) and
as llama.cpp's convert_hf_to_gguf.py would (F32 tensors through the `gguf` package's writer: Q/K rows permuted
for the 'llama' arch, Phi-3's fused tensors kept fused, Llama 3's scaling as rope_freqs.weight). speechrt loads
both; the logits of a prompt and of cached decode steps after it, and greedy generation, are transformers'.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the comparison peer: pip install 'speechrt[peers]'")
gguf = pytest.importorskip("gguf")

from lm_archs import (  # noqa: E402 - tests/lm_archs.py: the tiny models and their files
    ARCHS,
    CONVERSATION,
    byte_bpe,
    check_logits,
    greedy_hf,
    hf_model,
    save_hf,
    write_gguf,
    written,
)

from speechrt.backends.torch import lm as torch_lm  # noqa: E402
from speechrt.models import gguf_loader, registry  # noqa: E402
from speechrt.models.registry import ModelError  # noqa: E402
from speechrt.pipelines.generation import GenerationOptions  # noqa: E402
from speechrt.pipelines.lm import LMPipeline  # noqa: E402
from speechrt.pipelines.lm_batching import stream  # noqa: E402


@pytest.fixture(scope="module")
def bpe():
    return byte_bpe()


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request, tmp_path_factory, bpe):
    """(name, transformers model, its directory, the speechrt pipeline loaded from the directory)."""
    name = request.param
    model, d = written(name, tmp_path_factory, bpe)
    rm = registry.resolve(str(d), "lm")
    assert rm.format == "hf-llama"
    return name, model, d, LMPipeline(torch_lm.build(rm, torch.device("cpu"), "float32"))


def test_hf_folder_logits_equal_transformers(arch):
    name, model, _, lm = arch
    check_logits(lm.runner, model, seed=1)


def test_hf_folder_greedy_generation_equals_transformers(arch):
    name, model, _, lm = arch
    ids = lm.encode_chat(CONVERSATION[:2])
    o = GenerationOptions(max_tokens=10, stop_token_ids=())
    assert [ev.token for ev in stream(lm.runner, lm.tokenizer, [ids], o)] == greedy_hf(model, ids, 10)


def test_chat_template_from_the_folder_renders_as_transformers(arch):
    """The folder's chat template through speechrt's chat formatting: the text and the token ids of
    transformers' apply_chat_template (the template's bos_token / eos_token included)."""
    from transformers import AutoTokenizer

    name, _, d, lm = arch
    hf_tok = AutoTokenizer.from_pretrained(d)
    for conv in (CONVERSATION, CONVERSATION[1:2]):
        ref = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert lm.render_chat(conv) == ref
        assert lm.encode_chat(conv) == hf_tok(ref, add_special_tokens=False)["input_ids"]
    assert lm.tokenizer.token_to_id(ARCHS[name][4]) in lm.tokenizer.stop_ids()


def test_streamed_text_equals_transformers_decode(arch):
    """Text streamed token by token (Detokenizer: what chat replies and the server send) is transformers' decode
    of the ids, for byte-level BPE and for SentencePiece ('▁' spaces, <0xNN> byte fallback for what the small
    vocabulary lacks, the first space dropped; Gemma's: no space prepended, none dropped)."""
    from transformers import AutoTokenizer

    from speechrt.models.lm_text import Detokenizer

    name, _, d, lm = arch
    hf_tok = AutoTokenizer.from_pretrained(d)
    text = "Name three colors.\nÉté, 日本 and one more!"
    ids = lm.tokenizer.encode(text, add_bos=False)
    assert ids == hf_tok(text, add_special_tokens=False)["input_ids"]
    det = Detokenizer(lm.tokenizer)
    streamed = "".join(det.add(i) for i in ids) + det.flush()
    assert streamed == hf_tok.decode(ids, skip_special_tokens=True) == lm.tokenizer.decode(ids) == text
    assert lm.tokenizer.byte_level == (name not in ("mistral", "phi3", "gemma3"))
    assert lm.tokenizer.strip_first == (name in ("mistral", "phi3"))  # Gemma prepends no '▁', so drops none


def test_architecture_switches(arch):
    """What each architecture turned on (so that the tests above compare the feature they name)."""
    name, _, _, lm = arch
    cfg = lm.runner.config
    assert cfg.qkv_bias == (name == "qwen2") and cfg.qk_norm == (name in ("qwen3", "gemma3"))
    assert (cfg.rope_scaling is not None and cfg.rope_scaling.kind) == (name == "llama3" and "llama3")
    # a sliding window bounds the context: within it, attention over the window is full attention; Gemma 3's
    # window is a per-layer mask (its global layers see the whole context)
    assert cfg.max_seq_len == {"mistral": 96, "phi3": 80}.get(name, 256)
    assert cfg.head_dim == (32 if name == "qwen3" else 16)
    gemma = name == "gemma3"
    assert (cfg.act, cfg.post_norms, cfg.embed_scale) == (("gelu_tanh", True, 8.0) if gemma else ("silu", False, 1.0))
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.rope_local_theta) == (
        (4, (0, 1, 2, 3, 4), 1e4) if gemma else (0, (), 0)
    )
    assert cfg.final_softcap == (8.0 if gemma else 0.0)


# -- GGUF, as llama.cpp's converter writes these architectures ----------------------------------------------


def test_gguf_logits_equal_transformers(arch, bpe, tmp_path):
    """The GGUF of the same weights: the same logits, the same chat prompt ids (tokenizer.chat_template and
    the gpt2 tokenizer metadata), the same greedy tokens."""
    name, model, _, hf_lm = arch
    p = write_gguf(tmp_path / f"{name}.gguf", name, model, bpe)
    rm = registry.resolve(str(p), "lm")
    lm = LMPipeline(torch_lm.build(rm, torch.device("cpu"), "float32"))
    assert lm.runner.config.arch == ARCHS[name][2]
    if name != "mistral":  # llama.cpp writes Mistral as 'llama', without its window (and runs it so)
        assert lm.runner.config.max_seq_len == hf_lm.runner.config.max_seq_len
    check_logits(lm.runner, model, seed=2)
    ids = lm.encode_chat(CONVERSATION)
    if name not in ("mistral", "phi3"):  # (their folders carry a SentencePiece tokenizer; the GGUF a byte-level one)
        assert ids == hf_lm.encode_chat(CONVERSATION)  # Gemma 3: both SentencePiece, the GGUF's without merges
    o = GenerationOptions(max_tokens=6, stop_token_ids=())
    assert [ev.token for ev in stream(lm.runner, lm.tokenizer, [ids], o)] == greedy_hf(model, ids, 6)


def test_gguf_sentencepiece_tokenizer_equals_transformers(bpe, tmp_path):
    """A SentencePiece vocabulary in a GGUF (`tokenizer.ggml.model` llama, Gemma's kind: tokens, scores and types,
    no merges, runs of spaces stored as spaces) tokenizes as transformers' tokenizer of the same file (its GGUF
    converter): whitespace runs, tabs and newlines, accents and CJK through byte fallback, control tokens in text."""
    from transformers import AutoTokenizer

    p = write_gguf(tmp_path / "g.gguf", "gemma3", hf_model("gemma3"), bpe)
    ours = LMPipeline(torch_lm.build(registry.resolve(str(p), "lm"), torch.device("cpu"), "float32")).tokenizer
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=p.name)
    for text in (
        "Name three colors.\nÉté, 日本 and one more!",
        "  two   spaces  \t\ttabs\n\n",
        "<start_of_turn>user\nHi",
    ):
        ids = ours.encode(text, add_bos=False)
        assert ids == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids, skip_special=False) == ref.decode(ids) == text
    assert not ours.byte_level and not ours.strip_first and ours.bos_id == ref.bos_token_id


# -- what is refused ------------------------------------------------------------------------------------------


def test_unsupported_hf_architectures_are_refused_with_the_list(tmp_path, bpe):
    import json

    model = hf_model("llama3")
    d = save_hf(tmp_path / "m", "llama3", model, bpe)
    conf = json.loads((d / "config.json").read_text())
    for mt in ("smollm3", "gemma2"):  # (Gemma 2's attention soft cap and layer pattern are not Gemma 3's)
        (d / "config.json").write_text(json.dumps({**conf, "model_type": mt}))
        with pytest.raises(ModelError, match=rf"model_type '{mt}' is not supported; supported: .*qwen3.*phi3"):
            registry.resolve(str(d), "lm")
    # Phi-3 128k / Phi-3.5: 'longrope' is named, not run with the wrong frequencies
    long = {"rope_type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8, "rope_theta": 1e4}
    (d / "config.json").write_text(json.dumps({**conf, "model_type": "phi3", "rope_parameters": long}))
    with pytest.raises(ModelError, match="rope scaling 'longrope' is not supported.*llama3"):
        torch_lm.load_file(registry.resolve(str(d), "lm"))
    # a tensor the architecture does not have is an error, not ignored
    (d / "config.json").write_text(json.dumps(conf))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    from safetensors.torch import save_file

    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ModelError, match="not part of the llama architecture"):
        torch_lm.load_file(registry.resolve(str(d), "lm"))


@pytest.mark.parametrize("bad", ["granite", "smollm3", "gemma2"])
def test_unsupported_gguf_architectures_are_refused_with_the_list(tmp_path, bad):
    """Granite (multipliers) and SmolLM3 (layers without rotary) are not the Llama graph under another name."""
    p = tmp_path / f"{bad}.gguf"
    w = gguf.GGUFWriter(str(p), bad)
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        ModelError, match=rf"architecture '{bad}' is not supported.*: llama, mistral, qwen2, qwen3, phi3, gemma3"
    ):
        gguf_loader.load(p)
