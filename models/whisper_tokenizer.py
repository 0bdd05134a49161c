"""Whisper's tokenizer from `tokenizer.json` (byte-level BPE), with its special tokens, timestamp tokens
and the non-speech token list used for suppression, computed as openai-whisper computes them; a CTranslate2
directory's `vocabulary.json` / `.txt` alone makes the same tokenizer (tokenizer_from_vocabulary)."""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from pathlib import Path

from .registry import ModelError

LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr "
    "bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn "
    "yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
).split()


class WhisperTokenizer:
    def __init__(self, path: Path, multilingual: bool, num_languages: int = 99):
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise ModelError(f"{path}: not a readable tokenizer.json ({e})") from None
        self.multilingual = multilingual
        sid = self.tok.token_to_id

        def need(name):
            i = sid(name)
            if i is None:
                raise ModelError(f"{path}: tokenizer has no {name} token; not a Whisper tokenizer")
            return i

        self.eot = need("<|endoftext|>")
        self.sot = need("<|startoftranscript|>")
        self.sot_prev = need("<|startofprev|>")
        self.sot_lm = sid("<|startoflm|>")
        self.transcribe = need("<|transcribe|>")
        self.translate = need("<|translate|>")
        self.no_timestamps = need("<|notimestamps|>")
        self.no_speech = sid("<|nospeech|>") or sid("<|nocaptions|>")
        self.timestamp_begin = self.no_timestamps + 1
        self.languages = [l for l in LANGUAGES[:num_languages] if sid(f"<|{l}|>") is not None]
        self.language_ids = [sid(f"<|{l}|>") for l in self.languages]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of the ids below the end-of-text token (timestamps and specials dropped)."""
        return self.tok.decode([int(i) for i in ids if i < self.eot])

    def sot_sequence(self, language: str | None, task: str) -> list[int]:
        if not self.multilingual:
            return [self.sot]
        if language not in self.languages:
            raise ModelError(f"unknown language {language!r}; valid: {', '.join(self.languages)}")
        return [
            self.sot,
            self.tok.token_to_id(f"<|{language}|>"),
            self.transcribe if task == "transcribe" else self.translate,
        ]

    @functools.cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens of symbols that are not speech (openai-whisper's list): suppressed by default so the
        model does not caption non-speech sounds, keeping single-token ones and the music notes."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        misc = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for s in symbols + list(misc):
            for toks in (self.encode(s), self.encode(" " + s)):
                if len(toks) == 1 or s in misc:
                    result.add(toks[0])
        return tuple(sorted(result))

    def suppress_ids(self, spec: tuple[int, ...] | None) -> list[int]:
        """Ids to suppress for a `suppress_tokens` spec: -1 stands for the non-speech set; the task and
        start tokens are always suppressed, as Whisper does."""
        ids = set()
        for t in spec or ():
            if t == -1:
                ids.update(self.non_speech_tokens)
            elif t >= 0:
                ids.add(t)
        ids.update([self.transcribe, self.translate, self.sot, self.sot_prev])
        if self.sot_lm is not None:
            ids.add(self.sot_lm)
        if self.no_speech is not None:
            ids.add(self.no_speech)
        return sorted(ids)


def tokenizer_from_vocabulary(vocabulary: Path) -> Path:
    """A tokenizer.json made from a CTranslate2 Whisper directory's vocabulary (what its converter writes when
    tokenizer.json is not copied): the tokens in id order, byte-level BPE ones up to <|endoftext|>, then the
    special tokens. Whisper's BPE is tiktoken's, whose merge ranks are the token ids, so the merges are each
    token's splits into two lower-ranked tokens, by the token's rank (as transformers converts tiktoken files).
    Written once to the temporary directory, named by the vocabulary's hash."""
    raw = vocabulary.read_bytes()
    out = Path(tempfile.gettempdir()) / f"speechrt-whisper-tokenizer-{hashlib.sha256(raw).hexdigest()[:16]}.json"
    if out.exists():
        return out
    try:
        text = raw.decode("utf-8")
        tokens = json.loads(text) if vocabulary.suffix == ".json" else text.split("\n")
        eot = tokens.index("<|endoftext|>")
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError):
        raise ModelError(f"{vocabulary}: not a Whisper vocabulary (no <|endoftext|> token)") from None
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    rank = {t: i for i, t in enumerate(tokens[:eot])}
    merges = []
    for token in rank:  # in rank order: a merge ranks as the token it makes
        splits = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in rank and token[i:] in rank]
        merges += sorted(splits, key=lambda lr: (rank[lr[0]], rank[lr[1]]))
    tok = Tokenizer(models.BPE(rank, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[eot:] if t])
    tmp = out.with_suffix(f".{id(tok)}.tmp")
    tok.save(str(tmp))
    tmp.replace(out)
    return out
