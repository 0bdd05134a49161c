"""`speechrt serve --lm <folder>` for every architecture the language model supports (tests/lm_archs.py's tiny
random-weight models with their real chat templates): the command line's options resolve the folder and the
backend as `serve` does (auto: this machine's choice), the server loads it beside the embedded speech model, lists
it and answers a chat completion through the official openai SDK, its usage counting the tokens it sampled (the
answer's text re-encoded counted 8 for 6 with Mistral's and Phi-3's byte-fallback vocabularies)."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("transformers", reason="writes the tiny models: pip install 'speechrt[peers]'")

from lm_archs import ARCHS, CONVERSATION, byte_bpe, written  # noqa: E402 - tests/lm_archs.py


@pytest.fixture(scope="module")
def bpe():
    return byte_bpe()


@pytest.mark.parametrize("name", list(ARCHS))
def test_serve_with_each_architecture_answers(name, tmp_path_factory, bpe, asr, server_factory):
    import argparse

    from speechrt import cli_serve
    from speechrt.pipelines.lm import load_lm

    _, folder = written(name, tmp_path_factory, bpe)
    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    config = cli_serve.server_config(p.parse_args(["--lm", str(folder), "--port", "0"]))
    lm = load_lm(config.models.lm, *config.models.asked("lm"), None)
    with server_factory(config.options, asr, lm) as srv:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0)
        assert lm.name in {m.id for m in client.models.list().data}
        r = client.chat.completions.create(model=lm.name, messages=CONVERSATION, max_tokens=6, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 6, r.usage
    assert choice.finish_reason == "stop" or r.usage.completion_tokens == 6, r.usage  # the tokens sampled
