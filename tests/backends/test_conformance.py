"""The runner conformance suite: every backend available on this machine, for every model family it runs,
through the runner interface (backends/base.py) on the embedded models, against the torch runner. A new
backend's runner is done when it passes this file; nothing else needs to change.

Here (CPU): torch for all families, onnxruntime for speech synthesis. On a CUDA or ROCm machine the triton
backend is picked up too; without one it is skipped with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speechrt import backends
from speechrt.errors import UserError
from speechrt.models.audio import utterance_mel
from speechrt.models.registry import resolve
from speechrt.pipelines.asr import ASRPipeline, TranscribeOptions
from speechrt.pipelines.generation import GenerationOptions
from speechrt.pipelines.lm import LMPipeline
from speechrt.pipelines.lm_batching import LMRequest, stream
from speechrt.pipelines.tts import SynthesisOptions, TTSPipeline, stream_latent

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPEECH = [
    "The museum opens at nine and closes at five on weekdays.",
    "Turn left at the traffic lights and then go straight ahead.",
    "I would like a cup of coffee with a little sugar, please.",
]
CHATS = ["What is the capital of France?", "Write a haiku about the sea.", "List three uses of copper."]
LONG = (
    "When the morning train finally pulled into the quiet station, the travelers gathered their heavy bags "
    "and walked slowly toward the old wooden bridge that crossed the river."
)


def build(family: str, backend: str, dtype: str | None = None):
    """The backend's runner of the family's embedded model, or a skip saying why it cannot run here."""
    build_runner = {"asr": backends.get(backend).asr, "lm": backends.get(backend).lm, "tts": backends.get(backend).tts}
    try:
        return build_runner[family](resolve(None, family), device=DEVICE, dtype=dtype)
    except UserError as e:  # e.g. triton without a GPU
        pytest.skip(f"{backend} cannot run {family} here: {e}")


def check_info(runner, family: str):
    """Every runner describes itself (for logs, benchmarks, /healthz)."""
    info = runner.info
    assert info.backend in backends.available(family) and info.model == resolve(None, family).name
    assert info.precision and info.device.startswith(DEVICE) and str(info)


def params(family: str):
    return [pytest.param(b, id=b) for b in backends.available(family)]


# -- speech recognition ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_asr():
    return ASRPipeline(build("asr", "torch", "float32"))


@pytest.fixture(scope="module")
def speech(synth):
    return [synth(t) for t in SPEECH]


@pytest.fixture(scope="module", params=params("asr"))
def asr(request, reference_asr):
    return reference_asr if request.param == "torch" else ASRPipeline(build("asr", request.param, "float32"))


@pytest.fixture(scope="module")
def reference_transcripts(reference_asr, speech):
    """The torch runner's greedy transcripts of `speech` (made once for every backend's comparison)."""
    return reference_asr.transcribe_batch(speech, TranscribeOptions(without_timestamps=True))


def test_asr_greedy_ids_equal_the_torch_runner(asr, reference_asr, reference_transcripts, speech):
    """Batched greedy decoding (one encoder pass, rows leaving as they finish) and drafted decoding (a draft
    checked in one pass with last_only=False, then a rewind) give the torch runner's token ids (the torch
    runner itself: its drafted decoding gives its plain greedy ids)."""
    check_info(asr.runner, "asr")
    opts = TranscribeOptions(without_timestamps=True)
    ref = reference_transcripts
    assert all(len(r.tokens) > 5 for r in ref)
    if asr is not reference_asr:
        got = asr.transcribe_batch(speech, opts)
        assert [g.tokens for g in got] == [r.tokens for r in ref]
    drafts = [r.tokens[: len(r.tokens) // 2] + [11, 12] for r in ref]  # right half, then wrong tokens
    assert [g.tokens for g in asr.transcribe_batch(speech, opts, drafts)] == [r.tokens for r in ref]


def _prompted_state(runner, tok, audio, rows: int):
    mel = utterance_mel(audio, runner.config.n_mels, runner.device)[None]
    state = runner.start(runner.encode(mel), rows, 32)
    prompt = tok.sot_sequence("en", "transcribe") + [tok.no_timestamps]
    return state, runner.decode_step(state, torch.tensor([prompt] * rows, device=runner.device)), len(prompt)


def test_asr_reorder_and_rewind(asr, speech):
    """reorder keeps the chosen rows (beams swap, finished rows leave) and rewind forgets the tail: the
    logits of every later step are those of a state built without the detour."""
    r, tok = asr.runner, asr.tokenizer
    with torch.inference_mode():
        state, _, n_prompt = _prompted_state(r, tok, speech[0], 2)
        a = r.decode_step(state, torch.tensor([[440], [1002]], device=r.device))  # rows differ from here on
        b = r.decode_step(state, torch.tensor([[2068], [2068]], device=r.device))
        assert not torch.allclose(b[0], b[1])
        state = r.reorder(state, torch.tensor([1, 0], device=r.device))
        swapped = r.decode_step(state, torch.tensor([[13], [13]], device=r.device))
        # the same two steps on a fresh state in the swapped order
        fresh, _, _ = _prompted_state(r, tok, speech[0], 2)
        r.decode_step(fresh, torch.tensor([[1002], [440]], device=r.device))
        r.decode_step(fresh, torch.tensor([[2068], [2068]], device=r.device))
        ref = r.decode_step(fresh, torch.tensor([[13], [13]], device=r.device))
        torch.testing.assert_close(swapped, ref, rtol=1e-4, atol=1e-4)
        # rewind over the last two positions, then the same tokens again: the same logits
        state = r.rewind(state, n_prompt + 1)
        again = r.decode_step(state, torch.tensor([[2068], [2068]], device=r.device))
        torch.testing.assert_close(again, b.flip(0), rtol=1e-4, atol=1e-4)
        # dropping a row: the one kept goes on as before
        state = r.reorder(state, torch.tensor([0], device=r.device))
        kept = r.decode_step(state, torch.tensor([[13]], device=r.device))
        torch.testing.assert_close(kept[0], swapped[0], rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError):
            r.rewind(state, 10_000)
    assert torch.isfinite(a).all()


def test_asr_trimmed_windows_do_not_depend_on_the_batch(asr, speech):
    """A runner that trims (encodes fewer than 3000 frames) must give a row the same decoding whatever the
    other rows' lengths: the first steps' logits of a short utterance alone and batched with a longer one."""
    r, tok = asr.runner, asr.tokenizer
    if not r.trims:
        pytest.skip(f"{r.info.backend} encodes whole windows only")
    mels = torch.stack([utterance_mel(a, r.config.n_mels, r.device) for a in speech[:2]])
    frames = [(len(a) // 160 + 100) // 2 * 2 for a in speech[:2]]
    prompt = torch.tensor([tok.sot_sequence("en", "transcribe") + [tok.no_timestamps]], device=r.device)
    with torch.inference_mode():
        alone = r.decode_step(r.start(r.encode(mels[:1, :, : frames[0] + 32], None, frames[:1]), 1, 8), prompt)
        both = r.decode_step(
            r.start(r.encode(mels[:, :, : max(frames) + 64], None, frames), 1, 8), prompt.expand(2, -1)
        )
    torch.testing.assert_close(both[0], alone[0], rtol=1e-3, atol=1e-3)


def test_asr_encode_stops_between_blocks(asr, speech):
    r = asr.runner
    asked = []

    def stop():
        asked.append(1)
        return len(asked) == 2  # let the first block run, stop before the second

    mel = utterance_mel(speech[0], r.config.n_mels, r.device)[None]
    with torch.inference_mode():
        assert r.encode(mel, stop) is None
    assert len(asked) == 2 < r.config.n_audio_layer


# -- language model ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_lm():
    return LMPipeline(build("lm", "torch", "float32"))


# torch:int4 is the torch backend's int4 on the CPU with kernels/cpu_decode (backends/torch/cpu_lm.py)
@pytest.fixture(scope="module", params=params("lm") + [pytest.param("torch:int4", id="torch-int4")])
def lm(request, reference_lm):
    if request.param == "torch":
        return reference_lm
    backend, _, dtype = request.param.partition(":")
    if dtype:
        from speechrt.kernels.cpu_decode import unavailable

        if DEVICE != "cpu" or unavailable():
            pytest.skip(f"the CPU int4 kernel does not run here: {unavailable() or DEVICE}")
    return LMPipeline(build("lm", backend, dtype or "float32"))


def _greedy_ids(lm, ids, n) -> list[int]:
    o = GenerationOptions(max_tokens=n, stop_token_ids=())
    return [ev.token for ev in stream(lm.runner, lm.tokenizer, [ids], o)]


@pytest.fixture(scope="module")
def reference_ids(reference_lm):
    """The torch runner's 32 greedy ids per chat (made once for every backend's comparison)."""
    return {c: _greedy_ids(reference_lm, reference_lm.encode_chat(c), 32) for c in CHATS[:2]}


def test_lm_greedy_ids_equal_the_torch_runner(lm, reference_lm, reference_ids):
    """Every other backend's greedy ids are the torch runner's (the reference: its own batching and slot
    release are tested below); int4 weights answer the first chat as float32 does."""
    check_info(lm.runner, "lm")
    for chat, ref in reference_ids.items():
        ids = lm.encode_chat(chat)
        assert ids == reference_lm.encode_chat(chat)
        assert len(ref) == 32
        if lm.info.precision == "int4":
            assert _greedy_ids(lm, ids, 32) == ref or chat != CHATS[0], chat
        elif lm is not reference_lm:
            assert _greedy_ids(lm, ids, 32) == ref, chat


def test_lm_continuous_batching_equals_single_runs(lm):
    """Sequences join a running batch (into whichever slots are free) and leave it at different steps;
    each one's tokens are those of its run alone."""
    prompts = [lm.encode_chat(c) for c in CHATS]
    lengths = [20, 6, 14]
    single = [_greedy_ids(lm, p, n) for p, n in zip(prompts, lengths)]
    got: dict[int, list[int]] = {i: [] for i in range(3)}
    batcher = lm.batcher(max_batch=2, max_seq=256)  # two slots for three requests: one waits for a slot

    def req(i):
        return LMRequest(
            prompts[i],
            GenerationOptions(max_tokens=lengths[i], stop_token_ids=()),
            lambda piece, i=i: got[i].append(piece.token),
        )

    batcher.submit(req(0))
    for _ in range(3):
        batcher.step()
    batcher.submit(req(1))
    batcher.submit(req(2))
    while batcher.has_work():
        batcher.step()
    assert [got[i] for i in range(3)] == single


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def test_lm_grammar_masks_only_its_own_row(lm):
    """A request with a JSON schema grammar and one without share the continuous batch: the first writes JSON
    valid against the schema, the other's tokens are those of its run alone (the mask touches its row only)."""
    import json

    import jsonschema

    from speechrt.pipelines.grammar import Grammar

    prompts = [lm.encode_chat("Is the sky blue? Answer in JSON."), lm.encode_chat(CHATS[0])]
    free = _greedy_ids(lm, prompts[1], 12)
    got: dict[int, list] = {0: [], 1: []}
    opts = [GenerationOptions(max_tokens=24, grammar=Grammar.json_schema(ANSWER)), GenerationOptions(max_tokens=12)]
    batcher = lm.batcher(max_batch=2, max_seq=256)
    for i in (0, 1):
        batcher.submit(LMRequest(prompts[i], opts[i], lambda piece, i=i: got[i].append(piece)))
    while batcher.has_work():
        batcher.step()
    assert got[0][-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(p.text for p in got[0])), ANSWER)
    assert [p.token for p in got[1]][: len(free)] == free[: len(got[1])] and len(got[1]) >= 2


