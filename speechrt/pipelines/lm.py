"""The language model pipeline: an LM runner, its tokenizer and chat template, and the token loop
(lm_batching). `speechrt.load_lm()` returns one; the server's engine steps its continuous batcher.

    lm = speechrt.load_lm()                       # SmolLM2-135M-Instruct, embedded GGUF, CPU, backend auto
    for piece in lm.chat("What is the capital of France?"):
        print(piece, end="", flush=True)
    async for piece in lm.achat([{"role": "user", "content": "Hi"}], max_tokens=32): ...
    lm.generate_batch(["The sky is", "Once upon a time"], max_tokens=16)   # -> list[str]
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence

from speechrt import backends
from speechrt.errors import ContextLengthExceeded, UserError
from speechrt.models import registry
from speechrt.models.lm_text import ChatTemplate

from .generation import GenerationOptions
from .grammar import prepare
from .lm_batching import ContinuousBatcher, generate_text, stream
from .tool_calls import CallFormat, Tool, call_format, with_tools

__all__ = ["LMPipeline", "load_lm", "GenerationOptions"]


class LMPipeline:
    """A loaded language model: its runner (prefill / decode step on some backend), tokenizer and chat template."""

    def __init__(self, runner, name: str = ""):
        self.runner = runner
        self.name = name or runner.info.model
        self.tokenizer = runner.tokenizer
        self.config = runner.config
        tok = self.tokenizer
        self.template = None
        if runner.chat_template:
            bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None else ""
            eos = tok.id_to_token(tok.eos_id) if tok.eos_id is not None else ""
            self.template = ChatTemplate(runner.chat_template, bos or "", eos or "")

    @property
    def info(self):
        return self.runner.info

    @property
    def call_format(self) -> CallFormat:
        """How this model writes a tool call: as its chat template expects (tool_calls.call_format)."""
        return call_format(self.template.source if self.template is not None else None)

    def batcher(self, max_batch: int = 8, max_seq: int | None = None) -> ContinuousBatcher:
        """A continuous batcher over a KV cache of `max_batch` slots (the server's engine steps one)."""
        return ContinuousBatcher(self.runner, self.tokenizer, max_batch, max_seq)

    def warm_up(self, batcher: ContinuousBatcher) -> None:
        """Run a short chat prompt through `batcher`'s cache on this thread."""
        batcher.warm_up(self.encode_chat([{"role": "user", "content": "Hello."}]))

    # --- prompts -------------------------------------------------------------------------------------------
    def messages(self, prompt, system: str | None = None) -> list[dict]:
        """A chat prompt as a message list: a string is one user turn; `system` is prepended."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system is not None:
            if msgs and msgs[0].get("role") == "system":
                raise UserError("give the system prompt either as `system=` or as the first message, not both")
            msgs.insert(0, {"role": "system", "content": system})
        return msgs

    def render_chat(self, prompt, system: str | None = None, tools: tuple[Tool, ...] = ()) -> str:
        """The prompt's text by the chat template; `tools` (and the calls in the messages, `tool_calls`) as
        tool_calls.with_tools puts them."""
        if self.template is None:
            raise UserError(f"model {self.name!r} carries no chat template; use generate() with a plain prompt")
        msgs, extra = with_tools(self.messages(prompt, system), tools, self.template.source)
        return self.template.render(msgs, add_generation_prompt=True, **extra)

    def encode_chat(self, prompt, system: str | None = None, tools: tuple[Tool, ...] = ()) -> list[int]:
        # the template writes special tokens (and any BOS) itself
        return self.tokenizer.encode(self.render_chat(prompt, system, tools), add_bos=False)

    def prepare_grammars(self) -> None:
        """Build the grammar engine's view of the tokenizer (once, ~0.5 s) on the calling thread, so that the
        first request with a grammar does not stall the batch that steps it."""
        prepare(self.tokenizer, self.config.vocab_size)

    def encode_chat_within(
        self, messages: list[dict], max_tokens: int, drop_older: bool = True, tools: tuple[Tool, ...] = ()
    ) -> list[int]:
        """The chat prompt of `messages` in at most `max_tokens` tokens. `drop_older`: the system message (if
        first) and the latest messages that fit; older turns are left out whole (each message is tokenized
        once to choose them: a long conversation costs one pass, not one per message dropped). Without it,
        all of them. ContextLengthExceeded where what must stay (all of them; the system message and the
        latest message) does not fit: a prompt is never cut inside a message. `tools`: in the prompt as
        render_chat puts them (with the system message, which always stays)."""
        if self.template is not None and (tools or any(m.get("tool_calls") for m in messages)):
            messages, extra = with_tools(messages, tools, self.template.source)
            if extra:  # a template that renders the tools itself: the messages whole
                return self._within_all(messages, max_tokens, tools)
        if not drop_older:
            return self._within_all(messages, max_tokens)
        system = messages[:1] if messages and messages[0].get("role") == "system" else []
        turns = messages[len(system) :]
        sizes = [len(self.tokenizer.encode(str(m.get("content", "")), add_bos=False)) + 8 for m in turns]  # + template
        budget = max_tokens - (len(self.encode_chat(system)) if system else 8)
        keep = len(turns)
        while keep > 1 and sum(sizes[len(turns) - keep :]) > budget:
            keep -= 1
        # the estimate (8 tokens of template a message) may leave out a turn that fits: take it back
        while keep < len(turns) and len(self.encode_chat(system + turns[len(turns) - keep - 1 :])) <= max_tokens:
            keep += 1
        while True:
            ids = self.encode_chat(system + turns[len(turns) - keep :])
            if len(ids) <= max_tokens:
                return ids
            if keep <= 1:
                what = " and ".join(
                    w for w, there in (("the system message", system), ("the latest message", turns)) if there
                )
                raise ContextLengthExceeded(
                    f"{what} alone {'are' if system and turns else 'is'} {len(ids)} tokens, "
                    f"over the {max_tokens} that the language model's context has room for",
                    len(ids),
                    max_tokens,
                )
            keep -= 1

    def _within_all(self, messages: list[dict], max_tokens: int, tools: tuple[Tool, ...] = ()) -> list[int]:
        ids = self.encode_chat(messages, tools=tools)
        if len(ids) > max_tokens:
            raise ContextLengthExceeded(
                f"the messages are {len(ids)} tokens, over the {max_tokens} that the "
                "language model's context has room for",
                len(ids),
                max_tokens,
            )
        return ids

    # --- streaming -----------------------------------------------------------------------------------------
    def options(self, **kw) -> GenerationOptions:
        """GenerationOptions from keywords, with errors that name the valid ones."""
        try:
            return GenerationOptions(**kw)
        except TypeError as e:
            valid = ", ".join(GenerationOptions.__dataclass_fields__)
            raise UserError(f"{e}; valid generation options: {valid}") from None

    def stream_ids(self, ids: list[int], **options) -> Iterator[str]:
        for ev in stream(self.runner, self.tokenizer, [ids], self.options(**options)):
            if ev.text:
                yield ev.text

    def generate(self, prompt: str, **options) -> Iterator[str]:
        """Stream the continuation of a plain-text prompt. Options: see GenerationOptions."""
        opts = self.options(**options)  # validate before the first token is asked for
        ids = self.tokenizer.encode(prompt)
        return self.stream_ids(ids, **opts.__dict__)

    def chat(self, prompt, system: str | None = None, **options) -> Iterator[str]:
        """Stream the assistant's reply to `prompt` (a string, or a list of {'role', 'content'} messages)."""
        opts = self.options(**options)
        return self.stream_ids(self.encode_chat(prompt, system), **opts.__dict__)

    def generate_batch(
        self, prompts: Sequence[str], chat: bool = False, system: str | None = None, **options
    ) -> list[str]:
        """Whole replies for many prompts, decoded together as one batch."""
        enc = (lambda p: self.encode_chat(p, system)) if chat else self.tokenizer.encode
        return generate_text(self.runner, self.tokenizer, [enc(p) for p in prompts], self.options(**options))

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


def load_lm(
    model=None, backend: str = "auto", device: str = "cpu", dtype: str | None = None, step_threads: int | None = None
) -> LMPipeline:
    """Load a language model: a registry name (default: smollm2-135m-instruct), a .gguf file, or a Hugging
    Face Llama-family directory. `dtype` None picks int4 weight-only on the CPU for files with 4-bit blocks
    (int8 for others), bf16/fp16 on GPUs. `step_threads`: CPU threads of each step (1: robust when other
    work shares the cores; None: all)."""
    rm = registry.resolve(model, "lm")
    return LMPipeline(backends.get(backend).lm(rm, device=device, dtype=dtype, step_threads=step_threads), rm.name)
