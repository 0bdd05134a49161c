"""Python API for the small language models: `speechrt.load_lm()` -> LanguageModel.

    lm = speechrt.load_lm()                       # SmolLM2-135M-Instruct, embedded GGUF, torch on CPU
    for piece in lm.chat("What is the capital of France?"):
        print(piece, end="", flush=True)
    async for piece in lm.achat([{"role": "user", "content": "Hi"}], max_tokens=32): ...
    lm.generate_batch(["The sky is", "Once upon a time"], max_tokens=16)   # -> list[str]
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Iterator, Sequence

from speechrt.errors import UserError


class LanguageModel:
    """A loaded language model: its runner (prefill / decode step on some backend), tokenizer and chat template."""

    def __init__(self, runner, name: str = ""):
        from speechrt.models.llm_text import ChatTemplate

        self.runner = runner
        self.name = name
        self.tokenizer = runner.tokenizer
        self.config = runner.config
        tok = self.tokenizer
        self.template = None
        if runner.chat_template:
            bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None else ""
            eos = tok.id_to_token(tok.eos_id) if tok.eos_id is not None else ""
            self.template = ChatTemplate(runner.chat_template, bos or "", eos or "")

    # --- prompts -------------------------------------------------------------------------------------------
    def messages(self, prompt, system: str | None = None) -> list[dict]:
        """A chat prompt as a message list: a string is one user turn; `system` is prepended."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system is not None:
            if msgs and msgs[0].get("role") == "system":
                raise UserError("give the system prompt either as `system=` or as the first message, not both")
            msgs.insert(0, {"role": "system", "content": system})
        return msgs

    def render_chat(self, prompt, system: str | None = None) -> str:
        if self.template is None:
            raise UserError(f"model {self.name!r} carries no chat template; use generate() with a plain prompt")
        return self.template.render(self.messages(prompt, system), add_generation_prompt=True)

    def encode_chat(self, prompt, system: str | None = None) -> list[int]:
        # the template writes special tokens (and any BOS) itself
        return self.tokenizer.encode(self.render_chat(prompt, system), add_bos=False)

    # --- streaming -----------------------------------------------------------------------------------------
    def _options(self, kw):
        from speechrt.models.generate import GenerationOptions

        try:
            return GenerationOptions(**kw)
        except TypeError as e:
            valid = ", ".join(GenerationOptions.__dataclass_fields__)
            raise UserError(f"{e}; valid generation options: {valid}") from None

    def stream_ids(self, ids: list[int], **options) -> Iterator[str]:
        from speechrt.models.generate import stream

        for ev in stream(self.runner, self.tokenizer, [ids], self._options(options)):
            if ev.text:
                yield ev.text

    def generate(self, prompt: str, **options) -> Iterator[str]:
        """Stream the continuation of a plain-text prompt. Options: see models.generate.GenerationOptions."""
        opts = self._options(options)  # validate before the first token is asked for
        ids = self.tokenizer.encode(prompt)
        return self.stream_ids(ids, **opts.__dict__)

    def chat(self, prompt, system: str | None = None, **options) -> Iterator[str]:
        """Stream the assistant's reply to `prompt` (a string, or a list of {'role', 'content'} messages)."""
        opts = self._options(options)
        return self.stream_ids(self.encode_chat(prompt, system), **opts.__dict__)

    def generate_batch(self, prompts: Sequence[str], chat: bool = False, system: str | None = None,
                       **options) -> list[str]:
        """Whole replies for many prompts, decoded together as one batch."""
        from speechrt.models.generate import generate_text

        enc = (lambda p: self.encode_chat(p, system)) if chat else self.tokenizer.encode
        return generate_text(self.runner, self.tokenizer, [enc(p) for p in prompts], self._options(options))

    async def agenerate(self, prompt: str, **options) -> AsyncIterator[str]:
        async for piece in _aiter(self.generate(prompt, **options)):
            yield piece

    async def achat(self, prompt, system: str | None = None, **options) -> AsyncIterator[str]:
        async for piece in _aiter(self.chat(prompt, system, **options)):
            yield piece


_END = object()


async def _aiter(it: Iterator[str]) -> AsyncIterator[str]:
    """Drive a blocking iterator from a worker thread, one item at a time, so the event loop stays free.
    If the consumer stops early the iterator is closed (on a thread, after any step in flight)."""
    lock = threading.Lock()

    def step():
        with lock:
            return next(it, _END)

    try:
        while True:
            item = await asyncio.to_thread(step)
            if item is _END:
                return
            yield item
    finally:
        def close():
            with lock:
                it.close()
        threading.Thread(target=close, daemon=True).start()


def load_lm(model=None, backend: str = "torch", device: str = "cpu", dtype: str | None = None) -> LanguageModel:
    """Load a language model: a registry name (default: smollm2-135m-instruct), a .gguf file, or a Hugging
    Face Llama-family directory; `dtype` None picks int8 weight-only on CPU, bf16/fp16 on GPU."""
    from speechrt import backends
    from speechrt.models import registry

    rm = registry.resolve(model, "slm")
    try:
        be = backends.get(backend)
    except ValueError as e:
        raise UserError(str(e)) from None
    return LanguageModel(be.slm(rm, device=device, dtype=dtype), rm.name)
