"""Hugging Face Hub ids wherever a model is named (models/hub.py), offline: a cache folder laid out as the Hub's
(models--owner--name/snapshots/<commit>/..., refs/main) holding a tiny random Whisper of large-v3-turbo's structure, a
tiny random Qwen2 folder and a GGUF; HF_HUB_OFFLINE=1 and HF_HUB_CACHE point at it. A repository not there is one
line naming the cache (exit 2 from the CLI); an unreachable Hub likewise; a bare unknown name still lists the
registered ones."""

from __future__ import annotations

import numpy as np
import pytest

import speechrt
from speechrt.cli import main
from speechrt.models.registry import ModelError, resolve
from speechrt.pipelines.asr import SAMPLE_SPEECH

transformers = pytest.importorskip("transformers", reason="the models are written by transformers")
hub = pytest.importorskip("huggingface_hub")
wl = pytest.importorskip("whisper_large")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WHISPER = "openai/whisper-large-v3-turbo"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
QWEN_GGUF = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
GGUF_FILE = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
VOICES, VOICE_DIR = "rhasspy/piper-voices", "en/en_US/joe/medium"


def snapshot(cache, repo: str):
    """The snapshot folder of `repo` in a Hub cache, with refs/main naming it (as huggingface_hub lays it out)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    d = root / "snapshots" / COMMIT
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from lm_archs import byte_bpe, hf_model, save_hf, write_gguf

    c = tmp_path_factory.mktemp("hub")
    wl.save_hf(wl.model("large-v3-turbo"), snapshot(c, WHISPER))
    bpe, qwen = byte_bpe(), hf_model("qwen2")
    save_hf(snapshot(c, QWEN), "qwen2", qwen, bpe)
    write_gguf(snapshot(c, QWEN_GGUF) / GGUF_FILE, "qwen2", qwen, bpe)
    voice = resolve(None, "tts").path  # the Hub's cache links snapshot files to blobs: links here too
    for repo, names in ((VOICES, (voice.name, voice.name + ".json")), ("someone/voices", (voice.name,))):
        d = snapshot(c, repo) / VOICE_DIR
        d.mkdir(parents=True)
        for n in names:
            (d / n).symlink_to(voice.with_name(n))
    return c


@pytest.fixture
def offline(cache, monkeypatch):
    """huggingface_hub reads its environment when imported: its constants are set as the variables would."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_asr_by_hub_id_from_the_cache(offline):
    m = resolve(WHISPER, "asr")
    assert m.name == WHISPER and m.format == "hf-whisper"
    assert m.path == offline / "models--openai--whisper-large-v3-turbo" / "snapshots" / COMMIT
    asr = speechrt.load_asr(WHISPER, backend="torch")
    assert asr.name == WHISPER and asr.runner.config.n_mels == 128 and asr.languages()[-1] == "yue"
    speech = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    detected = asr.detect_language(speech, 1)[0][0]
    assert detected in asr.languages()
    # the onnxruntime backend exports it on first use, into an export cache entry named after the id
    ort = speechrt.load_asr(WHISPER, backend="onnxruntime", dtype="float32")
    assert ort.name == WHISPER and ort.detect_language(speech, 1)[0][0] == detected


def test_lm_by_hub_id_and_by_a_gguf_file_of_a_repository(offline):
    m = resolve(QWEN, "lm")
    assert (m.name, m.format) == (QWEN, "hf-llama") and (m.path / "model.safetensors").exists()
    g = resolve(f"{QWEN_GGUF}:{GGUF_FILE}", "lm")
    assert (g.name, g.format, g.path.name) == (f"{QWEN_GGUF}:{GGUF_FILE}", "gguf", GGUF_FILE)
    lm = speechrt.load_lm(QWEN, backend="torch", dtype="float32")
    assert lm.name == QWEN
    ids = lm.encode_chat([{"role": "user", "content": "Name three colors."}])
    gguf = speechrt.load_lm(f"{QWEN_GGUF}:{GGUF_FILE}", backend="torch", dtype="float32")
    assert gguf.encode_chat([{"role": "user", "content": "Name three colors."}]) == ids


def test_a_voice_file_of_a_repository_comes_with_its_json(offline):
    v = resolve(f"{VOICES}:{VOICE_DIR}/en_US-joe-medium.onnx", "tts")
    assert v.format == "piper-onnx" and v.path.with_name("en_US-joe-medium.onnx.json").exists()
    with pytest.raises(ModelError, match="someone/voices:.*is not in the Hugging Face cache.*onnx.json"):
        resolve(f"someone/voices:{VOICE_DIR}/en_US-joe-medium.onnx", "tts")
    with pytest.raises(ModelError, match="name the tts model's file in the repository: rhasspy/piper-voices:<file>"):
        resolve(VOICES, "tts")


def test_a_repository_not_in_the_offline_cache_is_one_line_naming_the_cache(offline, capsys):
    with pytest.raises(ModelError) as e:
        resolve("openai/whisper-large-v9", "asr")
    msg = str(e.value)
    assert "\n" not in msg and "openai/whisper-large-v9" in msg
    assert str(offline) in msg and "HF_HUB_OFFLINE=1" in msg and "hf download openai/whisper-large-v9" in msg
    with pytest.raises(ModelError, match=f"not in the Hugging Face cache {offline}"):
        resolve(f"{QWEN_GGUF}:missing.gguf", "lm")
    assert main(["transcribe", "--model", "openai/whisper-large-v9", str(SAMPLE_SPEECH)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speechrt transcribe: error: openai/whisper-large-v9") and "\n" not in err
    assert str(offline) in err
    assert main(["serve", "--asr", "openai/whisper-large-v9", "--transcription-only", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("speechrt serve: error: openai/whisper-large-v9 is not in the Hugging Face cache")


def test_an_unreachable_hub_is_one_line_naming_the_cache(cache, monkeypatch):
    """Not offline, but nothing listens at the Hub's address: the download fails at once and says how to fill
    the cache."""
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with pytest.raises(ModelError) as e:
        resolve("openai/whisper-large-v9", "asr")
    msg = str(e.value)
    assert "\n" not in msg and "cannot be reached" in msg and str(cache) in msg and "HF_HUB_OFFLINE=1" in msg


def test_a_bare_unknown_name_lists_the_registered_ones(offline):
    """A name that is not owner/name, or a relative path to a model file that is not there, is not a Hub id."""
    for name in ("whisper-huge-xl", "models/whisper.pt", "models/qwen.gguf"):
        with pytest.raises(ModelError) as e:
            resolve(name, "asr")
        assert "registered asr models: whisper-tiny.en" in str(e.value) and "no such file" in str(e.value)
