"""SentencePiece BPE vocabularies of GGUF files (`tokenizer.ggml.model` 'llama': Llama 2, Mistral 7B, Gemma 3) ->
an LMTokenizer, built with the `tokenizers` library as transformers' GGUF converter builds them
(transformers/integrations/gguf/gguf_tokenizer_mapping.py: `sentencepiece_tokenizer`, `gemma_tokenizer`).

Such a file lists tokens, scores and token types but usually no merges: the merges are recovered from the
vocabulary (every split of a token into two tokens of the vocabulary), best first — by score, or, for Gemma,
whose scores do not follow its merge order, by the token's place in the file. Spaces are '▁' and what the
vocabulary lacks falls back to <0xNN> byte tokens. Gemma's vocabulary stores its runs of spaces as spaces and
prepends no '▁' to a text; Llama's prepends one (`tokenizer.ggml.add_space_prefix`, default on) and its decoder
drops it.
"""

from __future__ import annotations

from pathlib import Path

from .registry import ModelError

GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
SPACE = "\u2581"


def recovered_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a BPE vocabulary implies (transformers' generate_merges with vocab_scores): for each token
    (best score first), its splits into two tokens of the vocabulary, ordered by their ids."""
    merges = []
    for token, score in scores.items():
        local = [
            (token[:i], token[i:], score) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def from_gguf(cls, md: dict, source: Path | str):
    """`cls` (models.lm_text.LMTokenizer) of a GGUF's SentencePiece metadata."""
    tokens = md.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    gemma = md.get("general.architecture") in GEMMA_ARCHS
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True)) and not gemma
    tok = _build(md, tokens, types, gemma, prefix)

    def tid(key):
        v = md.get(key)
        return int(v) if v is not None else None

    special = {i for i, ty in enumerate(types) if ty == 3}
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", True))  # llama.cpp's default for SentencePiece
    bos, eos = tid("tokenizer.ggml.bos_token_id"), tid("tokenizer.ggml.eos_token_id")
    return cls(tok, bos, eos, add_bos, special, byte_level=False, strip_first=prefix)


CACHE_VERSION = 1  # raised when recovered_merges changes what it gives


def merges_path(tokens: list[str], scores: dict[str, float]) -> Path:
    """Where the merges recovered from this vocabulary (its tokens in order and their scores) are cached."""
    import hashlib

    import numpy as np

    from speechrt.machine import cache_home

    h = hashlib.sha256(f"v{CACHE_VERSION}\0".encode())
    h.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.asarray([scores[t] for t in tokens], dtype=np.float64).tobytes())
    return cache_home() / "tokenizers" / f"merges-{h.hexdigest()[:32]}.npy"


def cached_merges(tokens: list[str], vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """recovered_merges, kept in speechrt's cache as pairs of token ids (tokenizers/merges-<vocabulary hash>.npy):
    recovering Gemma 3's 515k merges from its 262k tokens takes seconds, reading them back a fraction of that. A
    different vocabulary has another hash; a cache that cannot be read or written only costs the recovery."""
    import os
    import tempfile

    import numpy as np

    path = merges_path(tokens, scores)
    try:
        ids = np.load(path)
        if ids.ndim == 2 and ids.shape[1] == 2 and (ids.size == 0 or ids.max() < len(tokens)):
            return [(tokens[a], tokens[b]) for a, b in ids.tolist()]
    except (OSError, ValueError):
        pass
    merges = recovered_merges(vocab, scores)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.asarray([(vocab[a], vocab[b]) for a, b in merges], dtype=np.int32).reshape(-1, 2))
        os.replace(tmp, path)
    except OSError:
        pass
    return merges


def _build(md: dict, tokens: list[str], types: list[int], gemma: bool, prefix: bool):
    """The `tokenizers` Tokenizer of the vocabulary, as transformers' GGUF converter builds it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    if gemma:  # a run of spaces is stored as spaces; the merges and the text spell them '▁'
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, md.get("tokenizer.ggml.scores") or [0.0] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    if md.get("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    else:
        merges = cached_merges(tokens, vocab, scores)
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else "<unk>"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme="first" if prefix else "never", split=False)
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    # CONTROL (3) tokens are special; USER_DEFINED (4) are matched whole but kept in decoded text
    special = [i for i, ty in enumerate(types) if ty == 3]
    tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in special])
    user = [i for i, ty in enumerate(types) if ty == 4]
    if user:
        tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False) for i in user])
    return tok
