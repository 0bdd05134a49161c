"""Shared fixtures: the embedded models load once per session; test speech comes from a real speech
synthesizer (Piper, through the `piper-tts` peer package, with the embedded voice)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

# Triton kernels run on the CPU through the Triton interpreter in tests/kernels. `triton.jit` decides at
# decoration time whether a kernel is interpreted, and triton.language's own helpers (tl.sum's combine
# function, ...) are decorated when triton is first imported; a test module imported during collection
# (a backend list, torch itself) can import triton, so this is done here, before any test module, with
# TRITON_INTERPRET=1 set only for these imports.
# SPEECHRT_TEST_DEVICE=cuda runs the kernel tests compiled on a GPU instead (tests/kernels/conftest.py).
if (
    importlib.util.find_spec("triton") is not None
    and "triton" not in sys.modules
    and os.environ.get("SPEECHRT_TEST_DEVICE", "cpu") == "cpu"
):
    _prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from speechrt import kernels as _k

        for _mod in _k.TRITON_MODULES:
            importlib.import_module(_mod)
        importlib.import_module("speechrt.kernels.triton_decode_attention")
        importlib.import_module("speechrt.kernels.triton_fused")
        importlib.import_module("speechrt.kernels.triton_fused_whisper")
        importlib.import_module("speechrt.kernels.triton_fused_quant")
        importlib.import_module("speechrt.kernels.triton_fused_split")
        importlib.import_module("speechrt.kernels.triton_whisper_pick")
        importlib.import_module("speechrt.kernels.triton_repeats")
    finally:
        if _prev is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = _prev

import numpy as np
import pytest

from speechrt.models.audio import resample

# Tests that time real-time streams (latency bounds, stalls, a browser's microphone) or start clusters of
# processes: the README's test command runs them after the others, alone, so that a second test worker
# (pytest-xdist, `-n 2`) does not share the two cores with them.
# (node id prefixes: a directory, a file, or one test whose outcome depends on how the engine's worker and
# the event loop interleave)
SERIAL = (
    "tests/reliability/",
    "tests/streaming/test_demo_page.py",
    "tests/bench/test_server_sweep.py",
    # two timed runs of one commit must compare equal: not beside another worker's load
    "tests/bench/test_compare.py",
    "tests/bench/test_report.py",
    "tests/streaming/test_ray_scale.py",
    "tests/streaming/test_workers.py",
    "tests/streaming/test_silence_server.py",
    "tests/streaming/test_transcription_server.py::test_early_transcript_becomes_the_final_one",
    "tests/streaming/test_transcription_server.py::test_semantic_vad_ends_a_finished_turn",
    "tests/streaming/test_transcription_server.py::test_graceful_shutdown",
    "tests/streaming/test_engine.py::test_promoted_and_superseded_partials",
    "tests/streaming/test_engine.py::test_final_transcript_stops_the_sessions_running_partial",
    "tests/streaming/test_engine.py::test_opening_partials_go_first_and_finals_do_not_stop_them",
    # live rounds must agree on words before the turn ends: too slow beside another worker (CI, once)
    "tests/streaming/test_conversation.py::test_the_reply_prompt_is_read_while_the_turn_is_spoken",
)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: one intra-op thread each (OpenMP barriers of two-thread regions stall
    # for a time slice whenever the other worker holds a core)
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session", autouse=True)
def export_cache(request):
    """ONNX exports made on first use (the onnxruntime backend given a model name) go to pytest's cache
    directory: made once, reused by later runs while the exporters' code is unchanged (speechrt.export)."""
    import os

    before = os.environ.get("SPEECHRT_CACHE")
    os.environ["SPEECHRT_CACHE"] = str(request.config.cache.mkdir("speechrt-export"))
    yield os.environ["SPEECHRT_CACHE"]
    if before is None:
        os.environ.pop("SPEECHRT_CACHE", None)
    else:
        os.environ["SPEECHRT_CACHE"] = before


@pytest.fixture(scope="session")
def piper_voice():
    piper = pytest.importorskip("piper", reason="piper-tts (the 'peers' extra) synthesizes test speech")
    from speechrt.models.registry import resolve

    return piper.PiperVoice.load(str(resolve("piper-en_US-joe-medium", "tts").path))


@pytest.fixture(scope="session")
def synth(piper_voice):
    """text -> float32 mono audio at 16 kHz spoken by the Piper voice (cached per text).

    Piper's noise comes from a random op inside its ONNX graph that cannot be seeded, so the same text
    gave different audio on every run (and a test could pass here and fail in CI). With both noise
    scales at zero the speech is the same on every run and every machine."""
    from piper import SynthesisConfig

    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    cache = {}

    def speak(text: str, pad_s: float = 0.3) -> np.ndarray:
        if text not in cache:
            chunks = list(piper_voice.synthesize(text, syn_config=config))
            sr = chunks[0].sample_rate
            a = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
            pad = np.zeros(int(pad_s * sr), np.float32)
            cache[text] = resample(np.concatenate([pad, a, pad]), sr, 16000)
        return cache[text]

    return speak


@pytest.fixture(scope="session")
def asr():
    from speechrt.pipelines.asr import load_asr

    return load_asr(backend="torch")


@pytest.fixture(scope="module")
def one_cpu_thread():
    """Work called on the test's thread uses one intra-op thread: fast even when other processes share
    the CPU, where two-thread OpenMP regions stall (see backends.threads.cpu_threads)."""
    from speechrt.backends.threads import cpu_threads

    with cpu_threads(1):
        yield


@pytest.fixture
def no_model_loads(monkeypatch):
    """A tripwire for errors that must come before any model loads (a bad output path, a bad option): loading a
    model through a pipeline or starting an export fails the test."""
    import speechrt.export
    import speechrt.pipelines.asr
    import speechrt.pipelines.lm
    import speechrt.pipelines.tts

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    for module, name in (
        (speechrt.pipelines.asr, "load_asr"),
        (speechrt.pipelines.lm, "load_lm"),
        (speechrt.pipelines.tts, "load_tts"),
        (speechrt.export, "export_model"),
    ):
        monkeypatch.setattr(module, name, tripwire)