def test_lm_slot_release(lm):
    """A released slot is reused from position 0: its next prompt's logits are a fresh cache's."""
    r = lm.runner
    a, b = lm.encode_chat(CHATS[0]), lm.encode_chat(CHATS[1])
    with torch.inference_mode():
        cache = r.new_cache(1, 128)
        r.prefill(cache, 0, torch.tensor(a))
        r.decode_step(cache, [0], torch.tensor([42]))
        r.release(cache, 0)
        reused = r.prefill(cache, 0, torch.tensor(b))
        fresh = r.prefill(r.new_cache(1, 128), 0, torch.tensor(b))
    torch.testing.assert_close(reused, fresh, rtol=1e-4, atol=1e-4)


# the architectures beyond the Llama graph (tests/lm_archs.py: tiny random-weight Qwen2, Qwen3, Llama 3, Mistral,
# Phi-3 and Gemma 3 folders written by transformers); logits per backend: tests/backends/test_lm_architectures.py


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory):
    pytest.importorskip("transformers", reason="the models are written by transformers: pip install 'speechrt[peers]'")
    from lm_archs import ARCHS, CONVERSATION, byte_bpe, greedy_hf, written

    bpe, out = byte_bpe(), {}
    for name in ARCHS:
        model, d = written(name, tmp_path_factory, bpe)
        m = resolve(str(d), "lm")
        ids = LMPipeline(backends.get("torch").lm(m, dtype="float32")).encode_chat(CONVERSATION)
        out[name] = m, ids, greedy_hf(model, ids, 12)
    return out


