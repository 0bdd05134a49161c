"""Text front end of the language models: byte-level BPE tokenizer, chat template, incremental detokenizer.

The tokenizer is built with the `tokenizers` library from what the model file carries: for a GGUF, the
`tokenizer.ggml.*` metadata (tokens, merges, token types, pre-tokenizer name); for a Hugging Face
directory, its `tokenizer.json`. The chat template is the Jinja source stored with the model
(`tokenizer.chat_template`, or `chat_template` in tokenizer_config.json), rendered the way transformers
renders it (sandboxed, trim_blocks + lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`).
"""

from __future__ import annotations

import codecs
import json
from functools import lru_cache
from pathlib import Path

from .registry import ModelError

# control tokens that end an assistant turn, in the vocabularies of common chat models
END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|end|>",
    "</s>",
    "<end_of_turn>",
    "<|eom_id|>",
)

# GGUF `tokenizer.ggml.pre` -> split regex applied before the byte-level step (llama.cpp's llama-vocab.cpp).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}
# pre-tokenizers that isolate every digit before the GPT-2 regex (SmolLM's "smollm", StarCoder's)
DIGIT_PRES = ("smollm", "starcoder", "refact")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class LMTokenizer:
    """Byte-level BPE tokenizer. Special (control) tokens written in text are matched whole by `encode`
    (chat templates rely on that) and are left out of decoded text."""

    def __init__(
        self,
        tok,
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool,
        special_ids: set[int],
        byte_level: bool = True,
        strip_first: bool | None = None,
    ):
        self._tok = tok  # tokenizers.Tokenizer
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.special_ids = frozenset(special_ids)
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.byte_level = byte_level
        # whether decoded text loses the space its first SentencePiece piece starts with (Llama 2's '▁Sure'; not
        # Gemma's, which prepends none)
        self.strip_first = (not byte_level) if strip_first is None else strip_first
        self._bytes: list[bytes] | None = None

    # --- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, md: dict, source: Path | str = "GGUF") -> LMTokenizer:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        kind = md.get("tokenizer.ggml.model")
        if kind == "llama":
            from .lm_sentencepiece import from_gguf

            return from_gguf(cls, md, source)
        if kind != "gpt2":
            raise ModelError(
                f"{source}: tokenizer model {kind!r} is not supported; supported: 'gpt2' (byte-level BPE), "
                "'llama' (SentencePiece BPE with byte fallback)"
            )
        tokens = md.get("tokenizer.ggml.tokens")
        merges = md.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ModelError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens / tokenizer.ggml.merges")
        types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alpha = set(byte_alphabet().values())
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
        tok = Tokenizer(bpe)
        pre = md.get("tokenizer.ggml.pre", "default")
        bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in PRE_SPLITS)
        if pre in PRE_SPLITS:
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRE_SPLITS[pre]), "isolated"), bl])
        elif pre in DIGIT_PRES:
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
        else:
            tok.pre_tokenizer = bl
        tok.decoder = decoders.ByteLevel()
        # CONTROL (3) tokens are special; USER_DEFINED (4) are matched whole but kept in decoded text.
        special = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3 and set(t) <= alpha]
        user = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 4]
        tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in special])
        if user:
            tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False) for i in user])

        def tid(key):
            v = md.get(key)
            return int(v) if v is not None else None

        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False))
        return cls(tok, tid("tokenizer.ggml.bos_token_id"), tid("tokenizer.ggml.eos_token_id"), add_bos, set(special))

    @classmethod
    def from_hf_dir(cls, d: Path) -> tuple[LMTokenizer, str | None]:
        """(tokenizer, chat template) of a Hugging Face model directory."""
        from tokenizers import Tokenizer

        tj = d / "tokenizer.json"
        if not tj.exists():
            raise ModelError(f"{d}: no tokenizer.json (a Hugging Face fast tokenizer is required)")
        tok = Tokenizer.from_file(str(tj))
        conf = {}
        tc = d / "tokenizer_config.json"
        if tc.exists():
            conf = json.loads(tc.read_text())
        template = conf.get("chat_template")
        if isinstance(template, list):  # named templates: take the default
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        jt = d / "chat_template.jinja"
        if template is None and jt.exists():
            template = jt.read_text()

        def tid(name):
            v = conf.get(name)
            if isinstance(v, dict):
                v = v.get("content")
            return tok.token_to_id(v) if v else None

        special = {i for i, at in tok.get_added_tokens_decoder().items() if at.special}
        # byte-level BPE (GPT-2's alphabet: Llama 3, Qwen, SmolLM) or SentencePiece pieces ('▁' for a space,
        # <0xNN> byte tokens: Llama 2, Mistral 7B, Phi-3), as the tokenizer's decoder says
        decoder = json.dumps(json.loads(tok.to_str()).get("decoder"))
        byte_level = "ByteLevel" in decoder
        gen = {}
        if (d / "generation_config.json").exists():
            gen = json.loads((d / "generation_config.json").read_text())
        eos = tid("eos_token")
        if eos is None and isinstance(gen.get("eos_token_id"), int):
            eos = gen["eos_token_id"]
        add_bos = bool(conf.get("add_bos_token", False))
        return cls(tok, tid("bos_token"), eos, add_bos, special, byte_level, '"Strip"' in decoder), template

    def save(self, directory: Path) -> dict:
        """Write tokenizer.json into `directory` -> the other facts `load` needs (JSON-serializable)."""
        self._tok.save(str(Path(directory) / "tokenizer.json"))
        return {
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "add_bos": self.add_bos,
            "special_ids": sorted(self.special_ids),
            "byte_level": self.byte_level,
            "strip_first": self.strip_first,
        }

    @classmethod
    def load(cls, directory: Path, facts: dict) -> LMTokenizer:
        """The tokenizer `save` wrote into `directory`."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
        return cls(
            tok,
            facts["bos_id"],
            facts["eos_id"],
            facts["add_bos"],
            set(facts["special_ids"]),
            facts["byte_level"],
            facts.get("strip_first"),
        )

    # --- use -----------------------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end generation by default: EOS and the end-of-turn control tokens of the vocabulary."""
        out = [] if self.eos_id is None else [self.eos_id]
        for t in END_OF_TURN:
            i = self._tok.token_to_id(t)
            if i is not None and i in self.special_ids and i not in out:
                out.append(i)
        return tuple(out)

    def to_json(self) -> str:
        """The tokenizer as Hugging Face tokenizer.json text (what grammar engines read its vocabulary from)."""
        return self._tok.to_str()

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` stands for in decoded text (b'' for special tokens)."""
        if self._bytes is None:
            inv = {c: b for b, c in byte_alphabet().items()}
            table = []
            for j in range(self.vocab_size):
                t = self._tok.id_to_token(j)
                if t is None or j in self.special_ids:
                    table.append(b"")
                elif self.byte_level and all(c in inv for c in t):
                    table.append(bytes(inv[c] for c in t))
                elif not self.byte_level and len(t) == 6 and t[:3] == "<0x" and t[5] == ">" and _hex(t[3:5]):
                    table.append(bytes([int(t[3:5], 16)]))  # a SentencePiece byte-fallback token
                elif not self.byte_level:
                    table.append(t.replace("\u2581", " ").encode("utf-8"))
                else:  # added (user-defined) tokens are stored as plain text
                    table.append(t.encode("utf-8"))
            self._bytes = table
        return self._bytes[i] if 0 <= i < len(self._bytes) else b""


def _hex(s: str) -> bool:
    return all(c in "0123456789ABCDEFabcdef" for c in s)


class Detokenizer:
    """Incremental detokenization: token ids in, text out as soon as it is whole UTF-8. A character split
    across tokens is held back until its last byte arrives; `flush()` ends the stream (an incomplete
    trailing sequence becomes U+FFFD). A SentencePiece text loses the space its first piece starts with ('▁Sure'),
    as the tokenizer's decode does."""

    def __init__(self, tokenizer: LMTokenizer):
        self.tok = tokenizer
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = tokenizer.strip_first

    def add(self, token: int) -> str:
        text = self._dec.decode(self.tok.token_bytes(token))
        if self._first and text:
            self._first = False
            return text.removeprefix(" ")
        return text

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class ChatTemplate:
    """A model's Jinja chat template, rendered the way transformers' apply_chat_template renders it."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        import jinja2
        import jinja2.ext  # not imported by `import jinja2`: loopcontrols lives there
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ModelError(f"chat template: {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            from datetime import datetime

            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._t = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ModelError(f"the model's chat template is not valid Jinja: {e}") from None
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kw) -> str:
        check_messages(messages)
        return self._t.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **kw,
        )


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ModelError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ModelError(f"message {i} must be a dict with 'role' and 'content', got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ModelError(f"message {i} has role {m['role']!r}; valid roles: {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise ModelError(f"message {i} content must be a string")
