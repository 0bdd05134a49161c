"""Tokenizer, chat template and incremental detokenizer built from the GGUF's own metadata, against
transformers' tokenizer loaded from the same file (AutoTokenizer.from_pretrained(dir, gguf_file=...))."""

from __future__ import annotations

import numpy as np
import pytest

from speechrt.models import gguf_loader, registry
from speechrt.models.lm_text import ChatTemplate, Detokenizer, LMTokenizer
from speechrt.pipelines.generation import TextStream

TEXTS = [
    "Hello, world!",
    "Ünïcödé: naïve café, Straße, résumé — “quotes” and ‘single’…",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Emoji: 🙂👍🏽🇫🇷 family: 👨‍👩‍👧‍👦 and a snowman ☃",
    "Numbers 12345, 3.14159 and 1,000,000; dates 2024-05-17",
    "  leading spaces, tabs\tand\nnew\n\nlines   trailing  ",
    "def f(x):\n    return x ** 2  # code",
    "Ελληνικά, русский текст, עברית, العربية",
    "<|im_start|>user\nspecial tokens inline<|im_end|>\n",
    "Mixed👋🏻text",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about ünïcödé 🙂"},
    ],
]


@pytest.fixture(scope="module")
def gguf_path():
    return registry.resolve("smollm2-135m-instruct", "lm").path


@pytest.fixture(scope="module")
def meta(gguf_path):
    return gguf_loader.open_reader(gguf_path).metadata


@pytest.fixture(scope="module")
def tok(meta, gguf_path):
    return LMTokenizer.from_gguf_metadata(meta, gguf_path)


@pytest.fixture(scope="module")
def hf_tok(gguf_path):
    transformers = pytest.importorskip("transformers", reason="the comparison peer: pip install 'speechrt[peers]'")
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers(tok, hf_tok, text):
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special=False) == hf_tok.decode(ids, skip_special_tokens=False)
    if "<|" not in text:
        assert tok.decode(ids) == text  # byte-level BPE round-trips any text exactly


def test_special_tokens(tok, hf_tok):
    assert tok.token_to_id("<|im_start|>") == hf_tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.eos_id == hf_tok.eos_token_id
    assert tok.token_to_id("<|im_end|>") in tok.stop_ids()
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"  # specials leave decoded text


@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_renders_like_transformers(meta, hf_tok, tok, conv, gen):
    t = ChatTemplate(meta["tokenizer.chat_template"], tok.id_to_token(tok.bos_id), tok.id_to_token(tok.eos_id))
    mine = t.render(conv, add_generation_prompt=gen)
    ref = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
    assert mine == ref


def test_chat_template_errors(meta):
    from speechrt.models.registry import ModelError

    t = ChatTemplate(meta["tokenizer.chat_template"])
    with pytest.raises(ModelError, match="valid roles"):
        t.render([{"role": "wizard", "content": "x"}])
    with pytest.raises(ModelError, match="non-empty list"):
        t.render([])
    with pytest.raises(ModelError, match="not valid Jinja"):
        ChatTemplate("{% for m in messages %}")


def test_detokenizer_never_splits_a_character(tok):
    text = "Emoji 👨‍👩‍👧‍👦 🇫🇷 and 日本語 ☃ café"
    ids = tok.encode(text)
    d = Detokenizer(tok)
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # some tokens carry only part of a character: those give '' until the character completes
    assert any(p == "" for p in pieces[:-1])
    assert len(ids) > len([p for p in pieces if p])


def test_incomplete_character_at_end_becomes_replacement(tok):
    ids = tok.encode("🙂")
    assert len(ids) > 1  # the emoji's 4 bytes span several byte-level tokens
    d = Detokenizer(tok)
    out = "".join(d.add(i) for i in ids[:-1]) + d.flush()
    assert out == "\ufffd"


def test_stop_strings_hold_back_text(tok):
    ids = tok.encode("The answer is 42.\nUser: next question")
    st = TextStream(tok, ("\nUser:",))
    out, hit = "", False
    for i in ids:
        piece, hit = st.push(st.detok.add(i))
        out += piece
        assert "\nUser" not in out  # a possible stop string is never emitted early
        if hit:
            break
    assert hit and out == "The answer is 42."


def test_sentencepiece_merges_are_cached_by_vocabulary(tmp_path, monkeypatch):
    """The merges recovered from a SentencePiece vocabulary without merges (Gemma's GGUF files) are kept in
    speechrt's cache and read back by the next load (emptied there, the next tokenizer merges nothing: it was read);
    a vocabulary that differs has its own entry (its merges recovered again)."""
    from speechrt.models import lm_sentencepiece

    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path))
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a", "b", "ab"]
    md = {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * 256 + [1] * 4,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
    }
    ab = tokens.index("ab")
    assert LMTokenizer.from_gguf_metadata(md).encode("ab", add_bos=False) == [ab]
    (cached,) = (tmp_path / "tokenizers").glob("merges-*.npy")
    assert cached == lm_sentencepiece.merges_path(tokens, {t: -i for i, t in enumerate(tokens)})
    np.save(cached, np.zeros((0, 2), dtype=np.int32))  # the cache says: no merges
    assert LMTokenizer.from_gguf_metadata(md).encode("ab", add_bos=False) == [ab - 2, ab - 1]
    other = {
        **md,
        "tokenizer.ggml.tokens": tokens + ["ba"],
        "tokenizer.ggml.token_type": md["tokenizer.ggml.token_type"] + [1],
    }
    assert LMTokenizer.from_gguf_metadata(other).encode("ab ba", add_bos=False)[0] == ab
    assert len(list((tmp_path / "tokenizers").glob("merges-*.npy"))) == 2