@pytest.mark.parametrize("backend", params("lm"))
def test_lm_architectures_greedy_ids_equal_transformers(backend, arch_models):
    """Every backend that runs language models runs each architecture: greedy ids of a chat prompt (the
    template from the folder) are transformers'."""
    from lm_archs import CONVERSATION

    for name, (m, ids, ref) in arch_models.items():
        try:
            lm = LMPipeline(backends.get(backend).lm(m, device=DEVICE, dtype="float32"))
        except UserError as e:  # e.g. triton without a GPU
            pytest.skip(f"{backend} cannot run language models here: {e}")
        assert lm.encode_chat(CONVERSATION) == ids, name
        assert _greedy_ids(lm, ids, 12) == ref, (backend, name)


# -- speech synthesis ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_tts(one_cpu_thread):
    return TTSPipeline(build("tts", "torch"))


@pytest.fixture(scope="module", params=params("tts"))
def tts(request, reference_tts):
    return reference_tts if request.param == "torch" else TTSPipeline(build("tts", request.param))


def test_tts_windows_equal_the_whole_sentence(tts, reference_tts):
    """The streamed windows (context on both sides, crossfaded borders) are the whole-sentence audio, and the
    whole sentence is the torch runner's."""
    r = tts.runner
    check_info(r, "tts")
    o = SynthesisOptions(noise_scale=0.0, noise_w=0.0, max_chunk_frames=128)  # windows small enough for 5+ borders
    ids = next(tts.text.sentences(LONG))
    lat = r.latent(ids, o)
    whole = r.vocode(lat, 0, lat.frames).numpy()
    chunks = [c.numpy() for c in stream_latent(r, lat, o)]
    out = np.concatenate(chunks)
    assert len(chunks) >= 5 and len(chunks[0]) == o.first_chunk_frames * r.hop_length
    assert out.shape == whole.shape
    # away from the crossfades the chunked audio is the whole-sentence audio; across them, inaudibly close
    borders = np.cumsum([len(c) for c in chunks])[:-1]
    away = np.ones(len(out), bool)
    for b in borders:
        away[b : b + o.crossfade] = False
    assert np.abs(out - whole)[away].max() <= 1e-4
    assert np.abs(out - whole).max() <= 1e-3
    assert np.abs(whole).max() > 0.1
    ref_r = reference_tts.runner
    ref_lat = ref_r.latent(ids, o)
    ref = ref_r.vocode(ref_lat, 0, ref_lat.frames).numpy()
    assert ref.shape == whole.shape and np.abs(ref - whole).max() <= 1e-3
